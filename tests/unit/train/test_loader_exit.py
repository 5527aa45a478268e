"""A process that stops with a DataLoader still open (a run that ends mid-epoch at max_steps) exits: the workers
ignore SIGTERM (train/plan.ignore_stop_signals), which multiprocessing's exit hook sends them before waiting on
them, so the loader's own shutdown must run first."""

import os
import subprocess
import sys
import textwrap

from conftest import REPO

SCRIPT = textwrap.dedent("""
    import sys
    import datasets
    from tunesmith.train import plan

    class Plan:  # what micro_batch_loader reads of an EpochPlan
        cutoff_len, packing, unpadded, seed = 8, False, False, 0

    rows = datasets.Dataset.from_dict({"input_ids": [[1, 2]] * 64, "labels": [[1, 2]] * 64})
    loader = plan.micro_batch_loader(rows, Plan(), [[[i]] for i in range(64)], 0, num_workers=2, epoch=0)
    next(loader)
    sys.exit(0)
""")


def test_a_process_with_an_open_loader_exits():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "killed by signal" not in done.stderr
