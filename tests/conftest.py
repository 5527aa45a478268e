"""Shared fixtures. The tiny models are built once per test session into a temp cache."""

from pathlib import Path

import pytest

from tunesmith.models.tiny import build_tiny


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tunesmith_cache")


@pytest.fixture(scope="session")
def tiny_qwen3(tiny_cache) -> Path:
    return build_tiny("qwen3", tiny_cache)


@pytest.fixture(scope="session")
def tiny_llama(tiny_cache) -> Path:
    return build_tiny("llama", tiny_cache)


REPO = Path(__file__).resolve().parents[1]
DATA_DIR = REPO / "data"


def load_script(name: str):
    """scripts/<name>.py as a module (the demo-data generators are scripts, not package modules)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tiny_cache):
    """Runs never touch ~/.cache: tiny models and tokenized data go to the session temp dir."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TUNESMITH_CACHE", str(tiny_cache))
    mp.setenv("TUNESMITH_CHECKPOINT_KEY_FILE", str(tiny_cache / "checkpoint.key"))  # not the user's own key
    mp.setenv("HF_HUB_OFFLINE", "1")
    yield
    mp.undo()


def run_config(output_dir, **overrides):
    """A RunConfig for a short CPU run on the shipped demo data."""
    from tunesmith.config.load import build_config

    base = {
        "model_name_or_path": "tiny:qwen3",
        "dataset": "alpaca_demo",
        "dataset_dir": str(DATA_DIR),
        "template": "chatml",
        "cutoff_len": 128,
        "max_samples": 64,
        "finetuning_type": "full",
        "learning_rate": 1e-3,
        "max_steps": 4,
        "logging_steps": 1,
        "save_strategy": "no",
        "output_dir": str(output_dir),
    }
    base.update(overrides)
    return build_config(None, base)
