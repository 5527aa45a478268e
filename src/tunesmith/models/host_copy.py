"""A model's weights copied from the GPU to the CPU for saving, through one pinned staging buffer.

safetensors (and so save_pretrained) copies each GPU tensor to ordinary, pageable CPU memory; on the H200
machine that runs at ~1.3 GB/s (5.2 s for the 6.9 GB of a 1.7B-parameter fp32 model). Through a pinned buffer
the transfer itself runs at the bus's speed and the rest is a CPU memcpy.
"""

from __future__ import annotations

import torch

STAGING_BYTES = 256 * 1024**2


def host_state_dict(state: dict) -> dict:
    """state with every CUDA tensor replaced by a CPU copy; tensors that share storage (tied weights) keep sharing."""
    if not any(isinstance(t, torch.Tensor) and t.is_cuda for t in state.values()):
        return state
    staging = torch.empty(STAGING_BYTES, dtype=torch.uint8, pin_memory=True)
    copies: dict[tuple, torch.Tensor] = {}
    out = {}
    for key, tensor in state.items():
        if not (isinstance(tensor, torch.Tensor) and tensor.is_cuda):
            out[key] = tensor
            continue
        ident = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape))
        if ident not in copies:
            copies[ident] = _copy_to_host(tensor.detach(), staging)
        out[key] = copies[ident]
    return out


def _copy_to_host(tensor: torch.Tensor, staging: torch.Tensor) -> torch.Tensor:
    host = torch.empty(tensor.shape, dtype=tensor.dtype)
    source = tensor.contiguous().reshape(-1).view(torch.uint8)
    target = host.reshape(-1).view(torch.uint8)
    for start in range(0, source.numel(), staging.numel()):
        part = source[start:start + staging.numel()]
        staging[:part.numel()].copy_(part)  # device to pinned host: synchronous, at the bus's speed
        target[start:start + part.numel()].copy_(staging[:part.numel()])
    return host
