"""Per-family facts about models: the one place that knows them.

Text families (`TextFamily`, `TEXT_FAMILIES`, at the end) carry what a causal LM needs beyond its
config: its LoRA target modules, how its experts are balanced, whether packed samples stay apart in
it, and which attention kernels fit. The rest of this docstring is about vision/audio-language models.

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
    image_count: how an image's token count is known. "grid": from its patch grid
        (Qwen's image_grid_thw, merged merge_size x merge_size); "processor": the
        processor's own `_get_num_multimodal_tokens` for the image's size (after the
        pixel budget), the image token repeated that many times, and the image
        processor's outputs (pixel_values, image_sizes) go to the model as they are;
        "fixed": as "processor", but the text is the processor's own `replace_image_token`
        sequence (Gemma 3: the same soft tokens for every image, pan-and-scan crops off);
        "text": the processor's own replacement text for the record's images of these sizes (tiles,
        their delimiters and row breaks: InternVL, Idefics3 / SmolVLM, Pixtral, LLaVA-OneVision, which
        counts a record's several images differently from a lone one), expanded in the text.
    image_embed_token: the token repeated once per image embedding when the chat template
        writes another one (Gemma 3 writes <start_of_image>, which expands to
        <start_of_image>, the <image_soft_token>s, <end_of_image>); None when it is image_token.
    image_token_types: the forward takes `token_type_ids`, 1 at image embeddings, and lets
        the tokens of one image attend to each other both ways (Gemma 3).
    packing_leak: why packed samples would not be computed as if alone in this family (packing
        is then refused), or None; tests/unit/models/test_tiny_gemma3_vl.py checks Gemma 3's.
    prefix_lm: the forward takes `token_type_ids` 0 on each sample's prompt (the images and the text before its
        first supervised token: a prefix that attends both ways) and 1 from there on (the causal suffix), as
        PaliGemma trains; generation gives the whole prompt 0.
    first_position: the position id of a sample's first token (PaliGemma counts from 1).
    video_count: how a video's token count is known. "grid": from its patch grid (Qwen's video_grid_thw,
        frames paired by the temporal patch); "frames": the same tokens for every frame (each cropped to the
        video processor's crop size, pooled), frames sampled one by one (LLaVA-NeXT-Video).
    vision_model_type: the family is the checkpoints of `model_types` whose vision tower is this one (Pixtral-12B
        is a LLaVA checkpoint with a Pixtral tower and processor); None: every checkpoint of `model_types`.
    vision_varlen: the vision tower's attention takes its images' boundaries (cu_seqlens) the way transformers hands
        them to flash-attn: under the varlen attention it runs as one variable-length FlashAttention call a layer
        (`attention.use_varlen_in_vision_tower`) instead of one SDPA call per image.
    collation_pad_token: the token training batches pad their rows with, when the tokenizer's pad token cannot be:
        Gemma 3n's is its embedding's zero padding row, and its AltUp takes the square root of each position's
        hidden magnitude, whose gradient at that zero is infinite (NaN everywhere after one padded batch). Padding
        positions are never attended by real tokens nor labels, so any other token is as good; None: the pad token.
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
    image_count: str = "grid"
    image_embed_token: str | None = None
    image_token_types: bool = False
    packing_leak: str | None = None
    video_count: str = "grid"
    prefix_lm: bool = False
    first_position: int = 0
    vision_model_type: str | None = None
    collation_pad_token: str | None = None
    vision_varlen: bool = False

    @property
    def modalities(self) -> tuple[str, ...]:
        """The media kinds the family takes, of "image", "video", "audio"."""
        tokens = {"image": self.image_token, "video": self.video_token, "audio": self.audio_token}
        return tuple(kind for kind, token in tokens.items() if token)


_LM = ("model.language_model", "lm_head")

# transformers 5.24, Gemma3Model: for a packed row the sliding-window mask maps columns to per-sample
# positions before it reads the image blocks (token_type_ids), so it reads them at the wrong columns.
_GEMMA3_PACKED_IMAGES = (
    "the sliding-window layers' mask (transformers' create_masks_for_vision_model) looks up which tokens form one "
    "image at the wrong columns for every sample after the first, so those samples' tokens would attend to tokens "
    "after them and their images lose the two-way attention Gemma 3 trains with")

# transformers 5.24, PaliGemmaModel: every token with token_type_ids 0 joins one two-way block.
_PREFIX_LM_PACKED = (
    "the two-way attention over the prompt (token_type_ids 0) is one block per row, so the prompts of packed samples "
    "would attend to each other, and each to the samples after it")

# LLaVA-1.5 and -NeXT: the processor counts an image's tokens. InternVL and Mistral 3 have the same parts
# (transformers builds both on its LLaVA model) with their own image tokens.
_LLAVA = {
    "vision_tower": ("model.vision_tower",),
    "projector": ("model.multi_modal_projector",),
    "language_model": _LM,
    "audio_tower": (),
    "image_token": "<image>",
    "video_token": None,
    "audio_token": None,
    "uses_mrope": False,
    "markers": (("image", "<image>"),),
    "image_count": "processor",
}

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
    "vision_varlen": True,
}

_GLM4V = dict(
    vision_tower=("model.visual",),
    projector=("model.visual.merger", "model.visual.downsample"),
    language_model=_LM,
    audio_tower=(),
    image_token="<|image|>", video_token=None, audio_token=None,
    uses_mrope=True,
    markers=(("image", "<|begin_of_image|><|image|><|end_of_image|>"),),
)

_IDEFICS3 = dict(
    vision_tower=("model.vision_model",),
    projector=("model.connector",),
    language_model=("model.text_model", "lm_head"),
    audio_tower=(),
    image_token="<image>", video_token=None, audio_token=None,
    uses_mrope=False,
    markers=(("image", "<image>"),),
    image_count="text",
)

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
        # The Qwen3-Omni thinker alone (Qwen3OmniMoeThinkerForConditionalGeneration): a Qwen3-VL style vision tower
        # whose merger and deepstack mergers project into a MoE text model with interleaved mRoPE, and an audio
        # encoder that projects to the language model itself (audio_tower.proj1/proj2). Video is not wired yet.
        Family(
            "qwen3_omni", ("qwen3_omni_moe_thinker",),
            vision_tower=("model.visual",),
            projector=("model.visual.merger", "model.visual.merger_list"),
            language_model=_LM,
            audio_tower=("model.audio_tower",),
            image_token="<|image_pad|>", video_token=None, audio_token="<|audio_pad|>",
            uses_mrope=True,
            markers=(("image", "<|vision_start|><|image_pad|><|vision_end|>"),
                     ("audio", "<|audio_start|><|audio_pad|><|audio_end|>")),
        ),
        # LLaVA-1.5: a CLIP vision tower, a 2-layer MLP projector, and a Llama/Vicuna (or Qwen) language model.
        # Each image is resized and centre-cropped to one fixed size, so its token count is fixed.
        Family("llava", ("llava",), **_LLAVA),
        # LLaVA-NeXT (anyres): the same parts, plus the learned newline embedding that ends each row of tile
        # features (model.image_newline), trained with the projector. Its token count depends on the image's
        # aspect ratio, which the processor computes from the size after the pixel budget.
        Family("llava_next", ("llava_next",), **{**_LLAVA, "projector": ("model.multi_modal_projector",
                                                                         "model.image_newline")}),
        # LLaVA-NeXT-Video: LLaVA-NeXT's parts and images; each video frame is cropped to the tower's size, its
        # features pooled 2x2 (model.vision_resampler, no weights under average pooling) and projected: the same
        # number of <video> tokens per frame.
        Family("llava_next_video", ("llava_next_video",),
               **{**_LLAVA, "projector": ("model.multi_modal_projector", "model.image_newline",
                                          "model.vision_resampler"),
                  "video_token": "<video>", "markers": (("image", "<image>"), ("video", "<video>")),
                  "video_count": "frames"}),
        # Gemma 3 (Gemma3ForConditionalGeneration): a SigLIP tower, a pooling projector (an RMS norm and one
        # matrix), the Gemma 3 text model with sliding-window and global layers.
        # LLaVA-OneVision: LLaVA-NeXT's parts (a SigLIP tower) with a Qwen2 language model. A lone image is seen whole
        # and as tiles, a record's several images whole only, so a record's images are counted together.
        Family("llava_onevision", ("llava_onevision",), **{**_LLAVA, "projector": ("model.multi_modal_projector",
                                                                                "model.image_newline"),
                                                           "image_count": "text"}),
        # InternVL 3 (InternVLForConditionalGeneration, the "-hf" checkpoints): an InternViT tower, a pixel-shuffle
        # MLP projector, a Qwen2 language model. Each image is tiles at its aspect ratio (plus a thumbnail), each
        # tile the same number of <IMG_CONTEXT> tokens, the whole between <img> and </img>.
        Family("internvl", ("internvl",), **{**_LLAVA, "image_token": "<IMG_CONTEXT>",
                                            "markers": (("image", "<IMG_CONTEXT>"),), "image_count": "text"}),
        # Mistral 3 (Mistral3ForConditionalGeneration: Mistral Small 3.1 / 3.2): a Pixtral tower at the image's own
        # resolution, a patch-merging projector, a Mistral language model. [IMG] per merged patch, [IMG_BREAK]
        # ending each row, [IMG_END] the last.
        Family("mistral3", ("mistral3",), **{**_LLAVA, "image_token": "[IMG]", "markers": (("image", "[IMG]"),),
                                            "image_count": "text"}),
        # Llama 4 (Llama4ForConditionalGeneration: Scout, Maverick): a ViT with a pixel-shuffle adapter, a one-matrix
        # projector, a mixture-of-experts Llama 4 language model (chunked-attention RoPE layers, global NoPE layers).
        # The template writes <|image|>; the processor writes an image's tiles of <|patch|> tokens with separators,
        # then <|image|> and the whole image's patches, between <|image_start|> and <|image_end|>.
        Family("llama4", ("llama4",), vision_tower=("vision_model",), projector=("multi_modal_projector",),
               language_model=("language_model",), audio_tower=(), image_token="<|image|>", video_token=None,
               audio_token=None, uses_mrope=False, markers=(("image", "<|image|>"),), image_count="text",
               image_embed_token="<|patch|>"),
        # Phi-4-multimodal (Phi4MultimodalForCausalLM, transformers' native class; the remote-code "phi4mm" checkpoints
        # are refused below): a SigLIP-style image encoder with dynamic high-resolution crops and a Conformer audio
        # encoder, each with its own projection, inside model.embed_tokens_extend, over a Phi-3 language model. The
        # processor repeats <|image|> / <|audio|> once per embedding.
        Family("phi4_multimodal", ("phi4_multimodal",), vision_tower=("model.embed_tokens_extend.image_embed",),
               projector=tuple(f"model.embed_tokens_extend.{part}" for part in (
                   "image_embed.img_projection_up", "image_embed.img_projection_down",
                   "audio_embed.up_proj_for_speech", "audio_embed.down_proj_for_speech",
                   "audio_embed.up_proj_for_vision_speech", "audio_embed.down_proj_for_vision_speech")),
               language_model=("model", "lm_head"), audio_tower=("model.embed_tokens_extend.audio_embed",),
               image_token="<|image|>", video_token=None, audio_token="<|audio|>", uses_mrope=False,
               markers=(("image", "<|image|>"), ("audio", "<|audio|>")), image_count="processor"),
        # Pixtral-12B (LlavaForConditionalGeneration with a Pixtral tower and PixtralProcessor): LLaVA's parts with
        # Mistral 3's images ([IMG] per patch, [IMG_BREAK] ending each row, [IMG_END] the last).
        Family("pixtral", ("llava",), **{**_LLAVA, "image_token": "[IMG]", "markers": (("image", "[IMG]"),),
                                         "image_count": "text"}, vision_model_type="pixtral"),
        # Gemma 3n (Gemma3nForConditionalGeneration): a timm MobileNetV5 image encoder and a Conformer audio encoder,
        # each with its multimodal embedder (the projector), over the Gemma 3n language model. The template writes
        # <image_soft_token> / <audio_soft_token>; the processor writes a fixed sequence per item in their place.
        Family("gemma3n", ("gemma3n",), vision_tower=("model.vision_tower",),
               projector=("model.embed_vision", "model.embed_audio"), language_model=_LM,
               audio_tower=("model.audio_tower",), image_token="<image_soft_token>", video_token=None,
               audio_token="<audio_soft_token>", uses_mrope=False,
               markers=(("image", "<image_soft_token>"), ("audio", "<audio_soft_token>")), image_count="fixed",
               collation_pad_token="<eos>"),
        # GLM-4.1V (Glm4vForConditionalGeneration): a ViT whose 2x2 downsampling conv and merger project into a GLM-4
        # language model with mRoPE; images as Qwen2-VL's (a patch grid, one <|image|> per merged patch).
        Family("glm4v", ("glm4v",), **_GLM4V),
        # GLM-4.5V / GLM-4.6V (Glm4vMoeForConditionalGeneration): the same tower, merger and images over a GLM-4.5
        # MoE language model.
        Family("glm4v_moe", ("glm4v_moe",), **_GLM4V),
        # Idefics3 and SmolVLM (Idefics3ForConditionalGeneration): a SigLIP-style tower, a pixel-shuffle connector,
        # a Llama language model. Each image is tiles in rows and columns plus the whole image, written by the
        # processor with row/column tags and newlines between the tiles' <image> tokens.
        Family("idefics3", ("idefics3",), **_IDEFICS3),
        # SmolVLM2 (SmolVLMForConditionalGeneration): Idefics3's parts, tiles and tokens under its own classes; its
        # videos (frames the processor writes as timestamped images) are not taken yet.
        Family("smolvlm", ("smolvlm",), **_IDEFICS3),
        # PaliGemma / PaliGemma 2 (PaliGemmaForConditionalGeneration): a SigLIP tower, one linear projector, a Gemma
        # (2) language model; a fixed number of <image> tokens per image, then <bos> and the prompt, which the model
        # attends both ways (a prefix LM), then the causal answer.
        Family(
            "paligemma", ("paligemma",),
            vision_tower=("model.vision_tower",),
            projector=("model.multi_modal_projector",),
            language_model=_LM,
            audio_tower=(),
            image_token="<image>", video_token=None, audio_token=None,
            uses_mrope=False,
            markers=(("image", "<image>"),),
            image_count="processor",
            prefix_lm=True,
            first_position=1,
            packing_leak=_PREFIX_LM_PACKED,
        ),
        Family(
            "gemma3_vl", ("gemma3",),
            vision_tower=("model.vision_tower",),
            projector=("model.multi_modal_projector",),
            language_model=_LM,
            audio_tower=(),
            image_token="<start_of_image>", video_token=None, audio_token=None,
            uses_mrope=False,
            markers=(("image", "<start_of_image>"),),
            image_count="fixed",
            image_embed_token="<image_soft_token>",
            image_token_types=True,
            packing_leak=_GEMMA3_PACKED_IMAGES,
        ),
    )
}

_BY_MODEL_TYPE = {model_type: family for family in FAMILIES.values() for model_type in family.model_types
                  if family.vision_model_type is None}
_BY_VISION_TOWER = {(model_type, family.vision_model_type): family for family in FAMILIES.values()
                    for model_type in family.model_types if family.vision_model_type is not None}


def family_of(model_or_config) -> Family | None:
    """The family of a model or config (by `config.model_type`); None for text-only and unknown models."""
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    tower = getattr(getattr(config, "vision_config", None), "model_type", None)
    return _BY_VISION_TOWER.get((model_type, tower)) or _BY_MODEL_TYPE.get(model_type)


def collation_pad_id(tokenizer, family: Family | None) -> int:
    """The token id training batches pad rows with (Family.collation_pad_token, else the tokenizer's pad token)."""
    if family is not None and family.collation_pad_token:
        return tokenizer.convert_tokens_to_ids(family.collation_pad_token)
    return tokenizer.pad_token_id


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


# --- Text families -----------------------------------------------------------------------------------

ATTENTION_Q_K_V_O = ("q_proj", "k_proj", "v_proj", "o_proj")
GATED_MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class TextFamily:
    """What tunesmith needs to know about one text (causal LM) family.

    name: the family's key in TEXT_FAMILIES; model_types: its `config.model_type` values.
    lora_targets: the linear layers `lora_target: all` adapts (PEFT's all-linear: every nn.Linear but
        the output head), by their names in the transformers implementation.
    lora_parameters: the 3-D parameters PEFT adapts on top (its `target_parameters`): for the MoE
        families whose checkpoints transformers converts (Qwen3-MoE, DeepSeek-V3) PEFT reads the
        checkpoint's expert names and adapts the routed experts' fused weights and the router instead;
        DeepSeek-V3 then keeps its dense MLPs and shared expert unadapted. Experts of other families
        (GPT-OSS, Qwen4-Exp) get no adapter: train them with finetuning_type full or freeze.
        What PEFT 0.21 does with transformers 5.24; tests/unit/models/test_tiny_text.py checks it.
    balancing: "" for dense models; "aux_loss" when the forward returns a router load-balancing loss
        (`output_router_logits`), which training adds scaled by `router_aux_loss_coef`; "bias" for
        DeepSeek-V3's aux-loss-free balancing (a per-expert bias; transformers computes no loss for it).
    packing_leak: why packed samples would see each other in this family (packing is then refused), or
        None when per-sample position ids and transformers' packed-sequence mask keep them apart
        (sliding-window layers included). tests/unit/models/test_tiny_text.py checks each claim.
    sdpa: the implementation has an SDPA path (GPT-OSS's attention sinks have none; it runs eager).
    varlen: tunesmith's variable-length FlashAttention kernel computes this family's attention
        (it takes equal query/key and value head sizes and knows no sinks); sliding-window layers are
        checked from `layer_types` for every family.
    """

    name: str
    model_types: tuple[str, ...]
    lora_targets: tuple[str, ...]
    lora_parameters: tuple[str, ...] = ()
    balancing: str = ""
    packing_leak: str | None = None
    sdpa: bool = True
    varlen: bool = True


_LINEAR_ATTENTION_LEAK = (
    "its Gated DeltaNet linear-attention layers carry a recurrent state and a causal convolution along the "
    "whole row, so packed samples would leak into each other")
_GATED_DELTANET = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
_EXPERTS_AND_ROUTER = ("gate_up_proj", "down_proj", "gate.weight")  # PEFT's target_parameters names

TEXT_FAMILIES: dict[str, TextFamily] = {
    family.name: family
    for family in (
        TextFamily("qwen3", ("qwen3", "qwen2"), ATTENTION_Q_K_V_O + GATED_MLP),
        TextFamily("llama", ("llama",), ATTENTION_Q_K_V_O + GATED_MLP),
        TextFamily("gemma3", ("gemma3_text",), ATTENTION_Q_K_V_O + GATED_MLP),
        TextFamily("mistral", ("mistral", "ministral"), ATTENTION_Q_K_V_O + GATED_MLP),
        TextFamily("phi3", ("phi3",), ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")),  # Phi-4, Phi-3
        TextFamily("glm4", ("glm4",), ATTENTION_Q_K_V_O + ("gate_up_proj", "down_proj")),
        # MLA: low-rank query and joint key/value projections; the dense first layers and the shared expert are
        # gated MLPs of nn.Linear (the routed experts are batched parameters, see lora_parameters). Its value head
        # is narrower than its query/key head.
        TextFamily("deepseek_v3", ("deepseek_v3",),
                   ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj") + GATED_MLP,
                   lora_parameters=_EXPERTS_AND_ROUTER, balancing="bias", varlen=False),
        # GLM-4.5 / 4.6 / 4.7: DeepSeek-V3's routing (sigmoid scores, the aux-loss-free bias, a shared expert, dense
        # first layers) under GLM's half-rotary attention with biases.
        TextFamily("glm4_moe", ("glm4_moe",), ATTENTION_Q_K_V_O + GATED_MLP, lora_parameters=_EXPERTS_AND_ROUTER,
                   balancing="bias"),
        TextFamily("qwen3_moe", ("qwen3_moe",), ATTENTION_Q_K_V_O, lora_parameters=_EXPERTS_AND_ROUTER,
                   balancing="aux_loss"),
        # GptOssModel.forward builds its masks without the position ids, so transformers never sees the
        # packed samples' boundaries there.
        TextFamily("gpt_oss", ("gpt_oss",), ATTENTION_Q_K_V_O, balancing="aux_loss", sdpa=False, varlen=False,
                   packing_leak="transformers builds its attention masks without the position ids that mark "
                                "where packed samples start, so packed samples would attend to each other"),
        TextFamily("qwen3_5", ("qwen3_5_text",), ATTENTION_Q_K_V_O + _GATED_DELTANET + GATED_MLP,
                   packing_leak=_LINEAR_ATTENTION_LEAK),
        # The shared expert is a gated MLP with a 1-output gate; the QSA indexer and the hyper-connection
        # mixers are linear layers too.
        TextFamily("qwen4_exp", ("qwen4_exp_text",),
                   ATTENTION_Q_K_V_O + _GATED_DELTANET + GATED_MLP
                   + ("shared_expert_gate", "index_qk_proj", "input_mix_weight_down", "input_mix_weight_up",
                      "block_inject_weight"),
                   balancing="aux_loss", packing_leak=_LINEAR_ATTENTION_LEAK),
    )
}

_TEXT_BY_MODEL_TYPE = {model_type: family for family in TEXT_FAMILIES.values() for model_type in family.model_types}


def text_family_of(model_or_config) -> TextFamily | None:
    """The text family of a model or config (by `config.model_type`); None for multimodal and unknown models."""
    config = getattr(model_or_config, "config", model_or_config)
    return _TEXT_BY_MODEL_TYPE.get(getattr(config, "model_type", None))


def packing_leak(config) -> str | None:
    """Why packing several samples into one row would let them see each other in this model, or None.

    Known families say so themselves; any other model with linear-attention layers in its `layer_types`
    (a recurrent state along the row) is refused the same way.
    """
    family = text_family_of(config) or family_of(config)
    if family is not None:
        return family.packing_leak
    layer_types = getattr(getattr(config, "text_config", config), "layer_types", None) or ()
    return _LINEAR_ATTENTION_LEAK if "linear_attention" in layer_types else None
