"""quantization_bit at chat / serve: the base loads quantized by bitsandbytes, an adapter stays on top."""

import pytest
import torch

from conftest import run_config
from tunesmith.errors import ConfigError, ModelError
from tunesmith.infer.options import chat_options, export_options

pytest.importorskip("bitsandbytes")


def _problems(parse, **flat) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse({"model_name_or_path": "tiny:qwen3", "quantization_bit": 4, **flat})
    return err.value.problems


def test_chat_takes_llamafactory_s_quantization_keys_and_export_refuses_them():
    options = chat_options({"model_name_or_path": "tiny:qwen3", "quantization_bit": 4, "quantization_method": "bnb",
                            "quantization_type": "fp4", "double_quantization": False,
                            "quantization_device_map": "auto"})
    assert (options.model.quantization_bit, options.model.quantization_type) == (4, "fp4")
    assert any("export merges into the unquantized model" in p
               for p in _problems(export_options, export_dir="/tmp/x"))
    assert any("several adapters" in p for p in _problems(chat_options, adapter_name_or_path="a,b"))
    from tunesmith.serve.vllm_engine import _check_options

    with pytest.raises(ConfigError, match="not available with infer_backend: vllm"):
        _check_options(options, [])


def test_a_lora_run_chats_on_its_base_quantized(tmp_path):
    from bitsandbytes.nn import Linear4bit
    from peft.tuners.lora import LoraLayer

    from tunesmith.serve.hf_engine import HFEngine

    from tunesmith.train.setup import train

    train(run_config(tmp_path / "lora", max_steps=1, finetuning_type="lora"))
    options = chat_options({"model_name_or_path": str(tmp_path / "lora"), "quantization_bit": 4})
    engine = HFEngine.load(options, {})
    layers = [m for m in engine.model.modules() if isinstance(m, LoraLayer)]
    assert layers and all(isinstance(m.get_base_layer(), Linear4bit) for m in layers)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.isfinite(engine.model(input_ids=ids).logits).all()
    with pytest.raises(ModelError, match="cannot take merged adapters"):
        HFEngine.load(options, {"other": str(tmp_path / "lora")})


def test_lora_modules_serve_on_a_quantized_base_and_a_pissa_adapter_is_refused(tmp_path):
    from tunesmith.infer.options import serve_options
    from tunesmith.serve.hf_engine import HFEngine
    from tunesmith.train.setup import train

    train(run_config(tmp_path / "lora", max_steps=1, finetuning_type="lora"))
    engine = HFEngine.load(serve_options({"model_name_or_path": "tiny:qwen3", "quantization_bit": 4}),
                           {"mine": str(tmp_path / "lora")})
    assert "mine" in engine.models
    train(run_config(tmp_path / "pissa", max_steps=1, finetuning_type="lora", pissa_init=True, pissa_iter=2))
    with pytest.raises(ModelError, match="is a PiSSA adapter.*pissa_converted"):
        HFEngine.load(chat_options({"model_name_or_path": str(tmp_path / "pissa"), "quantization_bit": 4}), {})
