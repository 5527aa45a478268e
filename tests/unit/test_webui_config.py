"""The web UI's config form: generated from the schema, validated as `tunesmith train` validates, LLaMA-Factory
YAML import and export, and launching a tiny run from it."""

import time
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from tunesmith.config.schema import GROUPS
from tunesmith.webui.app import WebUIState, build_app
from tunesmith.webui.configs import export_yaml, import_yaml, parse_form

DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.fixture
def client(tmp_path):
    state = WebUIState(runs_root=tmp_path / "saves", cwd=tmp_path)
    return TestClient(build_app(state), base_url="http://127.0.0.1:7860")


def tiny_values(output_dir, **more) -> dict:
    values = {"model_name_or_path": "tiny:qwen3", "dataset": "alpaca_demo", "dataset_dir": str(DATA),
              "template": "chatml", "cutoff_len": "64", "max_samples": "16", "finetuning_type": "full",
              "learning_rate": "1e-3", "max_steps": "2", "logging_steps": "1", "save_strategy": "no",
              "output_dir": str(output_dir)}
    return {**values, **more}


def test_the_form_has_every_field_of_the_schema_with_its_doc_and_default(client):
    spec = client.get("/api/form").json()
    assert [g["name"] for g in spec["groups"]] == list(GROUPS)
    for group in spec["groups"]:
        cls = GROUPS[group["name"]]
        assert [f["key"] for f in group["fields"]] == list(cls.model_fields)
        for field in group["fields"]:
            assert field["doc"] == cls.model_fields[field["key"]].description
    fields = {f["key"]: f for g in spec["groups"] for f in g["fields"]}
    assert fields["lr_scheduler_type"]["kind"] == "choice"
    assert fields["lr_scheduler_type"]["choices"] == ["linear", "cosine", "constant", "constant_with_warmup"]
    assert fields["learning_rate"] == {**fields["learning_rate"], "kind": "float", "default": 5e-5}
    assert fields["bf16"]["kind"] == "bool" and fields["bf16"]["default"] is False
    assert fields["max_samples"]["nullable"] and fields["max_samples"]["kind"] == "int"
    assert fields["reward_funcs"]["default"] == ["accuracy"] and fields["dataset"]["kind"] == "list"
    assert spec["output_dir"].startswith(spec["runs_root"])


def test_form_texts_are_read_as_on_the_command_line():
    flat = parse_form({"save_strategy": "no", "bf16": "true", "learning_rate": "1e-3", "dataset": "a,b",
                       "max_steps": "7", "template": "", "reward_funcs": "[{name: format, weight: 2}]"})
    assert flat == {"save_strategy": "no", "bf16": True, "learning_rate": 1e-3, "dataset": "a,b", "max_steps": 7,
                    "reward_funcs": [{"name": "format", "weight": 2}]}


def test_a_valid_config_is_resolved_as_the_cli_resolves_it(client, tmp_path):
    result = client.post("/api/config/validate", json={"values": tiny_values(tmp_path / "saves" / "x")}).json()
    assert result["ok"] and result["problems"] == []
    assert result["resolved"]["backend"] == "single" and result["resolved"]["learning_rate"] == 1e-3


def test_every_problem_is_reported_at_once_beside_its_field(client, tmp_path):
    values = tiny_values(tmp_path / "saves" / "x", learning_rate="-1", bf16="true", fp16="true")
    result = client.post("/api/config/validate", json={"values": values, "extra": "lerning_rate: 3"}).json()
    assert not result["ok"]
    by_message = {p["message"]: p["keys"] for p in result["problems"]}
    assert by_message["'learning_rate' = -1: Input should be greater than 0"] == ["learning_rate"]
    assert by_message["bf16 and fp16 are both true; choose one"] == ["bf16", "fp16"]
    assert any("unknown key 'lerning_rate'; did you mean 'learning_rate'?" == m for m in by_message)


def test_a_config_the_train_command_refuses_is_not_valid(client, tmp_path):
    result = client.post("/api/config/validate",
                         json={"values": tiny_values(tmp_path / "saves" / "x", do_train="false")}).json()
    assert not result["ok"] and "do_eval: false: nothing to run" in result["problems"][0]["message"]
    assert result["problems"][0]["keys"][0] == "do_train"


def test_output_dir_must_be_inside_the_runs_root(client, tmp_path):
    result = client.post("/api/config/validate", json={"values": tiny_values(tmp_path / "elsewhere")}).json()
    assert not result["ok"]
    assert result["problems"][-1]["keys"] == ["output_dir"]
    assert "is not inside the runs root" in result["problems"][-1]["message"]


def test_llamafactory_yaml_import_translates_its_keys(client):
    text = ("model_name_or_path: Qwen/Qwen3-0.6B\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
            "disable_gradient_checkpointing: true\nddp_timeout: 180000000\nreport_to: none\n"
            "use_kt: true\ndataloader_pin_memory: false\nmy_own_key: 1\n")
    result = client.post("/api/config/import", json={"text": text}).json()
    assert result["values"]["model_name_or_path"] == "Qwen/Qwen3-0.6B"
    assert result["values"]["gradient_checkpointing"] == "false"  # mapped from disable_gradient_checkpointing
    assert result["values"]["finetuning_type"] == "lora"
    assert "dataloader_pin_memory" in result["idle"]
    assert any(p.startswith("'use_kt' = True: KTransformers") for p in result["problems"])
    assert result["extra"] == "my_own_key: 1"  # not a key of the form: validation will name it


def test_import_refuses_a_key_given_twice(client):
    response = client.post("/api/config/import", json={"text": "cutoff_len: 1\ncutoff_len: 2\n"})
    assert response.status_code == 400
    assert "'cutoff_len' is given twice (lines 1 and 2)" in " ".join(response.json()["problems"])


def test_export_then_import_gives_the_same_form(client, tmp_path):
    values = tiny_values(tmp_path / "saves" / "x", lora_target="q_proj,v_proj", eval_strategy="no")
    text = client.post("/api/config/export", json={"values": values}).json()["text"]
    assert text.startswith("# tunesmith train this.yaml\n")
    assert yaml.safe_load(text)["save_strategy"] == "no" and yaml.safe_load(text)["learning_rate"] == 1e-3
    back = import_yaml(text)["values"]
    assert parse_form(back) == parse_form(values)


def test_llamafactory_export_keeps_only_its_keys_and_never_writes_secrets():
    text = export_yaml({"model_name_or_path": "m", "learning_rate": 1e-4, "backend": "fsdp2",
                        "swanlab_api_key": "sk-123"}, "llamafactory")
    assert "sk-123" not in text
    assert yaml.safe_load(text) == {"model_name_or_path": "m", "learning_rate": 1e-4}
    assert "# backend: fsdp2" in text and "set SWANLAB_API_KEY in the environment" in text
    assert text.startswith("# llamafactory-cli train this.yaml")


def test_a_launch_with_problems_is_refused_with_them(client, tmp_path):
    response = client.post("/api/runs/launch", json={"values": tiny_values(tmp_path / "saves" / "x",
                                                                           cutoff_len="2")})
    assert response.status_code == 422
    assert response.json()["problems"][0]["keys"] == ["cutoff_len"]
    assert not (tmp_path / "saves" / "x").exists()


def test_requests_of_the_wrong_shape_are_refused(client):
    assert client.post("/api/config/import", json={}).status_code == 422
    assert client.post("/api/config/export", json={"values": {}, "flavour": "toml"}).status_code == 400


@pytest.mark.slow
def test_launch_a_tiny_run_and_watch_it_finish(client, tmp_path):
    out = tmp_path / "saves" / "tiny"
    launched = client.post("/api/runs/launch", json={"values": tiny_values(out)})
    assert launched.status_code == 200, launched.text
    assert launched.json()["id"] == "tiny"
    assert yaml.safe_load((out / "webui_launch.yaml").read_text())["max_steps"] == 2
    deadline = time.time() + 240
    while time.time() < deadline:
        info = client.get("/api/run/info", params={"run": "tiny"}).json()
        if info["status"] not in ("running", "stopping"):
            break
        time.sleep(1)
    log = (out / "train.log").read_text()
    assert info["status"] == "finished", log
    assert info["progress"]["step"] == 2 and info["progress"]["total"] == 2
    rows = client.get("/api/run/metrics", params={"run": "tiny"}).json()["rows"]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    assert "model saved to" in log and info["config_file"] == "tunesmith_config.yaml"
    assert any(m["id"] == "tiny" for m in client.get("/api/models").json()["models"])


def test_a_folder_holding_a_run_is_refused_unless_resumed_or_replaced(client, tmp_path):
    out = tmp_path / "saves" / "done"
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    (out / "train.log").write_text("the first run's log\n")
    refused = client.post("/api/runs/launch", json={"values": tiny_values(out)})
    assert refused.status_code == 422
    problem = refused.json()["problems"][-1]
    assert problem["keys"] == ["output_dir"] and "already holds a run" in problem["message"]
    assert (out / "train.log").read_text() == "the first run's log\n"  # nothing of the earlier run replaced
    replace = client.post("/api/config/validate", json={"values": tiny_values(out, overwrite_output_dir="true")})
    assert replace.json()["ok"], replace.json()
