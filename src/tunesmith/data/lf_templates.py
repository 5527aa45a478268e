"""Every template name of LLaMA-Factory's registry, and what tunesmith does with it.

LLaMA-Factory's `template:` picks a hand-written prompt format per model family. tunesmith renders with
the model's own chat template instead (data/templates.py), so an LF name needs no format of its own here,
only a decision, one row per name:

- "builtin": one of tunesmith's named Jinja templates (data/templates.py TEMPLATES) has this name and is
  used, whatever the tokenizer carries (these are the formats people fine-tune base models into);
- "own": the tokenizer's (or processor's) own chat template renders; LF's *_nothink variants render it
  with `enable_thinking=False`. `tokens` are special tokens every tokenizer of the family has: a
  tokenizer without them is not of this family, and the name is refused for it before anything renders;
- "refused": the family is not supported yet (or needs remote code, or the name is a generic prompt
  format rather than a model's): the error names the family and what to use instead.

`family_keys` are the keys in models/families.py (FAMILIES or TEXT_FAMILIES) of the families a name
serves; scripts/gen_families_table.py joins on them to list each family's template names in
docs/models.md. The names are those of LLaMA-Factory 0.9.5's `data/template.py` plus `moss_vl`, which
newer LLaMA-Factory example configs name.
"""

from __future__ import annotations

from dataclasses import dataclass

BUILTIN, OWN, REFUSED = "builtin", "own", "refused"

# Why a family is refused, in the words the error uses.
_NOT_YET = "not_yet"
_REMOTE = "remote"
_FORMAT = "format"
_REASONS = {
    _NOT_YET: "which tunesmith does not support yet",
    _REMOTE: "whose code is remote (trust_remote_code), which tunesmith cannot build and test offline, so it "
             "does not support them yet",
    _FORMAT: "not one model family's format; tunesmith renders prompts with chat templates",
}


@dataclass(frozen=True)
class LFTemplate:
    """One LLaMA-Factory template name.

    name: the name as in LLaMA-Factory; family: the models it is for, in words.
    use: BUILTIN, OWN or REFUSED (module docstring).
    family_keys: models/families.py keys of the supported families it serves (empty when refused).
    enable_thinking: False for LF's no-thinking variants rendered by the model's own template (forced,
        whatever `enable_thinking` the config sets); None leaves the config's value.
    tokens: special tokens the family's tokenizers have (checked for OWN).
    reason: for REFUSED, why (a key of _REASONS).
    """

    name: str
    family: str
    use: str
    family_keys: tuple[str, ...] = ()
    enable_thinking: bool | None = None
    tokens: tuple[str, ...] = ()
    reason: str = ""

    def why(self) -> str:
        """For a refused name, why, in words (the refusal's middle part)."""
        return _REASONS[self.reason]

    def refusal(self) -> str:
        """The error for a refused name: the family, why, and what to do instead."""
        if self.reason == _FORMAT:
            what = f"Template '{self.name}' is LLaMA-Factory's {self.family}, {_REASONS[_FORMAT]}"
            fix = ("use template: auto with a model whose tokenizer has a chat template, or template: chatml "
                   "to fine-tune a base model into ChatML")
        else:
            what = f"Template '{self.name}' is for {self.family} models, {_REASONS[self.reason]}"
            fix = "use template: auto with a model whose tokenizer has a chat template"
        return f"{what}; {fix} (supported families: docs/models.md)."


def _builtin(name, family, *keys):
    return LFTemplate(name, family, BUILTIN, keys)


def _own(name, family, *keys, tokens=(), nothink=False):
    return LFTemplate(name, family, OWN, keys, False if nothink else None, tuple(tokens))


def _no(name, family, reason=_NOT_YET):
    return LFTemplate(name, family, REFUSED, reason=reason)


_QWEN_TOKENS = ("<|im_start|>", "<|im_end|>")
_VISION = ("<|vision_start|>", "<|vision_end|>")
_DEEPSEEK = ("<｜User｜>", "<｜Assistant｜>")
_MISTRAL3 = ("[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]")
_OMNI3 = ("<|audio_start|>", "<|audio_pad|>", "<|vision_start|>")
_HARMONY = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>")

_ROWS = (
    # Served by a built-in Jinja template of data/templates.py.
    _builtin("chatml", "ChatML (any model with <|im_start|>/<|im_end|> tokens)", "qwen3"),
    _builtin("qwen", "Qwen2 / Qwen2.5", "qwen3"),
    _builtin("qwen3", "Qwen3 (reasoning)", "qwen3", "qwen3_moe"),
    _builtin("qwen3_nothink", "Qwen3 without reasoning", "qwen3", "qwen3_moe"),
    _builtin("qwen3_vl_nothink", "Qwen3-VL instruct", "qwen3_vl", "qwen3_vl_moe"),
    _builtin("llama3", "Llama 3", "llama"),
    # Rendered by the model's own chat template.
    _own("llama2", "Llama 2", "llama"),
    _own("llama2_zh", "Llama 2 (Chinese)", "llama"),
    _own("deepseek", "DeepSeek LLM (Llama architecture)", "llama"),
    _own("deepseekcoder", "DeepSeek-Coder (Llama architecture)", "llama"),
    _own("yi", "Yi (Llama architecture)", "llama"),
    _own("smollm", "SmolLM (Llama architecture)", "llama"),
    _own("smollm2", "SmolLM2 (Llama architecture)", "llama"),
    _own("opencoder", "OpenCoder (Llama architecture)", "llama"),
    _own("seed_coder", "Seed-Coder (Llama architecture)", "llama"),
    _own("sailor", "Sailor (Qwen2 architecture)", "qwen3", tokens=_QWEN_TOKENS),
    _own("breeze", "Breeze (Mistral architecture)", "mistral"),
    _own("gemma3", "Gemma 3 (text and vision)", "gemma3", "gemma3_vl",
         tokens=("<start_of_turn>", "<end_of_turn>")),
    _own("mistral", "Mistral", "mistral"),
    _own("ministral", "Ministral", "mistral"),
    _own("phi", "Phi-3", "phi3"),
    _own("phi4", "Phi-4", "phi3", tokens=("<|im_start|>", "<|im_sep|>", "<|im_end|>")),
    _own("phi4_mini", "Phi-4-mini / Phi-4-multimodal", "phi3", "phi4_multimodal"),
    _own("glm4", "GLM-4 (GLM-4-0414)", "glm4", tokens=("[gMASK]", "<sop>", "<|user|>", "<|assistant|>")),
    _own("glmz1", "GLM-Z1 (GLM-4-0414 architecture, reasoning)", "glm4",
         tokens=("[gMASK]", "<sop>", "<|user|>", "<|assistant|>")),
    _own("glm4_moe", "GLM-4.5 / GLM-4.6 (MoE)", "glm4_moe", tokens=("[gMASK]", "<sop>", "<|user|>", "<|assistant|>")),
    _own("deepseek3", "DeepSeek-V3", "deepseek_v3", tokens=_DEEPSEEK),
    _own("deepseekr1", "DeepSeek-R1 (DeepSeek-V3 architecture; its distilled Qwen/Llama models too)",
         "deepseek_v3", tokens=_DEEPSEEK),
    _own("gpt_oss", "GPT-OSS", "gpt_oss", tokens=_HARMONY),
    _own("qwen3_5", "Qwen3.5 (reasoning)", "qwen3_5", tokens=_QWEN_TOKENS),
    _own("qwen3_5_nothink", "Qwen3.5 without reasoning", "qwen3_5", tokens=_QWEN_TOKENS, nothink=True),
    _own("qwen2_vl", "Qwen2-VL / Qwen2.5-VL", "qwen2_vl", "qwen2_5_vl", tokens=_VISION),
    _own("qwen3_vl", "Qwen3-VL (reasoning)", "qwen3_vl", "qwen3_vl_moe", tokens=_VISION),
    _own("qwen2_audio", "Qwen2-Audio", "qwen2_audio", tokens=("<|audio_bos|>", "<|AUDIO|>")),
    _own("qwen2_omni", "Qwen2.5-Omni (the thinker)", "qwen2_5_omni", tokens=("<|audio_bos|>", "<|vision_bos|>")),
    # Families tunesmith does not support yet (transformers has most of them natively).
    _no("bailing", "Ling (Bailing)", _REMOTE),
    _no("bailing_v2", "Ling 2.0 (Bailing V2)", _REMOTE),
    _no("chatglm3", "ChatGLM3", _REMOTE),
    _no("cohere", "Cohere Command-R"),
    _no("cpm4", "MiniCPM4", _REMOTE),
    _no("dbrx", "DBRX"),
    _no("hy3", "Hunyuan 3"),
    _no("dots_ocr", "dots.ocr", _REMOTE),
    _no("ernie", "ERNIE 4.5"),
    _no("ernie_nothink", "ERNIE 4.5 without reasoning"),
    _no("ernie_vl", "ERNIE 4.5-VL"),
    _no("exaone", "EXAONE"),
    _no("falcon", "Falcon"),
    _no("falcon_h1", "Falcon-H1"),
    _no("gemma", "Gemma"),
    _no("gemma2", "Gemma 2"),
    _own("gemma3n", "Gemma 3n", "gemma3n", tokens=("<start_of_turn>", "<end_of_turn>", "<image_soft_token>")),
    _no("gemma4", "Gemma 4"),
    _no("gemma4n", "Gemma 4n"),
    _own("glm4v", "GLM-4.1V", "glm4v", tokens=("[gMASK]", "<sop>", "<|begin_of_image|>", "<|image|>")),
    _own("glm4_5v", "GLM-4.5V / GLM-4.6V", "glm4v_moe", tokens=("[gMASK]", "<sop>", "<|begin_of_image|>", "<|image|>")),
    _no("glm_ocr", "GLM-OCR"),
    _own("glm4_7", "GLM-4.7 (the GLM-4.5 architecture)", "glm4_moe", tokens=("[gMASK]", "<sop>", "<|user|>", "<|assistant|>")),
    _no("aeva", "Aeva (GLM-4.7 format)"),
    _no("granite3", "Granite 3"),
    _no("granite3_vision", "Granite 3 Vision"),
    _no("granite4", "Granite 4"),
    _no("index", "Index", _REMOTE),
    _no("hunyuan", "Hunyuan"),
    _no("hunyuan_small", "Hunyuan (small)"),
    _no("intern2", "InternLM2", _REMOTE),
    _own("intern_vl", "InternVL 3 (the transformers-native -hf checkpoints)", "internvl",
         tokens=("<img>", "</img>", "<IMG_CONTEXT>")),
    _no("intern_s1", "Intern-S1", _REMOTE),
    _no("keye_vl", "Keye-VL", _REMOTE),
    _no("kimi_vl", "Kimi-VL", _REMOTE),
    _no("lfm2", "LFM2"),
    _no("lfm2_vl", "LFM2-VL"),
    _own("llama4", "Llama 4", "llama4", tokens=("<|header_start|>", "<|header_end|>", "<|eot|>", "<|image|>")),
    _no("mllama", "Llama 3.2 Vision (Mllama)"),
    _no("moonlight", "Moonlight", _REMOTE),
    _own("llava", "LLaVA-1.5", "llava", tokens=("<image>",)),
    _own("llava_next", "LLaVA-NeXT", "llava_next", tokens=("<image>",)),
    _own("llava_next_llama3", "LLaVA-NeXT (Llama 3)", "llava_next", tokens=("<image>", "<|start_header_id|>")),
    _own("llava_next_mistral", "LLaVA-NeXT (Mistral)", "llava_next", tokens=("<image>", "[INST]")),
    _own("llava_next_qwen", "LLaVA-NeXT (Qwen)", "llava_next", tokens=("<image>", "<|im_start|>")),
    _own("llava_next_yi", "LLaVA-NeXT (Yi)", "llava_next", tokens=("<image>", "<|im_start|>")),
    _own("llava_next_video", "LLaVA-NeXT-Video", "llava_next_video", tokens=("<image>", "<video>")),
    _own("llava_next_video_mistral", "LLaVA-NeXT-Video (Mistral)", "llava_next_video",
         tokens=("<image>", "<video>", "[INST]")),
    _own("llava_next_video_yi", "LLaVA-NeXT-Video (Yi)", "llava_next_video",
         tokens=("<image>", "<video>", "<|im_start|>")),
    _no("video_llava", "Video-LLaVA"),
    _no("mimo", "MiMo", _REMOTE),
    _no("mimo_v2", "MiMo-V2"),
    _no("mimo_vl", "MiMo-VL"),
    _no("minicpm_v", "MiniCPM-V", _REMOTE),
    _no("minicpm_v_4_6", "MiniCPM-V 4.6", _REMOTE),
    _no("minicpm_o", "MiniCPM-o", _REMOTE),
    _no("minimax1", "MiniMax-Text-01", _REMOTE),
    _no("minimax2", "MiniMax-M2"),
    _own("mistral_small", "Mistral Small 3.1 / 3.2 (vision)", "mistral3", tokens=_MISTRAL3),
    _own("ministral3", "Ministral 3 (vision)", "mistral3", tokens=_MISTRAL3),
    _own("pixtral", "Pixtral-12B", "pixtral", tokens=_MISTRAL3),
    _no("moss_vl", "MOSS-VL", _REMOTE),
    _no("olmo", "OLMo"),
    _no("openchat", "OpenChat 3.5"),
    _no("openchat-3.6", "OpenChat 3.6"),
    _builtin("paligemma", "PaliGemma / PaliGemma 2", "paligemma"),
    _no("paligemma_chat", "PaliGemma (chat)"),
    _no("phi_small", "Phi-3-small", _REMOTE),
    _own("qwen3_omni", "Qwen3-Omni (the thinker)", "qwen3_omni", tokens=_OMNI3),
    _own("qwen3_omni_nothink", "Qwen3-Omni without reasoning (the thinker)", "qwen3_omni", tokens=_OMNI3,
         nothink=True),
    _no("qwen3_6", "Qwen3.6"),
    _no("seed_oss", "Seed-OSS"),
    _no("solar", "SOLAR"),
    _no("starchat", "StarChat"),
    _no("telechat2", "TeleChat2", _REMOTE),
    _no("yi_vl", "Yi-VL", _REMOTE),
    _no("youtu", "Youtu-LLM", _REMOTE),
    _no("youtu_vl", "Youtu-VL", _REMOTE),
    _no("yuan", "Yuan 2.0", _REMOTE),
    _no("xuanyuan", "XuanYuan"),
    # Generic prompt formats (any base model), not one family's.
    _no("alpaca", "Alpaca prompt format", _FORMAT),
    _no("chatml_de", "ChatML format with a German default system prompt", _FORMAT),
    _no("default", "default 'Human: / Assistant:' format", _FORMAT),
    _no("empty", "empty format (no chat markup)", _FORMAT),
    _no("fewshot", "few-shot format (no chat markup)", _FORMAT),
    _no("vicuna", "Vicuna 'USER: / ASSISTANT:' format", _FORMAT),
    _no("zephyr", "Zephyr '<|user|> / <|assistant|>' format", _FORMAT),
)

LF_TEMPLATES: dict[str, LFTemplate] = {row.name: row for row in _ROWS}


def templates_of_family(key: str) -> list[str]:
    """The LF template names that serve the family `key` of models/families.py, in table order."""
    return [row.name for row in _ROWS if key in row.family_keys]
