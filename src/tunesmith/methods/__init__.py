"""Training methods (stages). `build_method` picks the one a RunConfig asks for."""

from __future__ import annotations


def build_method(cfg, model, fused_ce=None):
    stage = cfg.finetune.stage
    if stage in ("pt", "sft"):
        from .sft import SFTMethod

        return SFTMethod(stage, fused_ce)
    if stage == "rm":
        from .rm import RewardModelMethod

        return RewardModelMethod(cfg.finetune)
    if stage == "dpo":
        from .dpo import DPOMethod

        return DPOMethod(cfg, model)
    if stage == "kto":
        from .kto import KTOMethod

        return KTOMethod(cfg, model)
    raise ValueError(f"unknown stage {stage}")
