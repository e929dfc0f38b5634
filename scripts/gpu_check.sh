#!/usr/bin/env bash
# The prepared device check: one command, about 8 minutes on one H100 or H200, one JSON report.
#   1. Qwen3-0.6B (the model the targets name): every section (generation candidates against the
#      memory floor, GRPO vs TRL, FSDP2 and its checkpoint, the 16k-token pack) and the vision
#      section, sections skipped once 300 s are spent;
#   2. Llama-3.2-1B and Qwen2.5-0.5B: generation, GRPO vs TRL and the pack, in what is left of 480 s.
# The two reports are merged into OUT (default gpu-report.json); each is kept beside it.
#
# Usage: scripts/gpu_check.sh [OUT] [flags for both runs]
#   e.g. scripts/gpu_check.sh report.json --device cuda:1
#        scripts/gpu_check.sh report.json --quick --models tiny   (the paths on a CPU, in minutes)
set -euo pipefail
OUT=${1:-gpu-report.json}
shift || true
PY=${PYTHON:-python}
BUDGET=480
start=$(date +%s)

"$PY" -m rollforge bench gpu --models qwen3-0.6b --budget-s 300 --out "$OUT.first.json" "$@"
left=$((BUDGET - ($(date +%s) - start)))
[ "$left" -lt 60 ] && left=60  # the second run still builds its models and reports what it skips
"$PY" -m rollforge bench gpu --models llama-3.2-1b,qwen2.5-0.5b --sections generation,grpo,trl,train_throughput \
  --budget-s "$left" --out "$OUT.second.json" "$@"

"$PY" - "$OUT" "$start" <<'EOF'
import json
import sys
import time

out, start = sys.argv[1], int(sys.argv[2])
first = json.load(open(f"{out}.first.json"))
second = json.load(open(f"{out}.second.json"))
for name, entry in second["models"].items():
    first["models"].setdefault(name, entry)
first["seconds"] = round(time.time() - start, 1)
first["runs"] = {"first": f"{out}.first.json", "second": f"{out}.second.json"}
with open(out, "w") as f:
    json.dump(first, f, indent=2)
    f.write("\n")
print(f"gpu_check.sh: {out} ({len(first['models'])} models, {first['seconds']} s)")
EOF
