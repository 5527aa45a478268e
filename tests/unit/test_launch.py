import subprocess
import sys

from tunesmith import launch


def test_torchrun_command_reads_the_multi_node_variables(monkeypatch):
    for key, value in {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29555",
                       "NPROC_PER_NODE": "8"}.items():
        monkeypatch.setenv(key, value)
    cmd = launch.torchrun_command(["train", "cfg.yaml", "lr=1"])
    assert cmd[:10] == ["--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "8", "--master_addr", "10.0.0.5",
                        "--master_port", "29555"]
    assert cmd[10:] == ["-m", "tunesmith", "train", "cfg.yaml", "lr=1"]


def test_force_torchrun_and_children(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("FORCE_TORCHRUN", "1")
    assert launch.wants_torchrun()
    monkeypatch.setenv("LOCAL_RANK", "0")  # a torchrun child never relaunches
    assert not launch.wants_torchrun()


def _python(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


def test_exit_quickly_finishes_like_the_interpreter():
    """atexit handlers run, a non-daemon thread is waited for, buffered output is flushed, the code is kept."""
    done = _python("import atexit, threading, time\n"
                   "from tunesmith.cli import exit_quickly\n"
                   "atexit.register(lambda: print('atexit ran'))\n"
                   "threading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()\n"
                   "print('buffered', end=' ')\n"
                   "exit_quickly(3)\n")
    assert done.returncode == 3
    assert done.stdout == "buffered thread done\natexit ran\n"


def test_exit_quickly_with_stdout_closed_keeps_the_code():
    done = _python("import sys\nfrom tunesmith.cli import exit_quickly\nsys.stdout.close()\nexit_quickly(0)\n")
    assert done.returncode == 0 and done.stderr == ""
