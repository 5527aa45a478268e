"""The tiny-model registry, recipe hash, and the cached, atomic build of a folder.

A family lives in its own module, which holds plain-data specs in `ARCHS` (and,
for a multimodal family, `build_config(spec, tokenizer)`); adding one is writing
that module and listing it in `_TEXT_FAMILIES` or `_MM_FAMILIES` below.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock

from tunesmith.errors import ModelError

from . import (deepseek_v3, gemma3, gemma3_vl, gemma3n, glm4, glm4v, gpt_oss, idefics3, internvl, llama, llama4, llava,
               llava_onevision, mistral, mistral3, paligemma, phi4, phi4_multimodal, qwen2_5_omni, qwen2_audio, qwen3, qwen3_5,
               qwen3_moe, qwen3_omni, qwen4_exp, qwen_vl)
from .common import (CORPUS, MODEL_SHAPE, RECIPE_VERSION, SEED, VOCAB_SIZE, build_mm_model, build_processor,
                     build_text_model, build_tokenizer, chat_template, generation_config)

TINY_PREFIX = "tiny:"

# Dense, then MoE, then the hybrid linear-attention Qwen families.
_TEXT_FAMILIES = (qwen3, llama, gemma3, mistral, phi4, glm4, deepseek_v3, qwen3_moe, gpt_oss, qwen3_5, qwen4_exp)
_MM_FAMILIES = (qwen_vl, qwen2_audio, qwen2_5_omni, gemma3_vl, llava, internvl, idefics3, mistral3, glm4v,
                llava_onevision, llama4, qwen3_omni, paligemma, phi4_multimodal, gemma3n)
MM_ARCHS: dict[str, dict] = {arch: spec for family in _MM_FAMILIES for arch, spec in family.ARCHS.items()}
ARCHS: dict[str, dict] = {
    **{arch: spec for family in _TEXT_FAMILIES for arch, spec in family.ARCHS.items()}, **MM_ARCHS}
# Kept apart from the specs: a spec is hashed into the recipe, so it holds data, not code.
_MM_CONFIG_BUILDERS = {arch: family.build_config for family in _MM_FAMILIES for arch in family.ARCHS}
_FAMILY_OF = {arch: family for family in (*_TEXT_FAMILIES, *_MM_FAMILIES) for arch in family.ARCHS}


def _code_hash(arch: str) -> str:
    """The source of the family's module and of the shared builders: a changed builder is a new cache entry."""
    from . import common

    digest = hashlib.sha256()
    for module in (_FAMILY_OF[arch], common):
        try:
            digest.update(inspect.getsource(module).encode())
        except (OSError, TypeError):  # no source shipped: the recipe version alone names the build
            pass
    return digest.hexdigest()[:16]


def _recipe(arch: str) -> dict:
    """Everything that shapes the built folder; its hash names the cache entry."""
    spec = ARCHS[arch]
    return {
        "version": RECIPE_VERSION,
        "arch": arch,
        "seed": SEED,
        "vocab_size": VOCAB_SIZE,
        "corpus": CORPUS,
        "chat_template": chat_template(spec),
        "shape": MODEL_SHAPE,
        "code": _code_hash(arch),
        **spec,
    }


def is_tiny(name: str) -> bool:
    """Whether `name` asks for a tiny model ("tiny:qwen3")."""
    return isinstance(name, str) and name.startswith(TINY_PREFIX)


def is_multimodal(arch: str) -> bool:
    """Whether tiny `arch` ("qwen2_vl", or "tiny:qwen2_vl") is a vision/audio-language model."""
    return (arch[len(TINY_PREFIX):] if is_tiny(arch) else arch) in MM_ARCHS


def recipe_hash(arch: str) -> str:
    blob = json.dumps(_recipe(arch), sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def resolve_model_path(name_or_path: str) -> str:
    """'tiny:<arch>' → the built folder; any other name or path unchanged."""
    if is_tiny(name_or_path):
        return str(build_tiny(name_or_path[len(TINY_PREFIX):]))
    return name_or_path


def _cache_root(cache_dir: str | Path | None) -> Path:
    if cache_dir is None:
        cache_dir = os.environ.get("TUNESMITH_CACHE") or Path.home() / ".cache" / "tunesmith"
    return Path(cache_dir).expanduser()


def build_tiny(arch: str, cache_dir: str | Path | None = None) -> Path:
    """The folder of the tiny `arch` model, built on first use and cached after."""
    if arch not in ARCHS:
        text_archs = sorted(set(ARCHS) - set(MM_ARCHS))
        raise ModelError(f"Unknown tiny architecture '{arch}'. Known: {', '.join(text_archs)}; "
                         f"multimodal: {', '.join(sorted(MM_ARCHS))} (use e.g. model_name_or_path: tiny:qwen3).")
    final = _cache_root(cache_dir) / "tiny" / f"{arch}-{recipe_hash(arch)}"
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # the processes of one launch build the same model side by side: one builds, the others wait for it
    with FileLock(str(final.parent / f".{final.name}.lock")):
        if (final / "config.json").is_file():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            _build_into(arch, tmp)
            # mkdtemp (and the safetensors writer) make owner-only files; a shared cache must be readable
            for path in (tmp, *tmp.iterdir()):
                path.chmod(0o755 if path.is_dir() else 0o644)
            try:
                os.rename(tmp, final)  # atomic: a crash never leaves a half-built model under the final name
            except OSError:  # a process without the lock (an older release sharing the cache) got there first
                if not (final / "config.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _build_into(arch: str, out: Path) -> None:
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a progress bar for a 1 MB file is noise in test output
    try:
        spec = ARCHS[arch]
        tokenizer = build_tokenizer(spec)
        if is_multimodal(arch):
            # the processor saves the tokenizer too (template in tokenizer_config.json and chat_template.jinja)
            build_processor(spec, tokenizer).save_pretrained(out)
        else:
            tokenizer.save_pretrained(out, save_jinja_files=False)  # template inside tokenizer_config.json
        generation = generation_config(spec, tokenizer)
        if is_multimodal(arch):
            model = build_mm_model(spec, _MM_CONFIG_BUILDERS[arch](spec, tokenizer))
        else:
            model = build_text_model(spec, tokenizer)
        # transformers writes a model only on rank 0 once torch.distributed is initialised; this folder is private
        # to the process that holds the build lock, whichever rank that is
        model.should_save_on_this_rank = lambda is_main_process: True
        model.save_pretrained(out)
        generation.save_pretrained(out)
        if not (out / "config.json").is_file():
            raise ModelError(f"building tiny:{arch}: transformers wrote no config.json into {out}")
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    (out / "tunesmith_tiny.json").write_text(json.dumps(_recipe(arch), indent=1, ensure_ascii=False))
