"""The rollout backends by their config name (`rollout_backend`), and the one function that builds one."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import TunesmithError
from .engine import RolloutEngine


def _hf(model, media, world_size, vllm_args):
    from .hf import HFRollout

    return HFRollout(model)


def _hf_paged(model, media, world_size, vllm_args):
    from .hf_paged import HFPagedRollout, check_paged_supported

    check_paged_supported(media=media, world_size=world_size)
    return HFPagedRollout(model)


def _vllm(model, media, world_size, vllm_args):
    import importlib.util

    import torch

    from .vllm import VllmRollout, check_vllm_rollout

    device = next(model.parameters()).device.type if torch.cuda.is_available() else "cpu"
    check_vllm_rollout(installed=importlib.util.find_spec("vllm") is not None, device_type=device, media=media)
    if world_size > 1:
        raise TunesmithError("rollout_backend: vllm is colocated with one training process; with several, use "
                             "rollout_backend: hf")
    return VllmRollout(**vllm_args())


ROLLOUT_BACKENDS: dict[str, Callable] = {"hf": _hf, "hf_paged": _hf_paged, "vllm": _vllm}


def build_rollout(name: str, model, *, media: bool, world_size: int,
                  vllm_args: Callable[[], dict]) -> RolloutEngine:
    """`name` as resolved by config (auto is decided there); `vllm_args()` is called only for vllm."""
    if name not in ROLLOUT_BACKENDS:
        raise TunesmithError(f"rollout_backend: {name!r} is not one of {', '.join(ROLLOUT_BACKENDS)} (or auto, "
                             "which config resolution turns into one of them)")
    return ROLLOUT_BACKENDS[name](model, media, world_size, vllm_args)
