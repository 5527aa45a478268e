"""Shared fixtures. The tiny models are built once per test session into a temp cache."""

import socket
from pathlib import Path

import pytest

from tunesmith.models.tiny import build_tiny


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tunesmith_cache")


@pytest.fixture(scope="session")
def tiny_qwen3(tiny_cache) -> Path:
    return build_tiny("qwen3", tiny_cache)


@pytest.fixture(scope="session")
def tiny_llama(tiny_cache) -> Path:
    return build_tiny("llama", tiny_cache)


REPO = Path(__file__).resolve().parents[1]
DATA_DIR = REPO / "data"


def run_interpreted(script: str, timeout: int = 600) -> None:
    """Run `script` in a new Python with TRITON_INTERPRET=1 (set before Triton is imported): Triton kernels on the
    CPU. It must print "ok" last."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (done.stdout + done.stderr)[-6000:]


def load_script(name: str):
    """scripts/<name>.py as a module (the demo-data generators are scripts, not package modules)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tiny_cache):
    """Runs never touch ~/.cache: tiny models and tokenized data go to the session temp dir."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TUNESMITH_CACHE", str(tiny_cache))
    mp.setenv("TUNESMITH_CHECKPOINT_KEY_FILE", str(tiny_cache / "checkpoint.key"))  # not the user's own key
    mp.setenv("HF_HUB_OFFLINE", "1")
    yield
    mp.undo()


def run_config(output_dir, **overrides):
    """A RunConfig for a short CPU run on the shipped demo data."""
    from tunesmith.config.load import build_config

    base = {
        "model_name_or_path": "tiny:qwen3",
        "dataset": "alpaca_demo",
        "dataset_dir": str(DATA_DIR),
        "template": "chatml",
        "cutoff_len": 128,
        "max_samples": 64,
        "finetuning_type": "full",
        "learning_rate": 1e-3,
        "max_steps": 4,
        "logging_steps": 1,
        "save_strategy": "no",
        "output_dir": str(output_dir),
    }
    base.update(overrides)
    return build_config(None, base)


@pytest.fixture(scope="module")
def world_of_one():
    """A megatron-core world of one process (gloo, its own TCP store) for the Megatron engine's CPU tests."""
    pytest.importorskip("megatron.core")
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    from tunesmith.config.schema import MegatronConfig
    from tunesmith.engines.megatron.runtime import init_model_parallel, require_megatron

    require_megatron()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # a TCP store of its own, no MASTER_* left in the environment (later CLI runs would inherit the port)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    init_model_parallel(MegatronConfig(), seed=0, device=torch.device("cpu"))
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def per_sample_losses(model, rows: list, pad_id: int, media=None):
    """Each sample's mean token loss when `rows` (each a list of samples) are collated as one batch: the packing
    tests compare these for the same samples packed and unpacked."""
    import torch

    from tunesmith.data.collate import collate_rows
    from tunesmith.methods.losses import per_segment_mean, token_nll
    from tunesmith.models.forward import run_forward

    batch = collate_rows(rows, pad_id, media=media)
    with torch.no_grad():
        nll = token_nll(run_forward(model, batch, "logits").logits_BTV, batch.targets_BT)
    return per_segment_mean(nll, batch.targets_BT, batch.segment_ids_BT)


def assert_packed_equals_unpacked(model, rows: list, pad_id: int, media=None) -> None:
    """The samples packed into two rows get the per-sample losses they get one per row."""
    import torch

    half = len(rows) // 2
    unpacked = per_sample_losses(model, [[r] for r in rows], pad_id, media)
    packed = per_sample_losses(model, [rows[:half], rows[half:]], pad_id, media)
    torch.testing.assert_close(packed, unpacked, rtol=1e-4, atol=1e-4)


def tensors_of(value) -> list:
    """Every tensor inside a model output (ModelOutput, dict, tuple or list), in order."""
    import torch

    if torch.is_tensor(value):
        return [value]
    if isinstance(value, dict) or hasattr(value, "values"):
        return [t for v in value.values() for t in tensors_of(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []
