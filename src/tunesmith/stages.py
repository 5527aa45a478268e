"""The one list of stages: stage name -> method, data kind, step source, preset.

Config validation, `tunesmith train --help`, `tunesmith data`, `estimate` and the
Runner read this table; no other module spells the stages out. It imports nothing
heavy (methods are named by import path and loaded when a run needs them), so
config/ and data/ may read it.

To add a stage: write its method in methods/<name>.py (a loss of the model's
outputs and the batch), pick a data kind (or add a renderer/collator for a new
one in data/), and add one entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Literal

# What data/ produces for a stage: plain text (every token a label), conversations with a supervised
# final response, chosen/rejected pairs, unpaired examples with a desirable tag, or prompts to roll out.
DataKind = Literal["text", "conversations", "pairs", "unpaired", "prompts"]


@dataclass(frozen=True)
class Stage:
    name: str
    summary: str
    data_kind: DataKind
    method: str  # "module:Class" under tunesmith.methods
    steps: Literal["sequence", "rollout"]
    # Settings the named algorithm implies unless the YAML sets them (online RL presets).
    preset: dict = field(default_factory=dict)
    reward_head: bool = False  # the model is a sequence classifier with one output (a reward model)
    # The method keys (FinetuneConfig) this stage's loss reads; config/load.py warns when another stage's are given.
    method_keys: tuple[str, ...] = ()
    # What plot_loss draws besides loss and eval_loss (LLaMA-Factory's choice for the stage).
    plot_metrics: tuple[str, ...] = ()

    def build_method(self, cfg):
        module, _, name = self.method.partition(":")
        return getattr(importlib.import_module(f"tunesmith.methods.{module}"), name)(cfg)

    @property
    def scores_whole_sequences(self) -> bool:
        """Pairs and unpaired examples are compared per sequence: never packed."""
        return self.data_kind in ("pairs", "unpaired")

    @property
    def reads_token_nll(self) -> bool:
        """The loss is each token's NLL (sft, pt), which the fused linear + cross-entropy head computes without the
        logits; the other stages read the logits."""
        return self.method == "sft:SFTMethod"

    @property
    def is_online_rl(self) -> bool:
        return self.steps == "rollout"

    def updates_per_step(self, cfg) -> int:
        """Optimiser steps in one Runner step: ppo_epochs x num_mini_batches for online RL, else 1."""
        return cfg.rl.ppo_epochs * cfg.rl.num_mini_batches if self.is_online_rl else 1


def _rl(name: str, summary: str, **preset) -> Stage:
    return Stage(name, summary, "prompts", "grpo:GRPOMethod", "rollout", preset, plot_metrics=("reward_mean",))


_TOKEN_LOSS_KEYS = ("use_dft_loss", "use_eaft_loss", "eaft_alpha", "use_asft_loss", "asft_alpha",
                    "compute_accuracy")  # sft:SFTMethod's

_ALL = [
    Stage("pt", "continued pretraining on plain text", "text", "sft:SFTMethod", "sequence",
          method_keys=_TOKEN_LOSS_KEYS),
    Stage("sft", "supervised fine-tuning on conversations", "conversations", "sft:SFTMethod", "sequence",
          method_keys=_TOKEN_LOSS_KEYS),
    Stage("rm", "reward model (Bradley-Terry on chosen/rejected pairs)", "pairs", "rm:RewardModelMethod", "sequence",
          reward_head=True, method_keys=("reward_center_coef",), plot_metrics=("eval_accuracy",)),
    Stage("dpo", "preference optimisation (see pref_loss)", "pairs", "dpo:DPOMethod", "sequence",
          method_keys=("pref_beta", "pref_loss", "pref_ftx", "pref_label_smoothing", "simpo_gamma"),
          plot_metrics=("rewards/accuracies",)),
    Stage("kto", "Kahneman-Tversky optimisation on unpaired examples", "unpaired", "kto:KTOMethod", "sequence",
          method_keys=("pref_beta", "kto_chosen_weight", "kto_rejected_weight"), plot_metrics=("rewards/chosen",)),
    _rl("grpo", "online RL, group-relative advantages"),
    _rl("dr_grpo", "online RL, GRPO done right (no std, no length bias)",
        advantage="dr_grpo", loss_agg_mode="seq-mean-token-sum-norm"),
    _rl("dapo", "online RL, clip-higher and dynamic sampling",
        clip_ratio_high=0.28, dynamic_sampling=True, loss_agg_mode="token-mean"),
    _rl("gspo", "online RL, sequence-level importance ratio",
        policy_loss="gspo", clip_ratio_low=3e-4, clip_ratio_high=4e-4, loss_agg_mode="seq-mean-token-mean"),
    _rl("gspo_token", "online RL, GSPO with token-level advantages",
        policy_loss="gspo_token", clip_ratio_low=3e-4, clip_ratio_high=4e-4, loss_agg_mode="seq-mean-token-mean"),
    _rl("reinforce", "online RL, on-policy REINFORCE",
        advantage="reinforce", policy_loss="reinforce", loss_agg_mode="token-mean", ppo_epochs=1,
        num_mini_batches=1, kl_coef=0.0),
]

STAGES: dict[str, Stage] = {stage.name: stage for stage in _ALL}
STAGE_NAMES: tuple[str, ...] = tuple(STAGES)
ONLINE_RL_STAGES: tuple[str, ...] = tuple(s.name for s in _ALL if s.is_online_rl)


def get_stage(name: str) -> Stage:
    if name not in STAGES:
        raise KeyError(f"unknown stage '{name}'; stages: {', '.join(STAGE_NAMES)}")
    return STAGES[name]


def uses_asft(cfg) -> bool:
    """use_asft_loss on a stage whose loss reads it (sft, pt); elsewhere the key is another stage's and idle."""
    return STAGES[cfg.finetune.stage].reads_token_nll and cfg.finetune.use_asft_loss


def uses_reference(cfg) -> bool:
    """Whether the run's loss compares the policy with a reference policy."""
    ft, stage = cfg.finetune, STAGES[cfg.finetune.stage]
    if stage.is_online_rl:
        return cfg.rl.kl_coef > 0
    if ft.stage == "kto" or uses_asft(cfg):
        return True
    return ft.stage == "dpo" and ft.pref_loss not in ("orpo", "simpo")
