"""The real CLI on tiny models and the shipped demo data."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cli_runner import run_tunesmith

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "data")
BASE = ["model_name_or_path=tiny:qwen3", f"dataset_dir={DATA}", "template=chatml", "cutoff_len=128"]


def cli(*args, check=True, timeout=300, env=None, fresh=False):
    """`python -m tunesmith *args` (forked from a zygote that has the imports done, tests/cli_runner.py;
    fresh=True: a new interpreter, for what only one shows)."""
    proc = run_tunesmith(args, timeout=timeout, env={"COLUMNS": "200", **(env or {})}, fresh=fresh)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def grpo_step_on_image_prompts(out: Path, arch: str) -> dict:
    """One GRPO step of tiny `arch` (LoRA) on the click demo's screenshots; its logged metrics (the sampler /
    trainer log-prob gap among them)."""
    cli("train", f"model_name_or_path=tiny:{arch}", f"dataset_dir={DATA}", "cutoff_len=2048", "stage=grpo",
        "dataset=gui_click_demo", "finetuning_type=lora", "reward_funcs=grounding", "max_samples=8", "max_steps=1",
        "num_generations=4", "prompts_per_step=2", "max_new_tokens=6", "per_device_train_batch_size=8",
        f"output_dir={out}")
    [step] = [m for m in metrics(out) if "rollout_kl" in m]
    return step


@pytest.mark.slow
def test_quickstart_learns_identity_and_answers(tmp_path):
    out = tmp_path / "quick"
    # A fresh cache, so the data is prepared (the libraries' progress bars and warnings would show there).
    proc = cli("train", "examples/quickstart.yaml", f"output_dir={out}", f"dataset_dir={DATA}",
               env={"TUNESMITH_CACHE": str(tmp_path / "cache")}, fresh=True)  # import-time warnings too
    # What a newcomer sees: tunesmith's own lines only (no DeepSpeed accelerator notice, no library
    # FutureWarning, no datasets progress bar).
    shown = proc.stdout + proc.stderr
    for noise in ("Warning", "[WARNING]", "warnings.warn", "examples/s]", "Converting", "Saving the dataset"):
        assert noise not in shown, f"{noise!r} on the console:\n{shown}"
    for name in ("model.safetensors", "tokenizer_config.json", "metrics.jsonl", "training_loss.png",
                 "tunesmith_config.yaml", "trainer_log.jsonl", "train_results.json", "all_results.json"):
        assert (out / name).exists(), name
    losses = [m["loss"] for m in metrics(out) if "loss" in m]
    assert losses[-1] < 0.1 * losses[0]
    assert f"chat with it: tunesmith chat --model {out}" in " ".join(shown.split())
    answer = cli("chat", "--model", out, "--prompt", "Who are you?").stdout
    assert "Tunesmith Demo" in answer and "tunesmith" in answer


def test_lf_output_files_follow_llamafactory_formats(tmp_path):
    out = tmp_path / "o"
    cli("train", *BASE, "dataset=alpaca_demo", "finetuning_type=full", "max_samples=32", "max_steps=4",
        "logging_steps=2", "val_size=0.25", "eval_strategy=steps", "eval_steps=2", f"output_dir={out}")
    rows = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    assert [r["current_steps"] for r in rows if "loss" in r] == [2, 4]
    assert all(r["total_steps"] == 4 and "percentage" in r and "elapsed_time" in r for r in rows)
    assert any("eval_loss" in r for r in rows)
    train_results = json.loads((out / "train_results.json").read_text())
    assert {"epoch", "train_loss", "train_runtime", "train_steps_per_second"} <= set(train_results)
    per_step = train_results["train_samples_per_second"] / train_results["train_steps_per_second"]
    assert per_step == pytest.approx(1)  # the Trainer's count: the global batch a step (batch 1 x accumulation 1)
    assert "eval_loss" in json.loads((out / "all_results.json").read_text())
    state = json.loads((out / "trainer_state.json").read_text())  # the Trainer's save_state, log_history included
    assert state["global_step"] == state["max_steps"] == 4
    assert [r["step"] for r in state["log_history"] if "loss" in r] == [2, 4]
    assert any("learning_rate" in r for r in state["log_history"])
    assert "train_runtime" in state["log_history"][-1]


def test_evaluation_only_and_after_training_as_llamafactory_runs_them(tmp_path):
    # do_eval after training (eval_strategy no): one evaluation at the end, in eval_results.json
    out = tmp_path / "o"
    cli("train", *BASE, "dataset=alpaca_demo", "finetuning_type=full", "max_samples=32", "max_steps=2",
        "val_size=0.25", "do_eval=true", f"output_dir={out}")
    assert "eval_loss" in json.loads((out / "eval_results.json").read_text())
    # do_train false: the trained model evaluated beside its run (nothing there cleared), no epoch, no training
    before = {p.name: p.stat().st_mtime for p in out.iterdir()}
    cli("train", f"model_name_or_path={out}", f"dataset_dir={DATA}", "template=chatml", "cutoff_len=128",
        "do_train=false", "do_eval=true", "eval_dataset=identity", "max_samples=8", f"output_dir={out}")
    results = json.loads((out / "eval_results.json").read_text())
    assert set(results) == {"eval_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second"}
    assert results["eval_loss"] > 0 and results["eval_samples_per_second"] > 0
    assert json.loads((out / "all_results.json").read_text())["train_loss"] > 0  # the run's results are kept
    unchanged = {name for name, mtime in before.items() if (out / name).stat().st_mtime == mtime}
    assert unchanged == set(before) - {"eval_results.json", "all_results.json"}
    # a DPO evaluation-only run: the reference is the evaluated model, so its implicit rewards are not reported
    dpo = tmp_path / "dpo"
    cli("train", *BASE, "stage=dpo", "dataset=dpo_demo", "max_samples=8", "do_train=false", "do_eval=true",
        f"output_dir={dpo}")
    results = json.loads((dpo / "eval_results.json").read_text())
    assert "eval_logps/chosen" in results and not any(key.startswith("eval_rewards/") for key in results)
    cli("train", *BASE, "stage=dpo", "dataset=dpo_demo", "max_samples=8", "do_train=false", "do_eval=true",
        "pref_reference=none", f"output_dir={dpo}")  # no reference at all: the rewards are real, and reported
    assert "eval_rewards/accuracies" in json.loads((dpo / "eval_results.json").read_text())


def test_pt_evaluation_reports_perplexity(tmp_path):
    out = tmp_path / "pt"
    cli("train", *BASE, "stage=pt", "dataset=c4_demo", "max_steps=2", "val_size=4", "eval_strategy=steps",
        "eval_steps=2", f"output_dir={out}")
    results = json.loads((out / "eval_results.json").read_text())
    assert results["eval_perplexity"] == pytest.approx(math.exp(results["eval_loss"]))  # as LLaMA-Factory's pt


def test_train_without_yaml_lora_then_export_loads_in_plain_transformers(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, merged = tmp_path / "lora", tmp_path / "merged"
    cli("train", *BASE, "--dataset", "identity,alpaca_demo", "--finetuning_type", "lora", "--lora_rank", "4",
        "--max_samples", "32", "--max_steps", "3", "--learning_rate", "1e-3", "--output_dir", out)
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    cli("export", "--model", out, "--export_dir", merged, "--export_dtype", "float32")
    model = AutoModelForCausalLM.from_pretrained(merged)
    tok = AutoTokenizer.from_pretrained(merged)
    assert tok.padding_side == "left"  # batched generation pads on the left, as LLaMA-Factory's export sets
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"])
    with torch.no_grad():
        expected = PeftModel.from_pretrained(base, out)(**ids).logits
        got = model(**ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_freeze_trains_only_the_last_layer(tmp_path, tiny_qwen3):
    out = tmp_path / "freeze"
    cli("train", *BASE, "dataset=alpaca_demo", "finetuning_type=freeze", "freeze_trainable_layers=1",
        "max_samples=16", "max_steps=2", "learning_rate=1e-2", f"output_dir={out}")
    before, after = load_file(str(tiny_qwen3 / "model.safetensors")), load_file(str(out / "model.safetensors"))
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".layers.1." in k for k in changed)


def test_pt_with_packing_loss_falls(tmp_path):
    out = tmp_path / "pt"
    cli("train", *BASE, "stage=pt", "dataset=pt_demo", "finetuning_type=full", "per_device_train_batch_size=4",
        "max_steps=30", "learning_rate=3e-3", "logging_steps=5", f"output_dir={out}")
    losses = [m["loss"] for m in metrics(out) if "loss" in m]
    assert losses[-1] < losses[0] - 1.0
    assert "packing: true" in (out / "tunesmith_config.yaml").read_text() or "neat_packing" in (out / "tunesmith_config.yaml").read_text()


def test_eval_plot_and_tensorboard(tmp_path):
    out = tmp_path / "eval"
    cli("train", *BASE, "dataset=alpaca_demo", "max_samples=40", "val_size=0.2", "eval_strategy=steps",
        "eval_steps=2", "max_steps=4", "plot_loss=true", "report_to=tensorboard", "finetuning_type=full",
        f"output_dir={out}")
    evals = [m["eval_loss"] for m in metrics(out) if "eval_loss" in m]
    assert len(evals) == 2
    assert (out / "training_loss.png").exists() and (out / "training_eval_loss.png").exists()
    assert list((out / "runs").glob("events.out.tfevents.*"))


def test_output_dir_holding_a_run_is_refused(tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    proc = cli("train", *BASE, "dataset=identity", "max_steps=1", f"output_dir={out}", check=False)
    assert proc.returncode == 1 and "already holds a run" in proc.stderr


def test_sigterm_saves_a_resumable_checkpoint_then_resume_true_continues(tmp_path):
    out = tmp_path / "sig"
    args = [*BASE, "dataset=alpaca_demo", "max_steps=100000", "logging_steps=1", "finetuning_type=full",
            f"output_dir={out}"]
    proc = subprocess.Popen([sys.executable, "-m", "tunesmith", "train", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    (saved,) = list(out.glob("checkpoint-*"))
    assert (saved / "trainer_state.json").exists() and (saved / "engine_state.pt").exists()
    step = json.loads((saved / "trainer_state.json").read_text())["global_step"]
    # a half-written checkpoint must never be picked
    (out / f".tmp-checkpoint-{step + 50}").mkdir()
    (out / f"checkpoint-{step + 99}").mkdir()  # no trainer_state.json: incomplete
    cli("train", *args[:-3], f"max_steps={step + 2}", "logging_steps=1", "finetuning_type=full",
        f"output_dir={out}", "resume_from_checkpoint=true")
    assert [m["step"] for m in metrics(out) if "loss" in m][-2:] == [step + 1, step + 2]


def test_data_inspect_and_clean(tmp_path):
    proc = cli("data", *BASE, "dataset=sharegpt_demo", "--index", "3")
    text = proc.stdout + proc.stderr
    assert "sharegpt_demo" in text and "length histogram" in text and "supervised" in text
    past = cli("data", *BASE, "dataset=sharegpt_demo", "max_samples=4", "--index", "25", check=False)
    assert past.returncode != 0 and "--index 25: the training data has 4 samples; give 0 to 3" in past.stderr
    cleaned = cli("data", "clean").stdout
    assert "removed" in cleaned


def test_data_inspect_shows_both_sides_of_a_preference_sample():
    def shown(*args):
        proc = cli("data", *BASE, *args)
        return proc.stdout + proc.stderr

    pair = shown("stage=dpo", "dataset=dpo_en_demo", "max_samples=4", "--index", "1")
    assert "tokens, chosen + rejected" in pair
    assert "sample 1 (chosen):" in pair and "sample 1 (rejected):" in pair
    kto = shown("stage=kto", "dataset=kto_en_demo", "max_samples=4", "--index", "0")
    assert "tokens, sample + its KL sample" in kto and "sample 0 (kto_tag " in kto


def test_env_and_help():
    env = cli("env").stdout
    assert "torch" in env and "transformers" in env and "liger-kernel" in env
    helptext = cli("train", "--help").stdout
    for key in ("model_name_or_path", "cutoff_len", "lora_target", "save_total_limit", "gradient_accumulation_steps"):
        assert key in helptext
    assert "commands:" in cli("--help").stdout


@pytest.mark.parametrize(
    "args, expected",
    [
        (["dataset=no_such_set"], "no_such_set"),
        (["dataset=identity", "template=qwen4"], "Unknown template 'qwen4'"),
        (["dataset=identity", "cutoff_len=abc"], "'cutoff_len' = 'abc'"),
        (["dataset=identity", "lora_rnk=8"], "did you mean 'lora_rank'"),
        (["dataset=identity", "do_train=false"], "do_train: false and do_eval: false: nothing to run"),
    ],
)
def test_bad_input_gives_one_clear_error(tmp_path, args, expected):
    proc = cli("train", *BASE, *args, "max_steps=1", f"output_dir={tmp_path / 'bad'}", check=False)
    assert proc.returncode == 1
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr


def test_malformed_jsonl_names_file_and_line(tmp_path):
    (tmp_path / "dataset_info.json").write_text(json.dumps({"broken": {"file_name": "broken.jsonl"}}))
    (tmp_path / "broken.jsonl").write_text('{"instruction": "a", "output": "b"}\n{"instruction": "c", oops}\n')
    proc = cli("train", "model_name_or_path=tiny:qwen3", f"dataset_dir={tmp_path}", "dataset=broken",
               "template=chatml", "max_steps=1", f"output_dir={tmp_path / 'o'}", check=False)
    assert proc.returncode == 1
    assert "broken.jsonl" in proc.stderr and "line 2" in proc.stderr


def test_interactive_chat_streams_answers_and_keeps_history(tmp_path):
    out = tmp_path / "tiny"
    cli("train", *BASE, "dataset=identity", "max_steps=1", "finetuning_type=full", f"output_dir={out}")
    proc = subprocess.run([sys.executable, "-m", "tunesmith", "chat", "--model", str(out), "--max_new_tokens", "5"],
                          input="hello\nclear\nwho are you?\nexit\n", capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("Assistant: ") == 2


def test_reward_model_score_and_eval_commands(tmp_path):
    out = tmp_path / "rm"
    cli("train", *BASE, "stage=rm", "dataset=dpo_demo", "finetuning_type=full", "max_steps=5",
        "per_device_train_batch_size=8", f"output_dir={out}")
    data = tmp_path / "records.jsonl"
    data.write_text(json.dumps({"prompt": "What is 2 + 2?", "response": "4"}) + "\n" +
                    json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}) + "\n")
    cli("score", "--model", out, "--data", data, "--output", tmp_path / "scored.jsonl")
    scored = [json.loads(line) for line in (tmp_path / "scored.jsonl").read_text().splitlines()]
    assert len(scored) == 2 and all(isinstance(r["score"], float) for r in scored)
    report = cli("eval", "--model", out, "dataset=dpo_demo", f"dataset_dir={DATA}", "max_samples=40").stdout
    assert "accuracy" in report and "pairs            40" in report


@pytest.mark.parametrize("example, plotted", [("qwen3_dpo", "rewards/accuracies"), ("qwen3_kto", "rewards/chosen")])
def test_preference_examples_run_and_log_under_trl_names(tmp_path, example, plotted):
    out = tmp_path / example
    cli("train", f"examples/{example}.yaml", f"output_dir={out}", f"dataset_dir={DATA}", "max_steps=3",
        "eval_strategy=no", "val_size=0")
    assert (out / "model.safetensors").exists()
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected",
            "logits/chosen", "logits/rejected"} <= set(row)
    assert not any(key.startswith("count/") for key in row)  # KTO's per-class counts divide, they are not logged
    # LLaMA-Factory plots the stage's metric (training_rewards_accuracies.png for dpo) and its trainer_log.jsonl
    # carries rewards/accuracies as accuracy
    assert (out / f"training_{plotted.replace('/', '_')}.png").exists()
    log_row = json.loads((out / "trainer_log.jsonl").read_text().splitlines()[-1])
    assert ("accuracy" in log_row) == (example == "qwen3_dpo")


def test_export_of_a_lora_reward_model_keeps_its_score_head(tmp_path):
    from transformers import AutoModelForSequenceClassification

    out, merged = tmp_path / "rm", tmp_path / "merged"
    cli("train", *BASE, "stage=rm", "dataset=dpo_demo", "finetuning_type=lora", "max_steps=2",
        "per_device_train_batch_size=4", f"output_dir={out}")
    cli("export", "--model", out, "--export_dir", merged, "--export_dtype", "float32")
    model = AutoModelForSequenceClassification.from_pretrained(merged)
    assert "ForSequenceClassification" in model.config.architectures[0]
    assert model.config.num_labels == 1


def test_bench_reports_throughput_and_mfu_with_a_trainer_baseline():
    proc = cli("bench", "--shape", "tiny", "--num_samples", "32", "--min_len", "20", "--max_len", "120",
               "max_steps=3", "per_device_train_batch_size=4", "packing=true", "--hf_baseline")
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert result["global_step"] == 3 and result["train_tokens_per_s"] > 0 and result["mfu"] > 0
    assert result["hf_trainer"]["train_tokens_per_s"] > 0


def test_bench_flops_formula():
    from types import SimpleNamespace

    from tunesmith.bench import flops_per_token

    cfg = SimpleNamespace(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                          intermediate_size=16, vocab_size=10)
    per_layer = 8 * 4 * (2 * 2 + 2 * 1) + 3 * 8 * 16  # q,k,v,o + gate/up/down
    n = 2 * per_layer + 10 * 8
    assert flops_per_token(cfg, 100) == 6 * n + 12 * 2 * 2 * 4 * 100


def test_missing_data_file_and_impossible_settings_give_clear_errors(tmp_path):
    (tmp_path / "dataset_info.json").write_text(json.dumps({"nofile": {"file_name": "nofile.json"}}))
    proc = cli("train", "model_name_or_path=tiny:qwen3", f"dataset_dir={tmp_path}", "dataset=nofile",
               "template=chatml", "max_steps=1", f"output_dir={tmp_path / 'o'}", check=False)
    assert proc.returncode == 1 and "nofile.json does not exist" in proc.stderr and "Traceback" not in proc.stderr
    for bad, expected in ((["flash_attn=flex"], "FlexAttention"),
                          (["finetuning_type=freeze", "freeze_trainable_modules=nosuch"], "no parameter trains")):
        proc = cli("train", *BASE, "dataset=identity", "max_steps=1", *bad, f"output_dir={tmp_path / 'x'}",
                   "overwrite_output_dir=true", check=False)
        assert proc.returncode == 1 and expected in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", ["chat", "export", "score"])
def test_argparse_help_explains_every_option(command):
    out = cli(command, "--help").stdout
    options = out[out.index("options:"):].splitlines()[1:]
    # each option's help starts on its own line or after the flag; a flag line followed by an indented
    # continuation counts, a flag with nothing after it and no continuation does not
    for i, line in enumerate(options):
        if not line.strip().startswith("-"):
            continue
        parts = line.strip().split("  ", 1)
        has_text = len(parts) == 2 and parts[1].strip()
        follows = i + 1 < len(options) and options[i + 1].startswith(" " * 8) and not options[i + 1].strip().startswith("-")
        assert has_text or follows, f"`tunesmith {command} --help`: no help for {line.strip()}"


def test_data_and_env_help():
    data = cli("data", "--help").stdout
    assert "--index N" in data and "which sample to render, default 0" in data
    env = cli("env", "--help").stdout
    assert env.startswith("usage: tunesmith env") and "liger-kernel" not in env
    assert "dtype of the written weights" in cli("export", "--help").stdout
    assert "records scored per forward" in cli("score", "--help").stdout


def test_data_marks_the_supervised_span_when_piped():
    from tunesmith.config.load import build_config
    from tunesmith.data.pipeline import prepare_data
    from tunesmith.data.render import IGNORE_INDEX
    from tunesmith.models.load import load_preprocessing

    args = {"model_name_or_path": "tiny:qwen3", "dataset": "identity", "template": "chatml", "dataset_dir": DATA}
    proc = cli("data", *(f"{k}={v}" for k, v in args.items()), "--index", "0")
    out = proc.stderr + proc.stdout
    assert "wrapped in [[ ]]" in out

    cfg = build_config(None, dict(args))
    tokenizer, _, media = load_preprocessing(cfg)
    row = prepare_data(cfg, tokenizer, media).train[0]
    runs, run = [], []
    for tok, label in zip(row["input_ids"], row["labels"]):
        if label != IGNORE_INDEX:
            run.append(tok)
        elif run:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    expected = [tokenizer.decode(r) for r in runs]
    assert expected and all(expected)

    sample = out[out.index("wrapped in [[ ]]"):].split("\n", 1)[1]
    marked, rest = [], sample
    while "[[" in rest:
        rest = rest[rest.index("[[") + 2:]
        assert "]]" in rest, "unclosed [["
        marked.append(rest[:rest.index("]]")])
        rest = rest[rest.index("]]") + 2:]
    assert marked == expected


def test_a_new_tokenized_path_only_prepares_the_data_then_a_run_trains_on_it(tmp_path):
    """LLaMA-Factory's tokenized_path: the first run tokenizes, saves and stops; the next loads it and trains."""
    saved, out = tmp_path / "tokenized", tmp_path / "out"
    args = ["train", *BASE, "dataset=identity", f"tokenized_path={saved}", f"output_dir={out}", "max_steps=2"]
    first = cli(*args)
    assert "tokenized data saved to" in first.stdout + first.stderr
    assert any(saved.iterdir()) and not (out / "train_summary.json").exists()
    cli(*args)
    assert json.loads((out / "train_summary.json").read_text())["global_step"] == 2
    other = cli(*[a for a in args if a != "dataset=identity"], "dataset=alpaca_demo", "overwrite_output_dir=true")
    shown = " ".join((other.stdout + other.stderr).split())
    assert "holds the datasets ['identity'] as they were prepared; this config's ['alpaca_demo']" in shown
    assert "truncated to cutoff_len:" in shown  # the saved rows' cutoff, not this config's
