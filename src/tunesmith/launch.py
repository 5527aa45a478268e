"""Re-run `tunesmith train` under torchrun when there is more than one GPU (or FORCE_TORCHRUN=1).

NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT and NPROC_PER_NODE shape the launch, as
in LLaMA-Factory. The child processes find LOCAL_RANK set and train normally.
"""

from __future__ import annotations

import os
import sys


def wants_torchrun() -> bool:
    if "LOCAL_RANK" in os.environ:  # already a torchrun child
        return False
    if os.environ.get("FORCE_TORCHRUN", "0").lower() in ("1", "true"):
        return True
    import torch

    return torch.cuda.device_count() > 1


def torchrun_command(argv: list[str]) -> list[str]:
    import torch

    nproc = os.environ.get("NPROC_PER_NODE") or str(max(torch.cuda.device_count(), 1))
    return [
        "--nnodes", os.environ.get("NNODES", "1"),
        "--node_rank", os.environ.get("NODE_RANK", "0"),
        "--nproc_per_node", nproc,
        "--master_addr", os.environ.get("MASTER_ADDR", "127.0.0.1"),
        "--master_port", os.environ.get("MASTER_PORT", str(29500 + os.getpid() % 1000)),
        "-m", "tunesmith", *argv,
    ]


def relaunch(argv: list[str]) -> int:
    """Run the same command under torchrun (in this process: its launcher, not a subprocess, so a failure
    ends as one line here while each failing rank has already said what failed); returns the exit status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # torchrun forwards SIGTERM/SIGINT to the ranks and then gives them this long to save and exit (its own
    # default, 30 s, is too short to checkpoint a large model); the user's value wins.
    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "600")
    try:
        run(parse_args(torchrun_command(argv)))
    except SignalException:
        # Preempted: the ranks were asked to save at their next step boundary and exit, as one process does.
        print("tunesmith: stopped by a signal; resume with resume_from_checkpoint: true", file=sys.stderr)
        return 130
    except ChildFailedError as err:
        ranks = sorted(err.failures)
        print(f"tunesmith: training failed on rank(s) {ranks}; each rank's message is above", file=sys.stderr)
        return 1
    return 0
