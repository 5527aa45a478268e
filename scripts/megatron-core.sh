#!/usr/bin/env bash
# Install megatron-core 0.19.2 (the version tunesmith's Megatron engine is tested with; pyproject's
# `megatron` extra) for the CPU tests. Idempotent. Python >= 3.12: pip installs the wheel. Python 3.11
# (the CI machine): megatron-core ships cp312 wheels only, but its Python code runs on 3.11, so the
# same wheel is unpacked into site-packages (its one compiled module, the dataset helpers, is unused).
# A failure only warns: the Megatron tests then skip.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
VERSION=0.19.2
have() { "$PYTHON" -c "import importlib.metadata as m, sys; sys.exit(m.version('megatron-core') != '$VERSION')" 2>/dev/null; }
if have; then
    echo "megatron-core.sh: megatron-core $VERSION is installed; nothing to do"
    exit 0
fi
if "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)'; then
    "$PYTHON" -m pip install -q "megatron-core==$VERSION" || echo "megatron-core.sh: install failed; the Megatron tests will skip" >&2
    exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d "$tmp" "megatron-core==$VERSION"; then
    site="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$PYTHON" -m zipfile -e "$tmp"/megatron_core-*.whl "$site"
    have && echo "megatron-core.sh: megatron-core $VERSION unpacked into $site (Python 3.11)"
else
    echo "megatron-core.sh: could not download megatron-core $VERSION; the Megatron tests will skip" >&2
fi
