"""Faults around checkpoints: kill -9 during a save, truncated and corrupt files, a planted pickle, unsigned
checkpoints, a full disk, SIGTERM to the whole process group (data-loader workers included), a Hugging Face
Trainer checkpoint-N. Each ends in a named refusal, or in a survival where nothing is lost."""

import contextlib
import errno
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import DATA_DIR, REPO, run_config
from tunesmith.errors import TunesmithError
from tunesmith.train import checkpoint as ckpt
from tunesmith.train.setup import train

SAVING = dict(save_strategy="steps", save_steps=2)
CLI_BASE = ["model_name_or_path=tiny:qwen3", f"dataset_dir={DATA_DIR}", "template=chatml", "cutoff_len=128",
            "dataset=alpaca_demo", "max_samples=64", "finetuning_type=full", "learning_rate=1e-3", "logging_steps=1"]


@pytest.fixture(autouse=True)
def _key(tmp_path, monkeypatch):
    """Each test signs with its own key (subprocesses inherit it); nothing is written to ~/.config."""
    path = tmp_path / "keys" / "checkpoint.key"
    monkeypatch.setenv(ckpt.KEY_ENV, str(path))
    return path


class Payload:
    """A pickle that, when loaded by pickle (not weights_only), touches `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _verifies(path: Path) -> bool:
    verdict = ckpt.verify(path)
    return not verdict.damage and verdict.untrusted is None


def _popen(out: Path, *args, env=None):
    return subprocess.Popen([sys.executable, "-m", "tunesmith", "train", *CLI_BASE, f"output_dir={out}", *args],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200", **(env or {})}, start_new_session=True)


def _cli(out: Path, *args, check=True, env=None):
    proc = _popen(out, *args, env=env)
    stdout, stderr = proc.communicate(timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{stdout}\n{stderr}")
    return proc.returncode, stdout + stderr


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def _wait_for(condition, proc, timeout=180.0, poll=0.01):
    """Poll until condition() holds; fail with the process's output if it ends or the time runs out first."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if condition():
            return
        time.sleep(poll)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=30)
    raise AssertionError(f"condition not reached (exit {proc.returncode}):\n{stdout}\n{stderr}")


def _logged_steps(out: Path, count: int):
    return lambda: (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= count


# ---- kill -9 during a save -------------------------------------------------------------------------

@pytest.mark.slow
def test_kill_9_during_saves_leaves_only_verified_checkpoints_and_resume_continues(tmp_path):
    """Real SIGKILLs of the whole process group: one at a random moment of a run that saves every step, one at a
    random moment inside a save (the fault hook pauses in each phase of the save, so the kill lands after the
    weights, after the engine state or before the manifest). Every checkpoint-N left behind verifies, and the
    next run resumes from the newest."""
    out, rng = tmp_path / "o", random.Random(os.getpid())
    newest = 0
    for attempt, pause in enumerate([None, "0.3"]):
        proc = _popen(out, "max_steps=100000", "save_strategy=steps", "save_steps=1", "resume_from_checkpoint="
                      + ("true" if attempt else "false"), env={ckpt.FAULT_SLOW_SAVE_ENV: pause} if pause else None)
        try:
            def saving():
                return any(p.name.startswith(".tmp-checkpoint-") for p in out.glob(".tmp-checkpoint-*")) and \
                    any(int(p.name.split("-")[1]) > newest for p in out.glob("checkpoint-*"))
            _wait_for(saving, proc)
            time.sleep(rng.uniform(0.0, 0.85) if pause else rng.uniform(0.0, 0.2))
            if pause:  # the save of the kill is still in flight
                assert list(out.glob(".tmp-checkpoint-*"))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
        found = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        assert found and all(_verifies(p) for p in found), [p.name for p in found if not _verifies(p)]
        assert int(found[-1].name.split("-")[1]) > newest
        newest = int(found[-1].name.split("-")[1])
    _, log = _cli(out, f"max_steps={newest + 1}", "save_strategy=no", "resume_from_checkpoint=true")
    assert f"checkpoint-{newest}" in log and sorted(_losses(out))[-1] == newest + 1


# ---- truncated and corrupt files -------------------------------------------------------------------

def test_a_truncated_file_is_skipped_for_the_previous_verified_checkpoint_saying_why(tmp_path, caplog):
    straight = train(run_config(tmp_path / "straight", max_steps=4))
    out = tmp_path / "o"
    train(run_config(out, max_steps=4, **SAVING))
    state = out / "checkpoint-4" / "engine_state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    assert ckpt.resolve_resume(out, True) == out / "checkpoint-2"
    assert "skipping checkpoint-4: engine_state.pt is" in caplog.text and "truncated" in caplog.text
    resumed = train(run_config(out, max_steps=4, resume_from_checkpoint=True))
    assert resumed.step_losses == pytest.approx(straight.step_losses[2:], rel=1e-6)
    with pytest.raises(ckpt.CheckpointError, match=r"checkpoint-4 cannot be resumed: engine_state.pt is \d+ bytes"):
        ckpt.resolve_resume(out, str(out / "checkpoint-4"))


def test_a_corrupt_file_is_a_named_error_never_a_traceback(tmp_path):
    out = tmp_path / "o"
    train(run_config(out, max_steps=2, **SAVING))
    weights = out / "checkpoint-2" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100:] = bytes(100)  # same size, other bytes: only the hash sees it
    weights.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match=r"(?s)damaged; nothing was loaded.*model.safetensors: its SHA-256 "
                                                   r"differs.*Fix: resume from an earlier checkpoint"):
        train(run_config(out, max_steps=4, resume_from_checkpoint=True))
    with pytest.raises(ckpt.CheckpointError, match=r"damaged"):  # trust_checkpoint waives the signature only
        train(run_config(out, max_steps=4, resume_from_checkpoint=True, trust_checkpoint=True))
    # Without the manifest (trusted anyway) the loaders themselves name the file: safetensors, torch.load, JSON.
    (out / "checkpoint-2" / "manifest.json").unlink()
    weights.write_bytes(bytes(data[:1000]))
    with pytest.raises(TunesmithError, match=r"model.safetensors is not a readable safetensors file.*truncated"):
        train(run_config(out, max_steps=4, resume_from_checkpoint=True, trust_checkpoint=True))
    (out / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2, "da')
    with pytest.raises(ckpt.CheckpointError, match=r"has no complete checkpoint\n  - checkpoint-2: "
                                                   r"trainer_state.json is corrupt or truncated"):
        ckpt.resolve_resume(out, True)


def test_a_file_added_after_the_save_is_refused(tmp_path):
    """A backend may read any file of its folder (DeepSpeed globs its shards): one the manifest does not list is
    refused, even with trust_checkpoint."""
    out = tmp_path / "o"
    train(run_config(out, max_steps=2, **SAVING))
    torch.save({"x": torch.zeros(1)}, out / "checkpoint-2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    with pytest.raises(ckpt.CheckpointError, match=r"zero_pp_rank_1_mp_rank_00_optim_states.pt: not listed in the "
                                                   r"manifest"):
        train(run_config(out, max_steps=4, resume_from_checkpoint=True, trust_checkpoint=True))


# ---- a planted pickle ------------------------------------------------------------------------------

def test_a_planted_pickle_in_engine_state_never_runs(tmp_path):
    out, marker = tmp_path / "o", tmp_path / "ran"
    train(run_config(out, max_steps=2, **SAVING))
    state = out / "checkpoint-2" / "engine_state.pt"
    torch.save({"optimizer": Payload(marker)}, state)
    with pytest.raises(ckpt.CheckpointError, match=r"engine_state.pt(: its SHA-256 differs| is \d+ bytes, the "
                                                   r"manifest says)"):
        train(run_config(out, max_steps=4, resume_from_checkpoint=str(out / "checkpoint-2")))
    (out / "checkpoint-2" / "manifest.json").unlink()
    with pytest.raises(ckpt.CheckpointError, match=r"(?s)refused: it has no manifest.json.*trust_checkpoint: true"):
        train(run_config(out, max_steps=4, resume_from_checkpoint=str(out / "checkpoint-2")))
    # Even trusted, our own torch.load is weights_only: the payload is refused, not run.
    with pytest.raises(ckpt.CheckpointError, match=r"(?s)engine_state.pt holds pickled objects other than tensors.*"
                                                   r"unsupported GLOBAL posix.system.*nothing in it was run"):
        train(run_config(out, max_steps=4, resume_from_checkpoint=str(out / "checkpoint-2"), trust_checkpoint=True))
    assert not marker.exists()


# ---- unsigned, foreign-signed, tampered --------------------------------------------------------------

def test_an_unsigned_checkpoint_is_refused_and_resumes_with_trust_checkpoint(tmp_path, monkeypatch, _key):
    straight = train(run_config(tmp_path / "straight", max_steps=4))
    out = tmp_path / "o"
    train(run_config(out, max_steps=4, **SAVING))
    chk = out / "checkpoint-2"
    manifest = json.loads((chk / "manifest.json").read_text())

    def refused(pattern):
        with pytest.raises(ckpt.CheckpointError, match=pattern):
            train(run_config(out, max_steps=4, resume_from_checkpoint=str(chk)))

    monkeypatch.setenv(ckpt.KEY_ENV, str(tmp_path / "other.key"))  # another installation's key
    ckpt.ensure_key(tmp_path / "other.key")
    refused(r"refused: it was signed with another key \(id [0-9a-f]{16}; this installation's key .*other.key")
    monkeypatch.setenv(ckpt.KEY_ENV, str(_key))
    (chk / "manifest.json").write_text(json.dumps({**manifest, "step": 3}))  # edited, signature kept
    refused(r"refused: its manifest was changed after it was signed")
    (chk / "manifest.json").unlink()
    refused(r"(?s)refused: it has no manifest.json.*pickle, which can run code.*checkpoint_key_file.*"
            r"trust_checkpoint: true.*model_name_or_path")
    resumed = train(run_config(out, max_steps=4, resume_from_checkpoint=str(chk), trust_checkpoint=True))
    assert resumed.step_losses == pytest.approx(straight.step_losses[2:], rel=1e-6)


def test_a_key_others_can_write_is_refused(tmp_path, _key):
    ckpt.ensure_key(_key)
    _key.chmod(0o666)
    with pytest.raises(ckpt.CheckpointError, match=r"writable by other users.*chmod 600"):
        ckpt.read_key(_key)
    _key.chmod(0o600)
    assert ckpt.read_key(_key) == _key.read_bytes().strip() and len(ckpt.read_key(_key)) == 64


# ---- disk full during a save ------------------------------------------------------------------------

@pytest.mark.parametrize("failing", ["engine state", "manifest", "silently cut"])
def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch, failing):
    """The second save meets a full disk: torch.save writing into /dev/full (ENOSPC), the manifest's write raising
    ENOSPC, or a writer that loses the end of the weights without an error. The error names the save and the
    intact checkpoint; nothing half-written becomes visible."""
    if failing == "engine state" and not Path("/dev/full").is_char_device():
        pytest.skip("no /dev/full")
    out = tmp_path / "o"
    real_save, real_write, real_export = torch.save, ckpt._write_file, ckpt._write_state
    calls = {"n": 0}

    def save(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] != 2:
            return real_save(obj, f, *args, **kwargs)
        with open("/dev/full", "wb") as full:
            return real_save(obj, full, *args, **kwargs)

    def write(path, text):
        if path.name == "manifest.json" and "checkpoint-4" in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_write(path, text)

    def cut(tmp, *args):
        real_export(tmp, *args)
        if tmp.name.endswith("checkpoint-4"):
            weights = tmp / "model.safetensors"
            weights.write_bytes(weights.read_bytes()[:-4096])

    with monkeypatch.context() as patched:
        patched.setattr(*{"engine state": (torch, "save", save), "manifest": (ckpt, "_write_file", write),
                          "silently cut": (ckpt, "_write_state", cut)}[failing])
        with pytest.raises(ckpt.CheckpointError, match=r"saving .*checkpoint-4 failed: (No space left on device|"
                                                       r"the file is cut short).*the earlier checkpoint "
                                                       r"checkpoint-2 is intact. Fix: free space"):
            train(run_config(out, max_steps=6, **SAVING))
    assert [p.name for p in out.glob("*checkpoint-*")] == ["checkpoint-2"] and _verifies(out / "checkpoint-2")
    resumed = train(run_config(out, max_steps=4, resume_from_checkpoint=True))
    assert resumed.global_step == 4 and len(resumed.step_losses) == 2


# ---- SIGTERM to the whole process group ------------------------------------------------------------

@pytest.mark.slow
def test_sigterm_to_the_process_group_with_workers_saves_and_resumes_to_the_same_losses(tmp_path):
    """`timeout`-style preemption: SIGTERM to every process of the group, data-loader workers included. The run
    saves the last finished step and exits 130; the resumed run ends with the uninterrupted run's losses."""
    common = dict(max_steps=150, dataloader_num_workers=2, lr_scheduler_type="cosine")
    straight = train(run_config(tmp_path / "straight", **common))
    out = tmp_path / "o"
    proc = _popen(out, "max_steps=150", "dataloader_num_workers=2", "lr_scheduler_type=cosine", "save_strategy=no")
    _wait_for(_logged_steps(out, 2), proc)
    os.killpg(proc.pid, signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    log = stdout + stderr
    assert proc.returncode == 130, log
    assert "stop requested" in log and "killed by signal" not in log and "Traceback" not in log
    (saved,) = out.glob("checkpoint-*")
    step = int(saved.name.split("-")[1])
    assert 2 <= step < 150 and _verifies(saved) and max(_losses(out)) == step
    _cli(out, "max_steps=150", "dataloader_num_workers=2", "lr_scheduler_type=cosine", "save_strategy=no",
         "resume_from_checkpoint=true")
    losses = _losses(out)
    assert sorted(losses) == list(range(1, 151))
    assert [losses[s] for s in range(1, 151)] == pytest.approx(straight.step_losses, rel=1e-5)


def test_copies_of_a_stop_signal_are_one_request_and_a_later_signal_aborts(monkeypatch):
    """The process group's SIGTERM and torchrun's forwarded copy arrive together: one request. A signal after
    DUPLICATE_S is the user insisting: KeyboardInterrupt."""
    from tunesmith.train import signals

    monkeypatch.setattr(signals, "DUPLICATE_S", 0.3)
    before = signal.getsignal(signal.SIGTERM)
    with signals.StopFlag() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handlers run between bytecodes
        assert stop.requested
        time.sleep(0.3)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    assert signal.getsignal(signal.SIGTERM) == before  # restored


RANKS_ARGS = ["max_steps=30", "per_device_train_batch_size=2", "lr_scheduler_type=cosine", "dataloader_num_workers=2",
              "save_strategy=no"]


@pytest.fixture(scope="module")
def stopped_under_torchrun(tmp_path_factory, tiny_qwen3):
    """Two ranks under torchrun, SIGTERM to the process group after two steps: (output_dir, log, env). The tiny
    model is built first (tiny_qwen3), so the ranks do not both build it."""
    out = tmp_path_factory.mktemp("torchrun") / "o"
    env = {"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2", "MASTER_PORT": str(29000 + os.getpid() % 500),
           ckpt.KEY_ENV: str(out.parent / "checkpoint.key")}
    proc = _popen(out, *RANKS_ARGS, env=env)
    _wait_for(_logged_steps(out, 2), proc)
    os.killpg(proc.pid, signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout + stderr  # the launcher reports a preemption as Ctrl-C does
    return out, stdout + stderr, env


@pytest.mark.slow
def test_sigterm_under_torchrun_every_rank_saves_the_same_step_and_the_resume_is_exact(stopped_under_torchrun,
                                                                                        tmp_path, monkeypatch):
    """torchrun forwards the SIGTERM it gets to its ranks, which got one from the process group already: both
    ranks agree on the step, save one checkpoint collectively (DCP shards, both RNG files), and the two-rank
    resume gives the one-process run's losses (batch 2 x 2 ranks = batch 4)."""
    out, log, env = stopped_under_torchrun
    monkeypatch.setenv(ckpt.KEY_ENV, env[ckpt.KEY_ENV])
    (saved,) = out.glob("checkpoint-*")
    step = int(saved.name.split("-")[1])
    assert log.count(f"stopped at step {step};") == 2 and "killed by signal" not in log, log
    assert _verifies(saved) and (saved / "rng_state_1.json").exists() and (saved / "dcp" / ".metadata").exists()
    straight = train(run_config(tmp_path / "straight", max_steps=30, per_device_train_batch_size=4,
                                lr_scheduler_type="cosine"))
    _cli(out, *RANKS_ARGS, "resume_from_checkpoint=true", env=env)
    losses = _losses(out)
    assert sorted(losses) == list(range(1, 31))
    assert [losses[s] for s in range(1, 31)] == pytest.approx(straight.step_losses, rel=1e-5)


@pytest.mark.slow
def test_a_planted_dcp_metadata_pickle_never_runs(stopped_under_torchrun, tmp_path, monkeypatch):
    """DCP reads .metadata with plain pickle.load: the FSDP2 engine must never reach it unverified."""
    source, _, env = stopped_under_torchrun
    monkeypatch.setenv(ckpt.KEY_ENV, env[ckpt.KEY_ENV])
    out, marker = tmp_path / "o", tmp_path / "ran"
    (saved,) = source.glob("checkpoint-*")
    shutil.copytree(saved, out / saved.name)
    metadata = out / saved.name / "dcp" / ".metadata"
    planted = pickle.dumps(Payload(marker))  # padded to the real size: only the SHA-256 can tell
    metadata.write_bytes(planted + bytes(metadata.stat().st_size - len(planted)))
    code, log = _cli(out, *RANKS_ARGS, "resume_from_checkpoint=true", "trust_checkpoint=true", check=False, env=env)
    # trust_checkpoint waives the signature, never the hashes
    assert code == 1 and "is damaged; nothing was loaded" in log and "dcp/.metadata: its SHA-256 differs" in log
    assert not marker.exists()


# ---- a Hugging Face Trainer / LLaMA-Factory checkpoint-N --------------------------------------------

def _as_hf_trainer(native: Path, dest: Path) -> Path:
    """The files the HF Trainer writes in checkpoint-N, made from one of ours (so the numbers are known)."""
    shutil.copytree(native, dest)
    engine = torch.load(dest / "engine_state.pt", weights_only=True)
    torch.save(engine["optimizer"], dest / "optimizer.pt")
    torch.save(engine["scheduler"], dest / "scheduler.pt")
    ckpt.set_rng_state(json.loads((dest / "rng_state.json").read_text()))
    import numpy as np

    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()},
               dest / "rng_state.pth")
    for name in ("engine_state.pt", "rng_state.json", "manifest.json"):
        (dest / name).unlink()
    step = json.loads((dest / "trainer_state.json").read_text())["global_step"]
    (dest / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 0.25, "log_history": [],
                                                         "best_metric": None, "is_world_process_zero": True}))
    return dest


def test_a_hugging_face_trainer_checkpoint_resumes(tmp_path, caplog):
    straight = train(run_config(tmp_path / "straight", max_steps=4))
    train(run_config(tmp_path / "o", max_steps=4, **SAVING))
    hf = _as_hf_trainer(tmp_path / "o" / "checkpoint-2", tmp_path / "lf" / "checkpoint-2")
    assert ckpt.is_hf_trainer(hf) and ckpt.resolve_resume(tmp_path / "lf", True) == hf
    assert not ckpt.is_hf_trainer(tmp_path / "o")  # a finished run's folder has a trainer_state.json too
    # Untrusted: weights, step and data position; the pickled optimizer is not read, so step 4 differs.
    plain = train(run_config(tmp_path / "a", max_steps=4, resume_from_checkpoint=str(hf)))
    assert plain.global_step == 4 and plain.step_losses[0] == pytest.approx(straight.step_losses[2], rel=1e-6)
    assert plain.step_losses[1] != pytest.approx(straight.step_losses[3], rel=1e-4)
    assert "Hugging Face Trainer checkpoint" in caplog.text and "optimizer starts fresh" in caplog.text
    # Trusted: optimizer.pt and rng_state.pth too (still weights_only): the straight run's numbers.
    trusted = train(run_config(tmp_path / "b", max_steps=4, resume_from_checkpoint=str(hf), trust_checkpoint=True))
    assert trusted.step_losses == pytest.approx(straight.step_losses[2:], rel=1e-6)
    marker = tmp_path / "ran"
    torch.save(Payload(marker), hf / "optimizer.pt")
    with pytest.raises(ckpt.CheckpointError, match=r"optimizer.pt holds pickled objects.*nothing in it was run"):
        train(run_config(tmp_path / "c", max_steps=4, resume_from_checkpoint=str(hf), trust_checkpoint=True))
    assert not marker.exists()


def test_a_save_that_fails_for_another_reason_than_the_disk_does_not_blame_the_disk(tmp_path):
    """A full or read-only disk reaches the save as OSError (or torch's RuntimeError); anything else is a bug in the
    save, said as such with where it happened, not as "free space"."""
    (tmp_path / "checkpoint-2").mkdir()
    try:
        {}["missing"]
    except KeyError as err:
        text = ckpt._save_failure(tmp_path, tmp_path / "checkpoint-4", err)
    assert "KeyError: 'missing'" in text and "test_checkpoint_faults.py:" in text
    assert "not in the disk" in text and "free space" not in text
    disk = ckpt._save_failure(tmp_path, tmp_path / "checkpoint-4", OSError(errno.ENOSPC, "No space left on device"))
    assert "No space left on device" in disk and "Fix: free space in output_dir" in disk
