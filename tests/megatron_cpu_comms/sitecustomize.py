"""Test-only: on a machine without CUDA, megatron-core's collective helpers allocate on the CPU.

megatron-core allocates the outputs of its all-gathers and reduce-scatters (the MoE token dispatchers',
sequence parallelism's) with `device=torch.cuda.current_device()`. Put on PYTHONPATH of the processes a
CPU test launches (tests/e2e/test_megatron_cli.py's expert-parallel test), this makes that the CPU, so that
megatron-core's own communication code runs over gloo. Nothing in tunesmith imports it.
"""

import torch

if not torch.cuda.is_available():
    torch.cuda.current_device = lambda: torch.device("cpu")
