import torch
from transformers import AutoModelForMultimodalLM

from tunesmith.models.kernels import PatchLinear, linearize_patch_embeds, share_input_casts
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


def test_a_loss_head_returns_the_nll_sum_inside_the_models_forward(tiny_qwen3):
    """The fused-CE path computes its loss in the output layer's forward (so sharded engines gather its
    weight there); with a plain loss in place of Liger's it equals the logits path, gradients included."""
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from tunesmith.data.collate import collate_rows
    from tunesmith.methods.losses import token_nll
    from tunesmith.models.kernels import install_loss_head
    from tunesmith.models.inputs import model_inputs

    torch.manual_seed(0)
    rows = [[{"input_ids": [5, 6, 7, 8], "labels": [-100, 6, 7, 8]}, {"input_ids": [9, 10, 11], "labels": [9, 10, 11]}],
            [{"input_ids": [12, 13], "labels": [-100, 13]}]]
    batch = collate_rows(rows, pad_id=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    expected = token_nll(model(**model_inputs(model, batch)).logits, batch.targets_BT).sum()
    expected.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    def plain_ce(weight, hidden, targets, rows):
        return F.cross_entropy(F.linear(hidden, weight).float(), targets, ignore_index=-100, reduction="sum")

    head = install_loss_head(model.get_output_embeddings(), plain_ce)
    head.loss_targets = batch.targets_BT.reshape(-1)
    got = model(**model_inputs(model, batch)).logits
    head.loss_targets = None
    assert got.ndim == 0 and torch.allclose(got, expected, rtol=1e-5)
    got.backward()
    for name, param in model.named_parameters():
        assert torch.allclose(param.grad, grads[name], atol=1e-6), name
    assert model(**model_inputs(model, batch)).logits.shape[-1] == model.config.vocab_size  # plain forward again


def _casts_and_grads(model, x, shared: bool):
    """The number of fp32 -> bf16 copies in a bf16-autocast forward, the output, and the gradients."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountCasts(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func is torch.ops.aten._to_copy.default and args[0].dtype == torch.float32 \
                    and out.dtype == torch.bfloat16:
                CountCasts.count += 1
            return out

    if shared:
        assert share_input_casts(model) == 4
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16), CountCasts():
        out = model(x)
    out.float().sum().backward()
    return CountCasts.count, out, x.grad, [p.grad for p in model.parameters()]


def test_shared_input_casts_cast_a_shared_input_once_with_the_same_results():
    """q/k/v-style linears reading one fp32 input: one cast instead of three, the same outputs and weight
    gradients; the input's gradient differs only by summing three bf16 gradients in bf16."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(16, 8, bias=False) for _ in range(3))
            self.o = torch.nn.Linear(8, 16, bias=False)

        def forward(self, x):
            h = x * 1.5
            return self.o(self.q(h) * self.k(h) + self.v(h))

    torch.manual_seed(0)
    plain, shared = Block(), Block()
    shared.load_state_dict(plain.state_dict())
    x = torch.randn(4, 16)
    casts_plain, out_plain, gx_plain, gw_plain = _casts_and_grads(plain, x, shared=False)
    casts_shared, out_shared, gx_shared, gw_shared = _casts_and_grads(shared, x, shared=True)
    assert casts_shared == casts_plain - 2
    torch.testing.assert_close(out_shared, out_plain, rtol=0, atol=0)
    for a, b in zip(gw_shared, gw_plain):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(gx_shared, gx_plain, rtol=2**-7, atol=1e-3)


def test_shared_input_casts_do_nothing_without_autocast():
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 4)
    share_input_casts(linear)
    x = torch.randn(2, 4)
    assert linear(x).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x.add_(1.0)  # an input changed in place is cast again
        torch.testing.assert_close(linear(x), torch.nn.functional.linear(x.bfloat16(), linear.weight.bfloat16(),
                                                                         linear.bias.bfloat16()))


def test_shared_input_casts_under_inference_mode():
    """Inference tensors keep no version counter: an fp32 input under autocast and torch.inference_mode is still
    cast once and shared."""
    torch.manual_seed(0)
    linears = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    share_input_casts(linears)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        x = torch.randn(2, 4)
        got = [m(x) for m in linears]
    for m, out in zip(linears, got):
        want = torch.nn.functional.linear(x.bfloat16(), m.weight.bfloat16(), m.bias.bfloat16())
        torch.testing.assert_close(out, want)
