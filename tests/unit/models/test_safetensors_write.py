"""models/safetensors_write.py: files safetensors reads back unchanged, through transformers' save_pretrained too."""

import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tunesmith.models import safetensors_write
from tunesmith.models.safetensors_write import fast_weight_writes, save_weights, write_safetensors


def _tensors(device="cpu"):
    g = torch.Generator().manual_seed(0)
    out = {"w.f32": torch.randn(37, 53, generator=g), "w.bf16": torch.randn(300, generator=g).bfloat16(),
           "w.f16": torch.randn(3, 5, generator=g).half(), "ids": torch.arange(11), "mask": torch.rand(7) > 0.5,
           "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4), "t.transposed": torch.randn(6, 9, generator=g).t()}
    return {k: v.to(device) for k, v in out.items()}


def _check_file(path, tensors, metadata=None):
    loaded = load_file(path)
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor.cpu()), name
    with safe_open(path, "pt") as f:
        assert f.metadata() == metadata
    length = struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert length % 8 == 0  # data starts aligned, as safetensors lays it out
    json.loads(path.read_bytes()[8:8 + length])


def test_written_file_reads_back_unchanged(tmp_path, monkeypatch):
    monkeypatch.setattr(safetensors_write, "PART_BYTES", 96)  # many parts a tensor
    tensors = _tensors()
    write_safetensors(tensors, tmp_path / "w.safetensors", metadata={"format": "pt"})
    _check_file(tmp_path / "w.safetensors", tensors, {"format": "pt"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_tensors_written_through_pinned_buffers(tmp_path, monkeypatch):
    monkeypatch.setattr(safetensors_write, "PART_BYTES", 1000)
    tensors = _tensors("cuda")
    write_safetensors(tensors, tmp_path / "w.safetensors")
    _check_file(tmp_path / "w.safetensors", tensors)


def test_unknown_dtype_falls_back_to_safetensors(tmp_path):
    tensors = {"c": torch.randn(4, dtype=torch.complex64), "x": torch.randn(3)}
    write_safetensors(tensors, tmp_path / "c.safetensors")
    loaded = load_file(tmp_path / "c.safetensors")
    assert torch.equal(loaded["c"], tensors["c"]) and torch.equal(loaded["x"], tensors["x"])


def test_failed_write_leaves_no_file(tmp_path, monkeypatch):
    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors_write, "_write_parts", broken)
    with pytest.raises(OSError, match="disk full"):
        write_safetensors({"x": torch.randn(3)}, tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


@pytest.mark.parametrize("shard_size", ["2GB", "60KB"])  # one file; several, written side by side
def test_save_pretrained_writes_through_it(tmp_path, monkeypatch, shard_size):
    from transformers import AutoModelForCausalLM

    import transformers.modeling_utils as modeling_utils
    from tunesmith.models.tiny import build_tiny

    original = modeling_utils.safe_save_file  # the seam save_pretrained writes through (a test fails if it moves)
    monkeypatch.setattr(safetensors_write, "SHARD_SIZE", shard_size)
    calls = []
    monkeypatch.setattr(safetensors_write, "write_safetensors",
                        lambda *a, **k: calls.append(a[1]) or write_safetensors(*a, **k))
    model = AutoModelForCausalLM.from_pretrained(build_tiny("qwen3"))
    save_weights(model, tmp_path / "out")
    assert modeling_utils.safe_save_file is original
    assert sorted(calls) == sorted(str(f) for f in (tmp_path / "out").glob("*.safetensors"))
    assert (len(calls) == 1) == (shard_size == "2GB")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    with fast_weight_writes():
        assert modeling_utils.safe_save_file is not original


def test_a_failed_shard_write_fails_the_save(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from tunesmith.models.tiny import build_tiny

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors_write, "write_safetensors", broken)
    with pytest.raises(OSError, match="disk full"):
        save_weights(AutoModelForCausalLM.from_pretrained(build_tiny("qwen3")), tmp_path / "out")
