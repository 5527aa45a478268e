"""Per-family facts about vision/audio-language models: the one place that knows them.

A `Family` names the parts of a multimodal model as they appear in
`model.named_modules()` of the transformers (5.x) implementation — the vision
tower, the projector that maps its features into the language model, the audio
encoder, the language model itself — plus the placeholder tokens the family's
processor expands and whether its language model uses mRoPE (3-D positions, so
packing must carry per-sample (3, seq) position ids). Freezing
(`freeze_vision_tower`, `freeze_multi_modal_projector`,
`freeze_language_model`), LoRA target selection and tensor-parallel plans ask
this module instead of spelling module names themselves.

Module paths are dotted prefixes such as "model.visual". A parameter belongs to
the group of the longest path that contains it on dot boundaries, so the
projector (inside the vision tower for Qwen-VL: "model.visual.merger") wins over
the vision tower, and wrapped models (PEFT's "base_model.model.") still match.
"""

from __future__ import annotations

from dataclasses import dataclass

GROUPS = ("vision_tower", "projector", "language_model", "audio_tower")


@dataclass(frozen=True)
class Family:
    """What tunesmith needs to know about one multimodal model family.

    name: the family's key in FAMILIES.
    model_types: the `config.model_type` values that belong to it.
    vision_tower / projector / language_model / audio_tower: module paths as in
        `model.named_modules()`; empty when the family has no such part.
    image_token / video_token / audio_token: the placeholder the chat template
        writes and the processor repeats once per media embedding; None when the
        family has no such modality.
    uses_mrope: the language model takes (3, batch, seq) position ids (temporal,
        height, width), computed by the model's `get_rope_index`.
    markers: (kind, text) the chat template writes around one media item; plain-text
        (pt) samples get the same markers in place of their <image>/<video>/<audio>.
    """

    name: str
    model_types: tuple[str, ...]
    vision_tower: tuple[str, ...]
    projector: tuple[str, ...]
    language_model: tuple[str, ...]
    audio_tower: tuple[str, ...]
    image_token: str | None
    video_token: str | None
    audio_token: str | None
    uses_mrope: bool
    markers: tuple[tuple[str, str], ...] = ()

    @property
    def modalities(self) -> tuple[str, ...]:
        """The media kinds the family takes, of "image", "video", "audio"."""
        tokens = {"image": self.image_token, "video": self.video_token, "audio": self.audio_token}
        return tuple(kind for kind, token in tokens.items() if token)


_LM = ("model.language_model", "lm_head")

_QWEN_VL = {
    "vision_tower": ("model.visual",),
    "projector": ("model.visual.merger",),
    "language_model": _LM,
    "audio_tower": (),
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_token": None,
    "uses_mrope": True,
    "markers": (("image", "<|vision_start|><|image_pad|><|vision_end|>"),
                ("video", "<|vision_start|><|video_pad|><|vision_end|>")),
}

# Qwen3-VL's deepstack mergers project intermediate vision features into early
# language-model layers: projectors like the final merger, and trained with it.
_QWEN3_VL = {**_QWEN_VL, "projector": ("model.visual.merger", "model.visual.deepstack_merger_list")}

FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family("qwen2_vl", ("qwen2_vl",), **_QWEN_VL),
        Family("qwen2_5_vl", ("qwen2_5_vl",), **_QWEN_VL),
        Family("qwen3_vl", ("qwen3_vl",), **_QWEN3_VL),
        Family("qwen3_vl_moe", ("qwen3_vl_moe",), **_QWEN3_VL),
        Family(
            "qwen2_audio", ("qwen2_audio",),
            vision_tower=(),
            projector=("model.multi_modal_projector",),
            language_model=_LM,
            audio_tower=("model.audio_tower",),
            image_token=None, video_token=None, audio_token="<|AUDIO|>",
            uses_mrope=False,
            markers=(("audio", "<|audio_bos|><|AUDIO|><|audio_eos|>"),),
        ),
        # The Qwen2.5-Omni thinker alone (Qwen2_5OmniThinkerForConditionalGeneration,
        # model_type qwen2_5_omni_thinker): what is fine-tuned. Its audio encoder
        # projects to the language model itself (audio_tower.proj), so the only
        # separate projector is the vision merger.
        Family(
            "qwen2_5_omni", ("qwen2_5_omni_thinker",),
            vision_tower=("model.visual",),
            projector=("model.visual.merger",),
            language_model=_LM,
            audio_tower=("model.audio_tower",),
            image_token="<|IMAGE|>", video_token="<|VIDEO|>", audio_token="<|AUDIO|>",
            uses_mrope=True,
            markers=(("image", "<|vision_bos|><|IMAGE|><|vision_eos|>"),
                     ("audio", "<|audio_bos|><|AUDIO|><|audio_eos|>"),
                     ("video", "<|vision_bos|><|VIDEO|><|vision_eos|>")),
        ),
    )
}

_BY_MODEL_TYPE = {model_type: family for family in FAMILIES.values() for model_type in family.model_types}


def family_of(model_or_config) -> Family | None:
    """The family of a model or config (by `config.model_type`); None for text-only and unknown models."""
    config = getattr(model_or_config, "config", model_or_config)
    return _BY_MODEL_TYPE.get(getattr(config, "model_type", None))


def _group_of(name: str, paths: list[tuple[str, str]]) -> str | None:
    dotted = f".{name}."
    best = None
    for length, group, path in paths:
        if f".{path}." in dotted:
            if best is None or length > best[0]:
                best = (length, group)
    return best[1] if best else None


def module_groups(model, family: Family) -> dict[str, list[str]]:
    """Parameter names of `model` by group: "vision_tower", "projector", "language_model", "audio_tower".

    Every parameter lands in exactly one group (the most specific path wins, so the
    projector inside the vision tower is the projector's). Parameters of no group
    (e.g. a reward model's value head) are listed under "other", present only when
    there are any. Groups the family lacks map to empty lists.
    """
    paths = [(len(path), group, path) for group in GROUPS for path in getattr(family, group)]
    groups: dict[str, list[str]] = {group: [] for group in GROUPS}
    for name, _ in model.named_parameters():
        groups.setdefault(_group_of(name, paths) or "other", []).append(name)
    return groups
