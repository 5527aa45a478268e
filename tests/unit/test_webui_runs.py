"""The web UI's runs API: discovery in an output root, metrics read incrementally as they are written, progress
and ETA, config and log, the models to chat with, ids that try to leave the root."""

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tunesmith.webui.app import WebUIState, build_app
from tunesmith.webui.runs import RunsRoot, read_rows


@pytest.fixture
def client(tmp_path):
    state = WebUIState(runs_root=tmp_path / "saves", cwd=tmp_path)
    return TestClient(build_app(state), base_url="http://127.0.0.1:7860")


def write_run(folder: Path, num_steps: int, total: int, finished: bool = False) -> Path:
    """A run folder as the trainer leaves it: metrics.jsonl, trainer_log.jsonl, the saved config."""
    folder.mkdir(parents=True)
    rows = [{"step": s, "loss": 2.0 / s, "lr": 1e-3, "grad_norm": 1.5, "tokens_per_s": 900.0 + s} for s in
            range(1, num_steps + 1)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = [{"current_steps": s, "total_steps": total, "loss": 2.0 / s, "percentage": round(s / total * 100, 2),
            "elapsed_time": f"0:00:{s:02d}", "remaining_time": f"0:01:{total - s:02d}"} for s in range(1, num_steps + 1)]
    (folder / "trainer_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    (folder / "tunesmith_config.yaml").write_text("model_name_or_path: tiny:qwen3\nlearning_rate: 0.001\n")
    if finished:
        (folder / "train_summary.json").write_text("{}")
    return folder


def test_runs_are_found_at_any_depth_and_checkpoints_are_not_runs(client, tmp_path):
    root = tmp_path / "saves"
    write_run(root / "a", 3, 10, finished=True)
    write_run(root / "qwen3" / "lora" / "b", 2, 4)
    (root / "a" / "checkpoint-2").mkdir()
    (root / "a" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (root / "empty").mkdir()
    runs = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}
    assert set(runs) == {"a", "qwen3/lora/b"}
    a = runs["a"]
    assert a["status"] == "finished"
    assert a["progress"] == {"step": 3, "total": 10, "percentage": 30.0, "elapsed_s": 3.0, "eta_s": 67.0}
    assert a["latest"]["loss"] == pytest.approx(2.0 / 3)
    assert runs["qwen3/lora/b"]["status"] == "running"  # written just now, not launched here


def test_metrics_are_read_incrementally_whole_lines_only(client, tmp_path):
    run = write_run(tmp_path / "saves" / "r", 2, 5)
    first = client.get("/api/run/metrics", params={"run": "r", "offset": 0}).json()
    assert [row["step"] for row in first["rows"]] == [1, 2]
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 3, "loss": 0.5}) + "\n" + '{"step": 4, "lo')  # step 4 is being written
    second = client.get("/api/run/metrics", params={"run": "r", "offset": first["offset"]}).json()
    assert [row["step"] for row in second["rows"]] == [3]
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('ss": 0.25}\n')
    third = client.get("/api/run/metrics", params={"run": "r", "offset": second["offset"]}).json()
    assert third["rows"] == [{"step": 4, "loss": 0.25}] and not third["reset"]


def test_a_rewritten_metrics_file_is_read_again_from_the_start(tmp_path):
    run = write_run(tmp_path / "r", 5, 5)
    _, offset = read_rows(run, 0)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 9.0}) + "\n")  # a resume kept step 1 only
    rows, new_offset = read_rows(run, offset)
    assert rows == [{"step": 1, "loss": 9.0}] and new_offset < offset


def test_a_llamafactory_run_is_read_from_its_trainer_log(client, tmp_path):
    run = tmp_path / "saves" / "lf"
    run.mkdir(parents=True)
    (run / "trainer_log.jsonl").write_text(json.dumps({"current_steps": 5, "total_steps": 10, "loss": 1.25,
                                                       "lr": 2e-5, "throughput": 300.0, "percentage": 50.0,
                                                       "elapsed_time": "0:00:10", "remaining_time": "0:00:10"}) + "\n")
    (run / "training_args.yaml").write_text("stage: sft\n")
    rows = client.get("/api/run/metrics", params={"run": "lf"}).json()["rows"]
    assert rows == [{"step": 5, "loss": 1.25, "lr": 2e-5, "tokens_per_s": 300.0}]
    info = client.get("/api/run/info", params={"run": "lf"}).json()
    assert info["config_file"] == "training_args.yaml" and info["config"] == "stage: sft\n"
    assert info["progress"]["eta_s"] == 10.0


def test_config_and_log_of_a_run(client, tmp_path):
    run = write_run(tmp_path / "saves" / "r", 1, 1, finished=True)
    info = client.get("/api/run/info", params={"run": "r"}).json()
    assert info["config_file"] == "tunesmith_config.yaml" and "learning_rate: 0.001" in info["config"]
    assert client.get("/api/run/log", params={"run": "r"}).json() == {"text": "", "offset": 0, "reset": False,
                                                                      "exists": False}
    (run / "train.log").write_text("line 1\n")
    first = client.get("/api/run/log", params={"run": "r"}).json()
    assert first["text"] == "line 1\n" and first["exists"]
    with open(run / "train.log", "a") as fh:
        fh.write("line 2\n")
    assert client.get("/api/run/log", params={"run": "r", "offset": first["offset"]}).json()["text"] == "line 2\n"


@pytest.mark.parametrize("run", ["..", "../outside", "/etc", "r/../../outside"])
def test_a_run_id_never_leaves_the_runs_root(client, tmp_path, run):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "metrics.jsonl").write_text('{"step": 1, "loss": 1}\n')
    write_run(tmp_path / "saves" / "r", 1, 1)
    response = client.get("/api/run/metrics", params={"run": run})
    assert response.status_code == 400 and "outside the runs root" in response.json()["error"]


def test_unknown_run_and_stop_of_a_run_not_launched_here(client, tmp_path):
    write_run(tmp_path / "saves" / "r", 1, 1)
    missing = client.get("/api/run/info", params={"run": "nope"})
    assert missing.status_code == 400 and "no run 'nope'" in missing.json()["error"]
    stop = client.post("/api/run/stop", json={"run": "r"})
    assert stop.status_code == 400 and "no run launched from this page" in stop.json()["error"]


def test_models_lists_final_models_and_checkpoints_in_step_order(client, tmp_path):
    run = write_run(tmp_path / "saves" / "r", 1, 1, finished=True)
    (run / "model.safetensors").write_bytes(b"")
    for step in (10, 2):
        (run / f"checkpoint-{step}").mkdir()
        (run / f"checkpoint-{step}" / "adapter_model.safetensors").write_bytes(b"")
    (run / "checkpoint-5").mkdir()  # no weights: not a model
    models = client.get("/api/models").json()["models"]
    assert [(m["id"], m["kind"], m["adapter"]) for m in models] == [
        ("r/checkpoint-2", "checkpoint", True), ("r/checkpoint-10", "checkpoint", True), ("r", "model", False)]


def test_the_page_and_its_scripts_are_served(client):
    page = client.get("/")
    assert page.status_code == 200 and "tunesmith web UI" in page.text
    for name in ("app.js", "charts.js", "form.js", "runs.js", "chat.js", "export.js", "style.css",
                 "vendor/uPlot.iife.min.js", "vendor/uPlot.min.css", "vendor/uPlot.LICENSE"):
        response = client.get(f"/static/{name}")
        assert response.status_code == 200 and response.content, name
        assert f"/static/{name}" in page.text or name.startswith(("vendor/uPlot.LICENSE",)), name


def test_runs_root_discovery_skips_hidden_and_temporary_folders(tmp_path):
    root = tmp_path / "saves"
    write_run(root / ".tmp-x", 1, 1)
    write_run(root / "ok", 1, 1)
    assert [p.name for p in RunsRoot(root).discover()] == ["ok"]
