"""megatron-core's process state: the import guard, Transformer Engine detection, model-parallel groups."""

from __future__ import annotations

import importlib.util
import logging
import warnings

import torch

from ...errors import TunesmithError

log = logging.getLogger("tunesmith")

INSTALL = "pip install 'tunesmith[megatron]' (megatron-core 0.19.2, Python 3.12+; see docs/megatron.md)"


def require_megatron() -> None:
    """Import megatron-core once, quietly (it warns once per module that Apex / Transformer Engine are missing:
    the engine says that itself, in one line)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import megatron.core  # noqa: F401
            import megatron.core.models.gpt  # noqa: F401
    except ImportError as err:
        raise TunesmithError(f"backend: megatron needs megatron-core ({err}); {INSTALL}") from None


def has_transformer_engine() -> bool:
    try:
        return importlib.util.find_spec("transformer_engine") is not None
    except (ImportError, ValueError):
        return False


def collectives_can_allocate() -> bool:
    """Whether megatron-core's collective helpers can allocate their outputs: they do so on
    torch.cuda.current_device(), so on a CUDA machine (and on the CPU only under the tests' shim,
    tests/megatron_cpu_comms)."""
    try:
        torch.empty(0, device=torch.cuda.current_device())
    except (RuntimeError, AssertionError):
        return False
    return True


def init_model_parallel(m, seed: int, device: torch.device) -> None:
    """megatron-core's parallel groups for the degrees of `m` (torch.distributed is already initialised:
    engines.needs_process_group), and its tensor-parallel RNG streams on CUDA. A mixture-of-experts model's
    experts are whole on each tensor-parallel rank (expert tensor parallelism 1: build._moe_kwargs)."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=m.tensor_model_parallel_size,
            pipeline_model_parallel_size=m.pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size=m.virtual_pipeline_model_parallel_size,
            context_parallel_size=m.context_parallel_size,
            expert_model_parallel_size=m.expert_model_parallel_size,
            expert_tensor_parallel_size=1,
        )
    if device.type == "cuda":
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(seed)
