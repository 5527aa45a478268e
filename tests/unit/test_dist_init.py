"""The one-process group (a sharded engine on one device) binds no port and leaves no MASTER_PORT behind: a port
picked and released can be taken before it is bound, and a MASTER_PORT in the environment reaches child processes,
whose own group then fails to listen on it (EADDRINUSE)."""

import subprocess
import sys

_SCRIPT = """
import os
import torch.distributed as torch_dist
from tunesmith import dist
os.environ.pop("MASTER_PORT", None)
dist.init(force=True)
assert torch_dist.is_initialized() and dist.world() == 1 and dist.rank() == 0
assert "MASTER_PORT" not in os.environ
assert dist.sum_int(3) == 3
dist.shutdown()
print("ok")
"""


def test_one_process_group_needs_no_port():
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
