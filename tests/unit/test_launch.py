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
