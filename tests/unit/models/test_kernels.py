import torch
from transformers import AutoModelForMultimodalLM

from tunesmith.models.kernels import PatchLinear, linearize_patch_embeds
from tunesmith.models.tiny import build_tiny


def test_patch_linear_equals_the_conv3d():
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4), bias=False)
    x = torch.randn(5, 3, 2, 4, 4)
    torch.testing.assert_close(PatchLinear(conv)(x), conv(x), rtol=1e-5, atol=1e-5)


def test_vlm_vision_tower_unchanged_after_swap():
    model = AutoModelForMultimodalLM.from_pretrained(build_tiny("qwen2_5_vl")).eval()
    keys = set(model.state_dict())
    grid = torch.tensor([[1, 4, 6]])
    pixels = torch.randn(24, 3 * 2 * 14 * 14)
    with torch.no_grad():
        before = model.model.visual(pixels, grid_thw=grid).pooler_output
        assert linearize_patch_embeds(model) == 1
        after = model.model.visual(pixels, grid_thw=grid).pooler_output
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    assert set(model.state_dict()) == keys
