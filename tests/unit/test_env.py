"""`tunesmith env` says what is really usable, and how to get what is missing."""

import pytest

from tunesmith import env


def _collect(monkeypatch, installed: set[str]) -> dict:
    monkeypatch.setattr(env, "_importable", lambda module: module in installed)
    monkeypatch.setattr(env, "_version", lambda dist: "1.2.3" if dist in env.CORE else
                        ("9.9" if env.OPTIONAL.get(dist) and (env.OPTIONAL[dist].module or dist) in installed
                         else None))
    return env.collect()


@pytest.mark.parametrize("dist", ["deepspeed", "liger-kernel", "flash-attn", "flash-attn-4", "vllm", "wandb",
                                  "swanlab", "math-verify", "av"])
def test_every_optional_feature_is_reported(monkeypatch, dist):
    module = env.OPTIONAL[dist].module or dist
    assert _collect(monkeypatch, {module})[dist].startswith("9.9 -> ")
    missing = _collect(monkeypatch, set())[dist]
    assert missing.startswith(f"not installed ({env.OPTIONAL[dist].install})")


def test_deepspeed_is_an_engine_that_exists(monkeypatch):
    line = _collect(monkeypatch, {"deepspeed"})["deepspeed"]
    assert line == "9.9 -> backend: deepspeed (ZeRO stages 0-3, CPU offload)"
    assert _collect(monkeypatch, set())["deepspeed"].startswith("not installed (pip install 'tunesmith[deepspeed]')")


def test_nothing_claims_a_missing_feature_of_tunesmith_is_available(monkeypatch):
    info = _collect(monkeypatch, {spec.module or dist for dist, spec in env.OPTIONAL.items()})
    assert "not available yet" not in " ".join(info.values())
    assert "infer_backend: vllm" in info["vllm"] and "serve" in info["vllm"]
    assert "backend: megatron" in info["megatron-core"] and "0.19.2" in info["megatron-core"]


def test_the_real_environment_reports_deepspeed_correctly():
    import importlib.util

    line = env.collect()["deepspeed"]
    if importlib.util.find_spec("deepspeed") is not None:
        assert "-> backend: deepspeed" in line and "not available" not in line
    else:
        assert line.startswith("not installed (pip install 'tunesmith[deepspeed]')")


@pytest.mark.parametrize("has_vllm,device,picked", [(True, "cuda", "auto -> vllm"), (False, "cuda", "auto -> hf"),
                                                    (True, "cpu", "auto -> hf"), (False, "cpu", "auto -> hf")])
def test_env_says_which_rollout_backend_auto_picks(has_vllm, device, picked):
    line = env.auto_rollout_line(has_vllm, device)
    assert line.startswith(picked)
    if picked.endswith("hf"):
        assert ("vllm not installed" in line) == (not has_vllm) and ("no CUDA GPU" in line) == (device == "cpu")


def test_flash_attn_2s_cute_folder_is_not_taken_for_flash_attn_4(monkeypatch):
    """flash-attn 2 ships a flash_attn/cute folder too: flash-attn-4 counts as installed by its distribution."""
    assert _collect(monkeypatch, {"flash_attn_2_cuda", "flash_attn.cute"})["flash-attn-4"].startswith("not installed")
