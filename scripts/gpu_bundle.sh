#!/usr/bin/env bash
# Pack what `rollforge bench gpu` needs on an air-gapped GPU box (PyTorch with CUDA, transformers and
# accelerate preinstalled; no network, no vLLM) into one tarball of at most 64 MiB:
#   wheels/  rollforge's wheel (with the model configs), TRL's, and the pure-Python and small binary
#            wheels of their dependencies, pinned to the versions installed here (what the tests ran
#            on), for the GPU box's Python; pip installs from them only what the box lacks;
#   tests/   the bench's tests, for `pytest -m gpu` there;
#   gpu_check.sh  the prepared device check (scripts/gpu_check.sh);
#   RUN.txt  the two commands to run there.
# Left out: torch and the CUDA stack, numpy, and pyarrow/pandas (datasets, hence TRL, needs them: 67
# MiB of wheels; most GPU images carry both; without them only the report's `trl` section fails).
#
# Usage: scripts/gpu_bundle.sh [OUT_DIR]      (default dist/rollforge-gpu-bundle)
#   PYTHON_VERSION=3.12 scripts/gpu_bundle.sh  the GPU box's Python (default: this interpreter's)
#   PLATFORM=manylinux_2_28_aarch64 ...         its platform (default x86_64 manylinux)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-dist/rollforge-gpu-bundle}
PY=${PYTHON:-python}
PYV=${PYTHON_VERSION:-$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}
PLATFORM=${PLATFORM:-x86_64}
LIMIT=$((64 * 1024 * 1024))
export PIP_DISABLE_PIP_VERSION_CHECK=1

rm -rf "$OUT" "$OUT.tar.gz"
mkdir -p "$OUT/wheels"
"$PY" -m pip wheel --quiet --no-deps --no-build-isolation -w "$OUT/wheels" .

# The requirement closure of rollforge, TRL (with datasets) and pytest, as installed here.
PINS=$("$PY" - <<'EOF'
import importlib.metadata as md
import re

from packaging.requirements import Requirement

on_the_image = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*|numpy|sympy|mpmath|networkx|jinja2|markupsafe|setuptools|pyarrow|pandas)$")
todo, pins = ["rollforge", "trl", "datasets", "pytest"], {}
while todo:
    name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
    if name in pins or on_the_image.match(name):
        continue
    dist = md.distribution(name)
    pins[name] = dist.version
    todo += [r.name for r in map(Requirement, dist.requires or []) if not r.marker or r.marker.evaluate({"extra": ""})]
del pins["rollforge"]  # built above
print(" ".join(f"{name}=={version}" for name, version in sorted(pins.items())))
EOF
)
if [ "$PLATFORM" = x86_64 ]; then
  PLATFORMS=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
else
  PLATFORMS=(--platform "$PLATFORM")
fi
# shellcheck disable=SC2086  # PINS is a list of words
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYV" "${PLATFORMS[@]}" \
  -d "$OUT/wheels" $PINS

mkdir -p "$OUT/tests"
cp tests/bench/test_gpu_bench.py tests/bench/test_gpu_generation.py "$OUT/tests/"
cp scripts/gpu_check.sh "$OUT/"

cat > "$OUT/RUN.txt" <<EOF
On the GPU box (Python $PYV), from the directory holding $(basename "$OUT").tar.gz:

  tar xzf $(basename "$OUT").tar.gz && pip install --no-index --find-links $(basename "$OUT")/wheels rollforge trl datasets pytest
  bash $(basename "$OUT")/gpu_check.sh report.json

The second command is the prepared device check (about 8 minutes): every section and generation
candidate on Qwen3-0.6B, then Llama-3.2-1B and Qwen2.5-0.5B in what is left, one report.json.
\`rollforge bench gpu --out report.json\` runs every section on all three (about 25 minutes);
\`rollforge bench gpu --quick\` checks the paths in a minute. The GPU tests: pytest -m gpu $(basename "$OUT")/tests
EOF
tar -czf "$OUT.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
SIZE=$(stat -c %s "$OUT.tar.gz")
echo "$OUT.tar.gz: $((SIZE / 1024 / 1024)) MiB, $(ls "$OUT/wheels" | wc -l) wheels (Python $PYV)"
if [ "$SIZE" -gt "$LIMIT" ]; then
  echo "gpu_bundle.sh: $OUT.tar.gz is $SIZE bytes, over the 64 MiB upload limit" >&2
  exit 1
fi
