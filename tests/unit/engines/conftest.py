"""A megatron-core world of one process (gloo, its own TCP store) for the Megatron engine's CPU tests."""

import socket

import pytest
import torch


@pytest.fixture(scope="module")
def world_of_one():
    pytest.importorskip("megatron.core")
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
