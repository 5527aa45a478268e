"""Test-only: on a machine without CUDA, megatron-core's collective helpers allocate on the CPU.

megatron-core allocates the outputs of its all-gathers and reduce-scatters (the MoE token dispatchers',
sequence parallelism's) with `device=torch.cuda.current_device()`. Put on PYTHONPATH of the processes a
CPU test launches (tests/e2e/test_megatron_cli.py's expert- and sequence-parallel tests), this makes that the
CPU, so that megatron-core's own communication code runs over gloo; and makes its CUDA RNG tracker's fork
(sequence parallelism's dropout streams: the engine trains without dropout there) a no-op. Nothing in tunesmith
imports it.
"""

import contextlib

import torch

if not torch.cuda.is_available():
    torch.cuda.current_device = lambda: torch.device("cpu")
    try:
        from megatron.core.tensor_parallel import random as _megatron_random
    except ImportError:  # the processes of a run without megatron-core
        pass
    else:
        _megatron_random.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
