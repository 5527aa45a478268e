"""tests/cli_runner.py's forked ranks (TUNESMITH_TEST_FORK_RANKS=1 with FORCE_TORCHRUN=1): every rank gets the
environment torchrun gives it and writes to the command's output, and a failing launch ends as torchrun's does:
exit 1 and one line naming the failed ranks."""

import os
import re

from cli_runner import REPO, run_tunesmith

FORKED = {"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2", "TUNESMITH_TEST_FORK_RANKS": "1",
          "MASTER_PORT": str(29900 + os.getpid() % 90)}


def test_forked_ranks_each_get_torchruns_environment(tmp_path):
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(
        "import os\nprint('rank', os.environ['RANK'], os.environ['LOCAL_RANK'], os.environ['WORLD_SIZE'],"
        " os.environ['LOCAL_WORLD_SIZE'], os.environ['MASTER_ADDR'], os.environ['OMP_NUM_THREADS'])\n")
    proc = run_tunesmith(["--help"], env={**FORKED, "PYTHONPATH": str(probe)}, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    said = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank "))
    assert said == ["rank 0 0 2 2 127.0.0.1 1", "rank 1 1 2 2 127.0.0.1 1"]


def test_a_failing_forked_launch_exits_1_naming_the_ranks(tmp_path):
    proc = run_tunesmith(["train", "model_name_or_path=tiny:qwen3", "no_such_key=1", f"output_dir={tmp_path}"],
                         env=FORKED, cwd=REPO)
    assert proc.returncode == 1 and "problem(s) in the configuration" in proc.stderr
    # both ranks fail; the first seen ends the launch (the other may be stopped before it exits)
    assert re.search(r"training failed on rank\(s\) \[[01](, 1)?\]", proc.stderr), proc.stderr
