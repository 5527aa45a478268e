"""PyTorch's expandable CUDA segments for the training stages.

With a forward pass whose width changes step to step (packed rows run unpadded, train/plan.py), PyTorch's caching
allocator keeps fixed-size segments cut to every width it has seen. Segments that grow in place instead
(`expandable_segments`) held issue 15's unpadded run at 43.7 GiB against 61.6 GiB (54.3 GiB for rows of
cutoff_len), and it trained 2.4% faster than rows of cutoff_len, three runs each on one H100
(benchmarks/results/2026-12-06-unpadded-rows-h100.md; measured with the setting in PYTORCH_CUDA_ALLOC_CONF from
the process's start).

Switched on at set-up, before the model's memory is allocated, for the stages without a rollout engine: vLLM's
sleep mode keeps its weights in a memory pool that expandable segments cannot serve. A PYTORCH_CUDA_ALLOC_CONF
the user set is left as it is.
"""

from __future__ import annotations

import logging
import os

import torch

log = logging.getLogger(__name__)


def use_expandable_segments(device: torch.device) -> bool:
    """Turn expandable segments on for the allocations to come on `device` (CUDA), unless the user configured the
    allocator. Returns whether it was switched on."""
    if device.type != "cuda" or os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):
        return False
    try:
        setting = (getattr(torch._C, "_accelerator_setAllocatorSettings", None)
                   or torch.cuda.memory._set_allocator_settings)
        setting("expandable_segments:True")
    except (RuntimeError, AttributeError) as err:  # an allocator that does not take it keeps its own segments
        log.debug("expandable CUDA segments not available: %s", err)
        return False
    return True
