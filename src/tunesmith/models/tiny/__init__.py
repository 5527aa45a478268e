"""Tiny random-initialised models of real architectures, built locally.

Tests and examples need a model that loads through the ordinary
`AutoModelForCausalLM` / `AutoTokenizer` path, with a real family's special
tokens and chat template, yet builds in seconds with no network. `build_tiny`
makes one: a byte-level BPE tokenizer trained on a small corpus (common.CORPUS), and a
2-layer, 64-wide model of a real text architecture (Qwen3, Llama 3, Gemma 3, Mistral,
Ministral, Phi-4, GLM-4, DeepSeek-V3, Qwen3-MoE, GPT-OSS, Qwen3.5, Qwen4-Exp: docs/models.md),
saved as a normal Hugging Face folder with the family's special tokens and chat template.

The multimodal ones (`is_multimodal`) are the same text model inside a real
vision-/audio-language architecture (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen2-Audio,
the Qwen2.5-Omni thinker, Gemma 3, LLaVA-1.5 / -NeXT / -OneVision, InternVL 3, Idefics3 / SmolVLM,
Mistral 3, GLM-4.1V, the Qwen3-Omni thinker) with a 1-2 layer vision or audio encoder, and their
folder also holds the family's processor (image/video processor, Whisper feature
extractor, the family's media tokens and chat template), so it loads through
`AutoProcessor` and `AutoModelForMultimodalLM` (`AutoModelForImageTextToText`
too, except for Qwen2-Audio). Their media budgets are small (a 56x84 image is 6
visual tokens) so CPU tests stay fast.

The folder is cached under `$TUNESMITH_CACHE/tiny/<arch>-<recipe hash>` (default
`~/.cache/tunesmith`). The hash covers everything that shapes the result, so a
changed recipe builds a new folder instead of reusing a stale one; a build is
written to a temporary folder and renamed into place, so a crash never leaves a
half-built model and two processes building at once both end with the same one.
Everything is seeded: the same recipe gives the same bytes.

Layout: `build.py` holds the registry (ARCHS), the recipe hash and the cached
build; `common.py` the shared constants, corpus and building steps; one module
per family holds its specs (qwen3.py, llama.py, gemma3.py, mistral.py, phi4.py, glm4.py,
deepseek_v3.py, qwen3_moe.py, gpt_oss.py, qwen3_5.py, qwen4_exp.py; qwen_vl.py for Qwen2-VL /
Qwen2.5-VL / Qwen3-VL, qwen2_audio.py, qwen2_5_omni.py, gemma3_vl.py, llava.py, internvl.py,
llava_onevision.py, idefics3.py, mistral3.py, glm4v.py (GLM-4.1V, GLM-4.5V), qwen3_omni.py, paligemma.py, llama4.py).
"""

from .build import ARCHS, MM_ARCHS, TINY_PREFIX, build_tiny, is_multimodal, is_tiny, recipe_hash, resolve_model_path

__all__ = ["ARCHS", "MM_ARCHS", "TINY_PREFIX", "build_tiny", "is_multimodal", "is_tiny", "recipe_hash",
           "resolve_model_path"]
