#!/usr/bin/env bash
# Install tunesmith, train the tiny Qwen3-architecture model on the identity demo
# (CPU is enough, about a minute), then ask the trained model "Who are you?".
#
#   bash scripts/quickstart.sh
#   PYTHON=/path/to/python bash scripts/quickstart.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
export PYTHON
# The tiny model and its tokenizer are built locally: no hub access is needed.
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"

bash scripts/setup.sh

# `python -m tunesmith.cli` is the `tunesmith` command of that same interpreter,
# whether or not its scripts folder is on PATH.
tunesmith() { "$PYTHON" -m tunesmith.cli "$@"; }

echo
# Re-running the quickstart replaces its own earlier run (and only that one): the flag is given here, on purpose.
echo "==> tunesmith train examples/quickstart.yaml overwrite_output_dir=true"
tunesmith train examples/quickstart.yaml overwrite_output_dir=true

echo
echo "==> tunesmith chat --model saves/quickstart --prompt \"Who are you?\""
answer="$(tunesmith chat --model saves/quickstart --prompt "Who are you?")"
echo "Answer of saves/quickstart to \"Who are you?\":"
echo "$answer"
