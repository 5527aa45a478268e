"""A Qwen-VL vision tower under the varlen attention: one variable-length attention call a layer over every image
of the forward (models/attention.vision_varlen_attention), the same features as transformers' SDPA per image."""

import pytest
import torch

from conftest import tensors_of
from tunesmith.models.attention import VISION_VARLEN, _longest, use_varlen_in_vision_tower, vision_varlen_attention
from tunesmith.models.load import auto_model_class, load_config
from tunesmith.config.load import build_config


def _tiny(name):
    cfg = build_config(None, {"dataset": "identity", "model_name_or_path": f"tiny:{name}"}).model
    config = load_config(cfg)
    torch.manual_seed(0)
    return auto_model_class(config).from_config(config, attn_implementation="sdpa").eval()



@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_the_towers_features_are_those_of_sdpa_per_image(name, monkeypatch):
    from tunesmith.models import attention

    calls = []
    per_segment = attention._attention_per_segment
    monkeypatch.setattr(attention, "_attention_per_segment", lambda *a: calls.append(a[3]) or per_segment(*a))
    model = _tiny(name)
    vision = model.model.visual.config
    grids = torch.tensor([[1, 4, 4], [1, 2, 6], [2, 2, 2]])  # three images (the last a two-frame clip)
    width = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
    pixels = torch.randn(int(grids.prod(-1).sum()), width)
    with torch.no_grad():
        stock = tensors_of(model.model.get_image_features(pixels, grids))
        use_varlen_in_vision_tower(model.model.visual)
        assert model.model.visual.config._attn_implementation == VISION_VARLEN
        ours = tensors_of(model.model.get_image_features(pixels, grids))
    assert len(calls) == vision.depth  # one call a layer, given every image's boundaries
    assert calls[0].tolist()[-1] == len(pixels)
    assert len(ours) == len(stock) > 0
    for a, b in zip(ours, stock):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_longest_image_is_read_once_per_forward():
    cu = torch.tensor([0, 16, 28, 36], dtype=torch.int32)
    assert _longest(cu, None) == 16 and _longest(cu, torch.tensor(16)) == 16
    assert _longest(cu, 40) == 40  # transformers >= 5.2x hands it over as an int
    other = torch.tensor([0, 5], dtype=torch.int32)
    assert _longest(other, None) == 5


def test_without_boundaries_it_refuses():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        vision_varlen_attention(None, q, q, q)
