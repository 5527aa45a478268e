"""GRPO-family advantage estimators: pure tensor functions, registered by name.

Shapes are suffixed: G group size, N sequences (= prompts × G), T tokens.

Every estimator has the signature

    fn(rewards_N, group_ids_N, *, eps=1e-6, **kw) -> advantages_N

and returns one fp32 advantage per *sequence* (the caller broadcasts it over the
sequence's tokens). ``group_ids_N`` holds any integer label per sequence; sequences
with the same label form one group (the G completions of one prompt). Groups need not
be contiguous nor of equal size. Advantages are constants: the result is detached.

A group whose rewards are all equal (including a group of one) gets advantage exactly 0,
never NaN, from every estimator. Under data parallelism the caller gathers whole groups
onto one rank (or gathers all rewards) before calling.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

ADVANTAGES: dict[str, Callable] = {}


def register_advantage(name: str):
    """Register ``fn`` in ``ADVANTAGES`` under ``name``."""

    def wrap(fn):
        ADVANTAGES[name] = fn
        return fn

    return wrap


class GroupStats(NamedTuple):
    """Per-sequence view of its group's statistics (all shape N, fp32 / bool)."""

    rewards: torch.Tensor  # fp32 rewards, detached
    mean: torch.Tensor  # group mean
    std: torch.Tensor  # group unbiased std (ddof 1); 0 for a group of one
    count: torch.Tensor  # group size, as fp32
    zero_variance: torch.Tensor  # True where every reward of the group is equal


def group_stats(rewards_N: torch.Tensor, group_ids_N: torch.Tensor) -> GroupStats:
    """Group mean, unbiased std, size and zero-variance flag, gathered back to each sequence.

    mean_g = Σ_{i∈g} r_i / n_g;  std_g = sqrt(Σ_{i∈g} (r_i − mean_g)² / (n_g − 1)), 0 if n_g = 1;
    zero_variance_g = (max_{i∈g} r_i == min_{i∈g} r_i) — an exact test, so rounding in the
    mean never turns an all-equal group into tiny non-zero advantages.
    """
    r = torch.as_tensor(rewards_N).detach().to(torch.float32).reshape(-1)
    gid = torch.as_tensor(group_ids_N, device=r.device).reshape(-1)
    if gid.shape != r.shape:
        raise ValueError(f"rewards_N has {r.numel()} entries but group_ids_N has {gid.numel()}")
    if r.numel() == 0:
        empty = r.new_zeros(0)
        return GroupStats(r, empty, empty, empty, torch.zeros(0, dtype=torch.bool, device=r.device))
    _, inv = torch.unique(gid, return_inverse=True)
    num_groups = int(inv.max().item()) + 1
    count = r.new_zeros(num_groups).index_add_(0, inv, torch.ones_like(r))
    mean = r.new_zeros(num_groups).index_add_(0, inv, r) / count
    centred = r - mean[inv]
    sq = r.new_zeros(num_groups).index_add_(0, inv, centred * centred)
    std = torch.where(count > 1, sq / (count - 1).clamp(min=1.0), torch.zeros_like(sq)).sqrt()
    rmax = r.new_full((num_groups,), float("-inf")).scatter_reduce(0, inv, r, reduce="amax", include_self=False)
    rmin = r.new_full((num_groups,), float("inf")).scatter_reduce(0, inv, r, reduce="amin", include_self=False)
    zero_var = rmax == rmin
    return GroupStats(r, mean[inv], std[inv], count[inv], zero_var[inv])


def zero_variance_groups(rewards_N: torch.Tensor, group_ids_N: torch.Tensor) -> torch.Tensor:
    """Bool mask, shape N: True where the sequence's group has all-equal rewards.

    Such a group carries no learning signal (every estimator gives it advantage 0);
    DAPO's dynamic sampling drops these sequences (``keep = ~zero_variance_groups(...)``)
    and refills the batch. A group of one counts as zero-variance.
    """
    return group_stats(rewards_N, group_ids_N).zero_variance


def clip_advantages(advantages: torch.Tensor, limit: float | None) -> torch.Tensor:
    """Clamp advantages to [−limit, limit] (``limit`` None: unchanged). Any shape."""
    if limit is None:
        return advantages
    if limit <= 0:
        raise ValueError(f"clip_advantages needs limit > 0, got {limit}")
    return advantages.clamp(min=-limit, max=limit)


def _zero_where_flat(adv_N: torch.Tensor, st: GroupStats) -> torch.Tensor:
    return torch.where(st.zero_variance, torch.zeros_like(adv_N), adv_N)


def _group_normalised(rewards_N, group_ids_N, eps):
    st = group_stats(rewards_N, group_ids_N)
    adv = (st.rewards - st.mean) / (st.std + eps)
    return _zero_where_flat(adv, st)


@register_advantage("grpo")
def grpo(rewards_N: torch.Tensor, group_ids_N: torch.Tensor, *, eps: float = 1e-6, **kw) -> torch.Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath): A_i = (r_i − mean_g) / (std_g + eps).

    std_g is the unbiased (ddof 1) group std. All-equal groups, and groups of one, get 0.
    Example: one group with rewards [1, 1, 0, 0]: mean 0.5, std sqrt(1/3) → ±0.866025.
    """
    return _group_normalised(rewards_N, group_ids_N, eps)


@register_advantage("dr_grpo")
def dr_grpo(rewards_N: torch.Tensor, group_ids_N: torch.Tensor, *, eps: float = 1e-6, **kw) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025): A_i = r_i − mean_g, no division by the std (``eps`` unused).

    Pair it with ``aggregate(..., "seq-mean-token-sum-norm")`` for the paper's unbiased loss.
    """
    st = group_stats(rewards_N, group_ids_N)
    return _zero_where_flat(st.rewards - st.mean, st)


@register_advantage("rloo")
def rloo(rewards_N: torch.Tensor, group_ids_N: torch.Tensor, *, eps: float = 1e-6, **kw) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): A_i = r_i − mean_{j∈g, j≠i} r_j (leave-one-out baseline).

    Computed as n_g/(n_g − 1)·(r_i − mean_g); a group of one gets 0 (``eps`` unused).
    """
    st = group_stats(rewards_N, group_ids_N)
    scale = torch.where(st.count > 1, st.count / (st.count - 1).clamp(min=1.0), torch.zeros_like(st.count))
    return _zero_where_flat(scale * (st.rewards - st.mean), st)


@register_advantage("reinforce")
def reinforce(rewards_N: torch.Tensor, group_ids_N: torch.Tensor, *, eps: float = 1e-6, **kw) -> torch.Tensor:
    """REINFORCE in the Nemotron-Cascade form: group-normalised, A_i = (r_i − mean_g) / (std_g + eps).

    Same numbers as ``grpo``; the difference is how it is used. This estimator is used
    strictly on-policy (one optimiser step per rollout batch, so no importance ratio and
    no clipping: pair it with the ``reinforce`` policy loss, −A·logp), without a KL
    penalty or KL loss, and with the loss normalised by all generated tokens of the step
    (``aggregate(..., "token-mean", normaliser=<valid tokens of the whole step>)``).
    """
    return _group_normalised(rewards_N, group_ids_N, eps)
