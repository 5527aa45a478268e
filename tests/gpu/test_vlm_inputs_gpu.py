"""GPU: what feeds a vision-language step. A Qwen-VL vision tower's attention as one variable-length FlashAttention
call over every image (models/attention.vision_varlen_attention) gives SDPA-per-image's outputs and gradients in
bf16, and the tiny Qwen3-VL tower's features under it match transformers' own SDPA path; collated batches are
pinned for an asynchronous copy.

    python -m pytest -q -s tests/gpu/test_vlm_inputs_gpu.py      # on the device machine
"""

import pytest
import torch

from conftest import tensors_of
from tunesmith.models.attention import _attention_per_segment, use_varlen_in_vision_tower, vision_varlen_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_flash_over_all_images_matches_sdpa_per_image():
    gen = torch.Generator(device="cuda").manual_seed(0)
    lengths = [1024, 576, 2304, 64]  # patches of four images of different sizes
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    q, k, v = (torch.randn(1, 16, sum(lengths), 64, device="cuda", generator=gen, dtype=torch.bfloat16)
               .requires_grad_() for _ in range(3))
    grads = []
    for attend in (lambda: vision_varlen_attention(None, q, k, v, cu_seq_lens_q=cu, scaling=0.125)[0],
                   lambda: _attention_per_segment(*(t[0].transpose(0, 1) for t in (q, k, v)), cu, 0.125)):
        q.grad = k.grad = v.grad = None
        out = attend()
        out.float().square().sum().backward()
        grads.append((out.detach().float(), *(t.grad.float() for t in (q, k, v))))
    for ours, theirs in zip(*grads):
        torch.testing.assert_close(ours, theirs, rtol=2e-2, atol=2e-2)


def test_fp32_outside_autocast_stays_fp32_sdpa_per_image():
    """A rollout's `generate` runs the fp32 master weights without autocast: the tower's projection after the
    attention takes fp32, so the attention may not hand it FlashAttention's bf16."""
    cu = torch.tensor([0, 100, 164], device="cuda", dtype=torch.int32)
    q, k, v = (torch.randn(1, 4, 164, 64, device="cuda") for _ in range(3))
    out = vision_varlen_attention(None, q, k, v, cu_seq_lens_q=cu, scaling=0.125)[0]
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, _attention_per_segment(*(t[0].transpose(0, 1) for t in (q, k, v)), cu, 0.125))


def test_the_tiny_qwen3_vl_towers_features_match_transformers_sdpa():
    from tunesmith.config.load import build_config
    from tunesmith.models.load import auto_model_class, load_config

    config = load_config(build_config(None, {"dataset": "identity", "model_name_or_path": "tiny:qwen3_vl"}).model)
    torch.manual_seed(0)
    model = auto_model_class(config).from_config(config, attn_implementation="sdpa").cuda().eval()
    vision = model.model.visual.config
    grids = torch.tensor([[1, 8, 8], [1, 4, 12], [2, 4, 4]], device="cuda")
    pixels = torch.randn(int(grids.prod(-1).sum()), vision.in_channels * vision.temporal_patch_size
                         * vision.patch_size ** 2, device="cuda")
    with torch.no_grad():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            stock = model.model.get_image_features(pixels, grids)
        stock_fp32 = model.model.get_image_features(pixels, grids)  # as a rollout's generate runs it
        use_varlen_in_vision_tower(model.model.visual)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ours = model.model.get_image_features(pixels, grids)
        ours_fp32 = model.model.get_image_features(pixels, grids)
    for mine, theirs, tolerance in ((ours, stock, 3e-2), (ours_fp32, stock_fp32, 1e-5)):
        mine, theirs = tensors_of(mine), tensors_of(theirs)
        assert len(mine) == len(theirs) > 0
        for a, b in zip(mine, theirs):
            torch.testing.assert_close(a.float(), b.float(), rtol=tolerance, atol=tolerance)


def test_a_collated_batch_is_pinned_for_an_asynchronous_copy():
    from tunesmith.data.collate import collate_rows

    batch = collate_rows([[{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}]], pad_id=0)
    batch.media = {"pixel_values": torch.randn(4, 8)}
    pinned = batch.pin_memory()
    assert pinned.input_ids_BT.is_pinned() and pinned.media["pixel_values"].is_pinned()
    assert torch.equal(pinned.to("cuda").input_ids_BT.cpu(), batch.input_ids_BT)
