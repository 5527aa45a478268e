#!/usr/bin/env bash
# Carry FlashAttention 4 (flash-attn-4, the CuTe-DSL kernels with Hopper forward and backward) to the GPU machine,
# as benchmarks/vllm_bundle.sh carries vLLM: the packed site is ~65 MiB, more than one device call carries.
#
#   bash benchmarks/fa4_bundle.sh pack        # here: .fa4/p00, p01 (git-ignored)
#   bash benchmarks/fa4_bundle.sh stash       # there, in each call that carries a part: keep it in /tmp/fa4-parts
#   source benchmarks/fa4_bundle.sh install   # there, the last call: unpack to /tmp/fa4-site, put it on PYTHONPATH
#
# CUDA 13 build of the CuTe DSL (the GPU machine's torch is cu130). Kernels compile at their first call; the
# persistent cache (FLASH_ATTENTION_CUTE_DSL_CACHE_*) keeps them for the next process.
[[ "${BASH_SOURCE[0]}" == "$0" ]] && set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bundle_parts.sh"
PACKAGES=(flash-attn-4==4.0.0b40 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
          nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 "cuda-bindings>=13,<14"
          cuda-pathfinder "apache-tvm-ffi>=0.1.11,<0.2" torch-c-dlpack-ext quack-kernels)

fa4_pack() {
  local work=.fa4/build
  rm -rf "$work" && mkdir -p "$work/dl" "$work/site"
  for p in "${PACKAGES[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform any -d "$work/dl" "$p"
  done
  for wheel in "$work"/dl/*.whl; do python3 -m zipfile -e "$wheel" "$work/site"; done
  parts_split "$work/site" fa4 9
  rm -rf "$work"
}

fa4_install() {
  parts_install fa4 || return 2
  # the DSL's own packages are found through a .pth file, which PYTHONPATH does not read
  export PYTHONPATH="/tmp/fa4-site:/tmp/fa4-site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
  export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
}

case "${1:-}" in
  pack) fa4_pack ;;
  stash) parts_stash fa4 ;;
  install) fa4_install ;;
  *) echo "usage: bash benchmarks/fa4_bundle.sh pack | stash ; source benchmarks/fa4_bundle.sh install" >&2 ;;
esac
