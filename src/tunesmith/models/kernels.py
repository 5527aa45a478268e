"""Fused kernels. The fused linear + cross-entropy (models/linear_ce.py) computes the
token-NLL sum from the last hidden states in chunks, never materialising the
[tokens x vocab] logits (the largest activation of a small-model SFT step).

The loss runs inside the output layer's own forward, within the model's forward:
sharding engines gather that layer's weight for exactly that call (FSDP2's root
group, ZeRO-3's per-module hooks), so one code path serves every backend.
"""

from __future__ import annotations

import torch


def install_fused_ce(model) -> None:
    """The chunked linear + cross-entropy on the output layer; `models.forward` uses it for "nll" outputs.
    (It replaces Liger's kernel of the same purpose: same result, several times faster at a large vocabulary,
    see linear_ce.py.)"""
    from .linear_ce import ChunkedLinearCrossEntropy

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    install_loss_head(base.get_output_embeddings(), ChunkedLinearCrossEntropy())


def install_loss_head(head: torch.nn.Module, loss) -> torch.nn.Module:
    """Let the output layer return loss(weight, hidden [N, H], targets [N], rows) instead of logits while
    `head.loss_targets` is set; `head.loss_rows`: the indices of the counted targets when the collator found them
    (else None). Parameters and their names are unchanged (checkpoints load as before)."""
    plain_forward = head.forward
    head.loss_targets = head.loss_rows = None

    def forward(hidden):
        if head.loss_targets is None:
            return plain_forward(hidden)
        return loss(head.weight, hidden.reshape(-1, hidden.shape[-1]), head.loss_targets, head.loss_rows).float()

    head.forward = forward
    return head


class PatchLinear(torch.nn.Module):
    """A Conv3d whose kernel equals its stride, applied to inputs of exactly one kernel each, is a
    linear layer over the flattened patch. Recent PyTorch runs the Qwen-VL Conv3d patch embedding
    very slowly (cuDNN 3-D conv), the matmul runs at full speed. Same parameter names and shapes
    as the Conv3d, so checkpoints are unchanged."""

    def __init__(self, conv: torch.nn.Conv3d):
        super().__init__()
        self.weight = conv.weight
        self.bias = conv.bias
        self.kernel_size = conv.kernel_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.linear(x.reshape(x.shape[0], -1), self.weight.reshape(self.weight.shape[0], -1),
                                         self.bias)
        return out.view(x.shape[0], -1, 1, 1, 1)


def linearize_patch_embeds(model) -> int:
    """Swap every patch-embedding Conv3d (kernel == stride, no padding) for PatchLinear; returns how many."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (isinstance(child, torch.nn.Conv3d) and child.kernel_size == child.stride
                    and child.padding == (0, 0, 0) and child.groups == 1):
                setattr(parent, name, PatchLinear(child))
                swapped += 1
    return swapped


def tensor_version(x: torch.Tensor) -> int | None:
    """x's in-place version counter; None for an inference tensor (torch.inference_mode), which keeps none."""
    return None if x.is_inference() else x._version


class _SharedInputCast:
    """Under autocast, every linear layer casts its fp32 input to the compute dtype itself, so q/k/v (and gate/up)
    each copy the same normed hidden states, and their backward converts three gradients to fp32 and adds them.
    This forward pre-hook casts an input once for all the linears that read it in a row (the last input and its
    cast are kept, by identity) and hands them the cast: the same matmuls on the same values; the gradients of
    the shared cast are summed in the compute dtype before one conversion back."""

    def __init__(self):
        self.source: torch.Tensor | None = None
        self.version = -1
        self.cast: torch.Tensor | None = None

    def __call__(self, module, args):
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or not torch.is_autocast_enabled(x.device.type):
            return None
        if x is not self.source or tensor_version(x) != self.version:
            self.source, self.version = x, tensor_version(x)
            self.cast = x.to(torch.get_autocast_dtype(x.device.type))
        return (self.cast, *args[1:])


def share_input_casts(model) -> int:
    """Install _SharedInputCast on every torch.nn.Linear of `model` (one shared cache); returns how many."""
    hook = _SharedInputCast()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for linear in linears:
        linear.register_forward_pre_hook(hook)
    return len(linears)
