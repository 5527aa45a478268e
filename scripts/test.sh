#!/usr/bin/env bash
# Install tunesmith (if needed) and run the whole test suite on CPU, offline.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`.
# The test files are spread over one worker per CPU core, at most 4 (pytest-xdist, whole files per
# worker); TUNESMITH_TEST_WORKERS=N picks another number, 0 runs them in this one process.
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
workers="${TUNESMITH_TEST_WORKERS:-auto}"
parallel=(-n "$workers" --dist loadfile)
[ "$workers" = auto ] && parallel+=(--maxprocesses 4)
[ "$workers" = 0 ] && parallel=()
"$PYTHON" -m pytest -q "${parallel[@]}" tests "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests; treating that as a failure" >&2
fi
exit "$status"
