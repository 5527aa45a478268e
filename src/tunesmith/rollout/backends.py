"""The rollout backends by their config name (`rollout_backend`), and the one function that builds one."""

from __future__ import annotations

from collections.abc import Callable

from .. import dist
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
    from ..models.families import family_of
    from .vllm import (VllmRollout, check_head_size, check_vllm_images, check_vllm_rollout, engine_args,
                       kv_cache_bytes, vllm_device)

    param = next(model.parameters())
    check_vllm_rollout(installed=vllm_device(), device_type=param.device.type)
    if media:
        check_vllm_images(family_of(model.config))
    check_head_size(model.config, param.device.type)
    args = dict(vllm_args())
    fp32_logits = args.pop("fp32_logits", False)
    kv = kv_cache_bytes(model.config, num_seqs=args.pop("num_seqs"), max_model_len=args["max_model_len"],
                        dtype=param.dtype)
    engine = engine_args(**args, device_type=param.device.type, kv_bytes=kv, world_size=world_size, rank=dist.rank())
    return VllmRollout(engine, param.device.type,
                       image_token_id=getattr(model.config, "image_token_id", None), fp32_logits=fp32_logits)


ROLLOUT_BACKENDS: dict[str, Callable] = {"hf": _hf, "hf_paged": _hf_paged, "vllm": _vllm}


def build_rollout(name: str, model, *, media: bool, world_size: int,
                  vllm_args: Callable[[], dict]) -> RolloutEngine:
    """`name` as resolved by config (auto is decided there); `vllm_args()` is called only for vllm."""
    if name not in ROLLOUT_BACKENDS:
        raise TunesmithError(f"rollout_backend: {name!r} is not one of {', '.join(ROLLOUT_BACKENDS)} (or auto, "
                             "which config resolution turns into one of them)")
    return ROLLOUT_BACKENDS[name](model, media, world_size, vllm_args)
