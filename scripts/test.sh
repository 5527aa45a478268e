#!/usr/bin/env bash
# Install tunesmith (if needed) and run the whole test suite on CPU, offline.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`.
# The exit status is pytest's; "no tests collected" (5) counts as a failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
export PYTHON
export HF_HUB_OFFLINE=1

bash scripts/setup.sh
bash scripts/megatron-core.sh  # the Megatron engine's tests (2.4 MB; they skip without it)

status=0
"$PYTHON" -m pytest -q tests "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests; treating that as a failure" >&2
fi
exit "$status"
