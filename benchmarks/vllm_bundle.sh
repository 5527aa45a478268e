#!/usr/bin/env bash
# Carry vLLM to the GPU machine (no internet there; 64 MiB per device call), as ENVIRONMENT.md describes:
#
#   bash benchmarks/vllm_bundle.sh pack       # here: .vllm/p00, p01, ... (40 MiB each, git-ignored)
#   bash benchmarks/vllm_bundle.sh stash      # there, in each call that carries a part: keep it in /tmp/vllm-parts
#   source benchmarks/vllm_bundle.sh install  # there, last call: unpack to /tmp/vllm-site, put it on PYTHONPATH
#
# The bundle is vLLM 0.25.1 (torch 2.11 pin, as on the GPU machine) without what a Hopper GPU does not load
# (the FA2 kernel, the Rust frontend, Blackwell attention, DeepGEMM) and the small pure / manylinux cp312
# dependencies it imports for offline generation. Left out (large, and off the path of LLM.generate on a dense
# model): flashinfer (so VLLM_USE_FLASHINFER_SAMPLER=0), numba, cutlass-dsl, tilelang, torchcodec.
# `install` drops each bundled package the machine already has, so its own versions stay in use.
[[ "${BASH_SOURCE[0]}" == "$0" ]] && set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bundle_parts.sh"
VLLM_VERSION=0.25.1
DEPS=(cachetools sentencepiece blake3 py-cpuinfo "fastapi>=0.133,<0.137" "starlette>=1.0.1" annotated-doc anyio
      sniffio aiohttp multidict yarl propcache aiohappyeyeballs aiosignal frozenlist attrs "openai>=2,<3" jiter distro
      httpx httpcore h11 idna certifi prometheus_client prometheus-fastapi-instrumentator tiktoken
      lm-format-enforcer==0.11.3 interegular "llguidance>=1.7,<1.8" outlines_core==0.2.14 diskcache==5.6.3
      lark==1.2.2 xgrammar==0.2.5.post1 apache-tvm-ffi==0.1.9 partial-json-parser jsonschema
      jsonschema-specifications referencing rpds-py pyzmq msgspec compressed-tensors==0.17.0 depyf==0.20.0 astor
      cloudpickle watchfiles python-json-logger pybase64 cbor2 ijson setproctitle openai-harmony nvtx==0.2.15
      uvloop "protobuf>=5.29.6,!=6.30.*,!=6.31.*,!=6.32.*,!=6.33.0.*,!=6.33.1.*,!=6.33.2.*,!=6.33.3.*,!=6.33.4.*"
      gguf)

platforms() {
  for v in 5 17 24 26 27 28 31 34 35; do echo "--platform manylinux_2_${v}_x86_64"; done
  echo "--platform manylinux2014_x86_64 --platform any"
}

vllm_pack() {
  local work=.vllm/build
  rm -rf "$work" && mkdir -p "$work/dl" "$work/site"
  local pip=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
             $(platforms) -d "$work/dl")
  "${pip[@]}" "vllm==$VLLM_VERSION"
  for dep in "${DEPS[@]}"; do "${pip[@]}" "$dep"; done
  python3 - "$work" <<'PY'
import pathlib, sys, zipfile
work = pathlib.Path(sys.argv[1])
skip = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs", "vllm/third_party/fmha_sm100/",
        "vllm/third_party/deep_gemm/", "xgrammar/lib/")  # unused on Hopper / a static library
for wheel in sorted((work / "dl").glob("*.whl")):
    with zipfile.ZipFile(wheel) as z:
        z.extractall(work / "site", [n for n in z.namelist() if not n.startswith(skip)])
PY
  parts_split "$work/site" vllm 6
  rm -rf "$work"
}

vllm_install() {
  parts_install vllm vllm_prune || return 2
  export PYTHONPATH="/tmp/vllm-site${PYTHONPATH:+:$PYTHONPATH}" VLLM_USE_FLASHINFER_SAMPLER=0
}

vllm_prune() {  # the machine's own packages stay: drop each bundled top-level package it already has
  python3 - <<'PY'
import importlib.util, pathlib, shutil
site = pathlib.Path("/tmp/vllm-site")
for info in site.glob("*.dist-info"):
    tops = {line.split("/")[0].split(",")[0] for line in (info / "RECORD").read_text().splitlines()}
    tops = {t for t in tops if t and not t.endswith((".dist-info", ".data")) and t != "bin"}
    modules = {t.removesuffix(".py") for t in tops if "." not in t.removesuffix(".py")}
    if "vllm" in modules or not any(importlib.util.find_spec(m) for m in modules if not m.startswith("_")):
        continue
    for top in tops | {info.name}:
        path = site / top
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    print("vllm_bundle: the machine has", info.name.split("-")[0], "- its own copy stays in use")
PY
}

case "${1:-}" in
  pack) vllm_pack ;;
  stash) parts_stash vllm ;;
  install) vllm_install ;;
  *) echo "usage: bash benchmarks/vllm_bundle.sh pack | stash ; source benchmarks/vllm_bundle.sh install" >&2 ;;
esac
