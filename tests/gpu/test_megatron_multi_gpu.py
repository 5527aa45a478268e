"""Two GPUs (issue 19): the Megatron engine with TP=2, PP=2 and DP=2 against FSDP2 on the same two GPUs, same
Hugging Face initialisation and data, 20 optimiser steps of full SFT in bf16: every step's loss within 1% relative
(and context parallelism, CP=2, the same way);
for a Qwen3 text shape, for test_megatron_parity's Qwen3-VL shape (every part trained, mllm_demo), and for its
Qwen3-MoE shape with expert parallelism (EP=2) and with the experts data-parallel (DP=2).

The model and data are test_megatron_parity.py's (a random-initialised Qwen3 of the 1.7B shape cut to 4 layers,
alpaca_demo's 400 samples), unpacked here: packed, the demo fills about 13 rows of 1024 tokens, so every epoch
would end inside a step, where data-parallel ranks wrap around to the epoch's first rows (train/plan.rank_share)
and a single replica does not; unpacked, the 20 steps of 8 samples stay inside the first epoch and every layout
reads the same samples (the one-GPU parity test covers packing). Every run is torchrun with one process per GPU and
8 samples per optimiser step: FSDP2 and DP=2 two per rank and micro-batch, TP=2 and PP=2 (one model replica over
both GPUs) four. FSDP2 runs through tunesmith's own launcher; each Megatron run through train_and_check_export.py,
which trains as `tunesmith train` does, saves the final model and then checks that the saved folder, loaded in
plain transformers, gives the engine's logits on a micro-batch of the run's data (issue 19 item 3). Skipped with
fewer than 2 CUDA GPUs or without megatron-core. On a 2-GPU machine:

    source .device-wheels/activate.sh && python -m pytest -q -s tests/gpu/test_megatron_multi_gpu.py

MEGATRON_MULTI_GPU_OUT=<file.json> writes the per-step losses and timings there. MEGATRON_PARITY_DRY_RUN=1 runs the
same flow on two CPU processes with the tiny shape in fp32 (checks the test itself, not the GPUs).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from test_megatron_parity import (COMMON, DRY_RUN, REPO, STEPS, VL_COMMON, _init_model,  # noqa: E402
                                  _init_moe_model, _init_vl_model, _rows, _train)  # (skips without CUDA)

if not DRY_RUN and torch.cuda.device_count() < 2:
    pytest.skip("needs 2 CUDA GPUs", allow_module_level=True)

def _unpacked(common: list) -> list:
    return [c for c in common if not c.startswith(("per_device_train_batch_size=", "neat_packing="))] + ["packing=false"]


PER_RANK = _unpacked(COMMON)
VL_PER_RANK = _unpacked(VL_COMMON)  # mllm_demo's 40 samples: 5 steps of 8 an epoch, in every layout
EXTRA = ("max_steps=3", "bf16=false") if DRY_RUN else ()
LAYOUTS = {  # 8 samples per optimiser step in each
    "tp2": ("tensor_model_parallel_size=2", "per_device_train_batch_size=4"),
    "tp2_sp": ("tensor_model_parallel_size=2", "sequence_parallel=true", "per_device_train_batch_size=4"),
    "pp2": ("pipeline_model_parallel_size=2", "per_device_train_batch_size=4"),
    "dp2": ("per_device_train_batch_size=2",),
    "cp2": ("context_parallel_size=2", "per_device_train_batch_size=4"),  # each GPU two blocks of every row
}
# the interleaved schedule (dense language models): each GPU two chunks of one layer
TEXT_LAYOUTS = {**LAYOUTS, "pp2_vpp2": ("pipeline_model_parallel_size=2", "virtual_pipeline_model_parallel_size=2",
                                        "per_device_train_batch_size=4")}
MOE_LAYOUTS = {
    "ep2": ("expert_model_parallel_size=2", "per_device_train_batch_size=2"),
    # LLaMA-Factory's qwen3_moe_full.yaml dispatcher (megatron-core's all-to-all builds on CUDA only)
    "ep2_alltoall": ("expert_model_parallel_size=2", "moe_token_dispatcher_type=alltoall",
                     "per_device_train_batch_size=2"),
    "pp2": ("pipeline_model_parallel_size=2", "per_device_train_batch_size=4"),  # the router logits' relay
    "tp2_sp": ("tensor_model_parallel_size=2", "sequence_parallel=true", "per_device_train_batch_size=4"),
    "dp2": ("per_device_train_batch_size=2",),
    "cp2": ("context_parallel_size=2", "per_device_train_batch_size=4"),  # the router loss over both GPUs' tokens
}
if DRY_RUN:  # on the CPU: megatron-core's all-to-all dispatcher creates a CUDA stream when it is built
    del MOE_LAYOUTS["ep2_alltoall"]
REPORT: dict = {}
VL_REPORT: dict = {}
MOE_REPORT: dict = {}


def _two_processes(port: int) -> dict:
    # NVLink multicast stays off on the shared machines (their KINDS.md); the dry run's CPU processes get the
    # shim that lets megatron-core's expert-parallel collectives allocate there
    shim = {"PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "megatron_cpu_comms"),
                                           os.environ.get("PYTHONPATH", "")])} if DRY_RUN else {}
    return {"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2", "MASTER_PORT": str(port), "NCCL_NVLS_ENABLE": "0",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", **shim}


def _fsdp2_reference(tmp_path_factory, name: str, init, common: list, port: int, report: dict):
    """The model folder `init` builds and FSDP2's losses on it, recorded in `report`."""
    folder = tmp_path_factory.mktemp(f"megatron_multi_gpu_{name}")
    model = init(folder / name)
    losses, seconds = _train(model, folder / "fsdp2", "backend=fsdp2", "per_device_train_batch_size=2", *EXTRA,
                             env=_two_processes(port), common=common)
    report["fsdp2"] = {"losses": losses, "seconds": seconds}
    return model, folder, losses


def _train_and_check_export(model: Path, out: Path, *extra, port: int, common: list) -> tuple[list, float, dict]:
    """The Megatron run on two processes through train_and_check_export.py (training as `tunesmith train` does, the
    final model saved, then its logits in plain transformers against the engine's): losses, seconds, the check."""
    started = time.perf_counter()
    check = out.parent / f"{out.name}_export_check.json"
    env = {k: v for k, v in _two_processes(port).items() if k not in ("FORCE_TORCHRUN", "NPROC_PER_NODE")}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(port), str(REPO / "tests" / "gpu" / "train_and_check_export.py"), str(check),
                           f"model_name_or_path={model}", *common, f"output_dir={out}", *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=400, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [r["loss"] for r in _rows(out) if "loss" in r], time.perf_counter() - started, json.loads(check.read_text())


def _megatron_matches(reference, layout: str, common: list, port: int, report: dict, out_env: str, label: str,
                      layouts: dict = LAYOUTS):
    """The Megatron engine in `layout` (of `layouts`) from FSDP2's folder: every step's loss within 1% relative of
    FSDP2's, and the saved folder's logits in transformers those of the engine's model (fp32 on both sides); the
    report to stdout and to the file `out_env` names."""
    model, folder, expected = reference
    losses, seconds, export = _train_and_check_export(model, folder / layout, "backend=megatron", *layouts[layout],
                                                      *EXTRA, port=port + sorted(layouts).index(layout),
                                                      common=common)
    rel = [abs(a - b) / abs(b) for a, b in zip(losses, expected)]
    report[layout] = {"losses": losses, "seconds": seconds, "rel_diff": rel, "max_rel_diff": max(rel),
                      "export_check": export,
                      "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                      "torch": torch.__version__}
    print(json.dumps({f"{label} {layout}": report[layout]}))
    if os.environ.get(out_env):
        with open(os.environ[out_env], "w") as f:
            json.dump({"steps": STEPS, **report}, f, indent=1)
    assert len(losses) == len(expected) == (3 if DRY_RUN else STEPS)
    assert max(rel) < 0.01, rel
    assert export["positions"] > 0 and export["max_abs_diff"] <= 1e-3 * max(1.0, export["max_abs_logit"]), export


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory):
    """The Qwen3 text folder and FSDP2's losses, once for every layout."""
    return _fsdp2_reference(tmp_path_factory, "qwen3_4l", _init_model, PER_RANK, 29611, REPORT)


@pytest.mark.parametrize("layout", sorted(TEXT_LAYOUTS))
def test_megatron_on_two_gpus_matches_fsdp2_for_20_steps(fsdp2, layout):
    _megatron_matches(fsdp2, layout, PER_RANK, 29612, REPORT, "MEGATRON_MULTI_GPU_OUT", "qwen3", TEXT_LAYOUTS)


@pytest.fixture(scope="module")
def fsdp2_vl(tmp_path_factory):
    """The Qwen3-VL folder (test_megatron_parity's shape, every part trained) and FSDP2's losses, once."""
    return _fsdp2_reference(tmp_path_factory, "qwen3_vl", _init_vl_model, VL_PER_RANK, 29621, VL_REPORT)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_megatron_qwen3_vl_on_two_gpus_matches_fsdp2_for_20_steps(fsdp2_vl, layout):
    """Qwen3-VL: the vision tower on the first pipeline stage (its deepstack layers too) or whole on both
    tensor-parallel ranks; MEGATRON_MULTI_GPU_VL_OUT=<file.json> writes the report."""
    _megatron_matches(fsdp2_vl, layout, VL_PER_RANK, 29622, VL_REPORT, "MEGATRON_MULTI_GPU_VL_OUT", "qwen3_vl")


@pytest.fixture(scope="module")
def fsdp2_moe(tmp_path_factory):
    """test_megatron_parity's Qwen3-MoE folder (4 layers, 32 experts, top-8) and FSDP2's losses, once."""
    return _fsdp2_reference(tmp_path_factory, "qwen3_moe", _init_moe_model, PER_RANK, 29631, MOE_REPORT)


@pytest.mark.parametrize("layout", sorted(MOE_LAYOUTS))
def test_megatron_qwen3_moe_on_two_gpus_matches_fsdp2_for_20_steps(fsdp2_moe, layout):
    """Qwen3-MoE: half of the experts on each GPU (EP=2, megatron-core's all-gather dispatcher), or every expert on
    both (DP=2); MEGATRON_MULTI_GPU_MOE_OUT=<file.json> writes the report."""
    _megatron_matches(fsdp2_moe, layout, PER_RANK, 29632, MOE_REPORT, "MEGATRON_MULTI_GPU_MOE_OUT", "qwen3_moe",
                      MOE_LAYOUTS)
