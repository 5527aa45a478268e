"""models/half_load.py: a bf16 checkpoint loaded as stored and upcast equals the fp32 load, parameters and buffers."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tunesmith.config.schema import ModelConfig
from tunesmith.models.half_load import checkpoint_half_dtype
from tunesmith.models.load import auto_model_class, load_config, load_model
from tunesmith.models.tiny import build_tiny


def _half_copy(arch: str, folder, dtype=torch.bfloat16):
    shutil.copytree(build_tiny(arch), folder)
    weights = load_file(folder / "model.safetensors")
    save_file({k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()},
              folder / "model.safetensors", metadata={"format": "pt"})
    return folder


# gemma3n and phi4_multimodal compute buffers in half under a half build (embed scales, audio statistics)
@pytest.mark.parametrize("arch", ["qwen3", "gemma3n", "phi4_multimodal", "qwen3_vl"])
def test_upcast_half_load_equals_the_fp32_load(tmp_path, arch):
    folder = _half_copy(arch, tmp_path / arch)
    assert checkpoint_half_dtype(folder) == torch.bfloat16
    cfg = ModelConfig(model_name_or_path=str(folder))
    ours = load_model(cfg, torch.device("cpu"))
    reference = auto_model_class(load_config(cfg)).from_pretrained(folder, dtype=torch.float32)
    expected = {**dict(reference.named_parameters()), **dict(reference.named_buffers())}
    got = {**dict(ours.named_parameters()), **dict(ours.named_buffers())}
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_only_a_checkpoint_wholly_in_one_half_dtype_qualifies(tmp_path):
    assert checkpoint_half_dtype(build_tiny("qwen3")) is None  # stored in fp32
    assert checkpoint_half_dtype(_half_copy("qwen3", tmp_path / "fp16", torch.float16)) == torch.float16
    assert checkpoint_half_dtype(tmp_path / "missing") is None
    assert checkpoint_half_dtype("Qwen/Qwen3-1.7B") is None  # not a local folder: loaded the usual way
