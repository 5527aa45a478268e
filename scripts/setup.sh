#!/usr/bin/env bash
# Install tunesmith (editable, with the dev extras) into the current python3. Idempotent:
# does nothing when tunesmith and its core dependencies already import and the
# installed tunesmith is this checkout. Never creates a virtual environment.
#
#   bash scripts/setup.sh            # uses python3 on PATH
#   PYTHON=/path/to/python bash scripts/setup.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "setup.sh: '$PYTHON' not found; install Python >= 3.11" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    echo "setup.sh: tunesmith needs Python >= 3.11, '$PYTHON' is $("$PYTHON" -V 2>&1)" >&2
    exit 1
fi

# The editable install of this checkout, as pip reports it ("" when tunesmith is
# not installed, or installed from somewhere else).
installed_location() {
    "$PYTHON" -m pip show tunesmith 2>/dev/null \
        | sed -n 's/^Editable project location: //p' \
        | head -n 1 || true
}

is_installed_here() {
    # the test-only dev extras too (a machine that installed tunesmith before they were added gets them)
    "$PYTHON" -c "import tunesmith, torch, transformers, peft, datasets, fastapi, uvicorn, openai, xdist, num2words, timm, adam_mini, galore_torch, apollo_torch" >/dev/null 2>&1 || return 1
    local where
    where="$(installed_location)"
    [ -n "$where" ] && [ -d "$where" ] && [ "$(cd "$where" && pwd -P)" = "$ROOT" ]
}

if is_installed_here; then
    echo "setup.sh: tunesmith is already installed from $ROOT for $("$PYTHON" -V 2>&1); nothing to do"
    exit 0
fi

# A distribution's own Python (PEP 668, "externally managed") refuses pip installs
# outside a virtual environment; CI uses that Python on purpose, so allow it there.
if "$PYTHON" - <<'PY'
import os, sys, sysconfig
in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
sys.exit(0 if (not in_venv and os.path.exists(marker)) else 1)
PY
then
    export PIP_BREAK_SYSTEM_PACKAGES=1
fi

if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
    "$PYTHON" -m ensurepip --upgrade >/dev/null 2>&1 || {
        echo "setup.sh: '$PYTHON' has no pip; install it (e.g. apt-get install python3-pip) and rerun" >&2
        exit 1
    }
fi

echo "setup.sh: installing tunesmith from $ROOT into $("$PYTHON" -V 2>&1) ($(command -v "$PYTHON"))"
"$PYTHON" -m pip install -e ".[dev]"

if ! is_installed_here; then
    echo "setup.sh: the install finished but tunesmith still does not import from $ROOT" >&2
    exit 1
fi
echo "setup.sh: done"
