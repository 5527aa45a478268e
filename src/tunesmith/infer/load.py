"""Load a trained output for inference: a full HF model folder, a PEFT adapter folder, or a base + adapters."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from ..config.recorded import adapter_config, trained_rope
from ..errors import ModelError
from ..models.families import family_of
from ..models.load import auto_model_class, report_loading, with_chat_template
from ..models.rope import scale_rope
from ..models.tiny import resolve_model_path

log = logging.getLogger("tunesmith")


def is_adapter(path: str | Path) -> bool:
    return (Path(path) / "adapter_config.json").exists()


def adapter_base(path: str | Path) -> str | None:
    """The base model an adapter folder records (PEFT's base_model_name_or_path)."""
    return adapter_config(path).get("base_model_name_or_path")


def _is_reward_model(path: str) -> bool:
    """A `stage: rm` output: a sequence-classification folder or a SEQ_CLS LoRA adapter."""
    if is_adapter(path):
        return adapter_config(path).get("task_type") == "SEQ_CLS"
    config = Path(path) / "config.json"
    return config.exists() and any(a.endswith("ForSequenceClassification")
                                   for a in json.loads(config.read_text()).get("architectures") or [])


def _model_class(config, path: str):
    if _is_reward_model(path):
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification
    return auto_model_class(config)


def refuse_reward_model(path: str, adapters: list[str] | tuple[str, ...] = ()) -> None:
    """Chat and serving generate text; a `stage: rm` output scores it."""
    head = (list(adapters) or [path])[-1]
    if _is_reward_model(head):
        raise ModelError(f"{head} is a reward model (stage: rm): it scores answers and does not generate text; "
                         f"score with it: tunesmith score --model {head} --data <file.jsonl>")


def scale_rope_as_trained(config, adapters) -> None:
    """The base's RoPE scaled as it was in training, for adapters trained with rope_scaling."""
    for scaling in filter(None, map(trained_rope, adapters)):
        scale_rope(config, *scaling)


def scales_its_base(folder: str) -> bool:
    """The adapter's training scaled its base's RoPE (rope_scaling past the base's positions)."""
    from transformers import AutoConfig

    scaling = trained_rope(folder)
    if scaling is None:
        return False
    return scale_rope(AutoConfig.from_pretrained(resolve_model_path(adapter_base(folder))), *scaling)


def refuse_non_lora(folders) -> None:
    """vLLM serves LoRA adapters only; an OFT one (finetuning_type: oft) is served merged."""
    for folder in folders:
        peft_type = adapter_config(folder).get("peft_type")
        if peft_type not in (None, "LORA"):
            raise ModelError(f"{folder} is a {peft_type} adapter, and vLLM serves LoRA adapters only; merge it first "
                             "(tunesmith export) and serve the merged folder, or use infer_backend: huggingface")


def refuse_unservable_adapters(folders) -> None:
    """Adapters served on a base shared as loaded (vLLM's LoRA serving, switchable lora_modules): one trained with
    rope_scaling, or a PiSSA adapter (whose base is its own residual), is refused."""
    from ..models.pissa import is_pissa

    for folder in folders:
        if scales_its_base(folder):
            raise ModelError(f"{folder} was trained with rope_scaling, which serving it as a LoRA adapter on the base "
                             "model does not apply (vLLM, lora_modules); merge it first (tunesmith export) and serve "
                             "the merged folder")
        if is_pissa(folder):
            raise ModelError(f"{folder} is a PiSSA adapter, whose base is the residual of its own initialisation, "
                             "not the shared base model (vLLM, lora_modules); serve its run's pissa_converted folder "
                             "(pissa_convert: true) or merge it first (tunesmith export)")


def _looks_local(path: str) -> bool:
    """Not a hub id (`org/name`): a bare name, an absolute or relative path, or more than one `/`."""
    return "/" not in path or path.startswith(("/", "./", "../", "~")) or path.count("/") > 1


def _check_exists(path: str, what: str) -> None:
    if not Path(path).expanduser().exists() and _looks_local(path):
        raise ModelError(f"{what} '{path}' not found: give the output_dir of a run or a model folder")


def resolve_sources(path: str, adapters: list[str] | tuple[str, ...] = ()) -> tuple[str, list[str]]:
    """(base weights, adapter folders): `path` alone may itself be an adapter folder (its recorded base is used)."""
    path = resolve_model_path(path)
    _check_exists(path, "model")
    adapters = [resolve_model_path(a) for a in adapters]
    for adapter in adapters:
        _check_exists(adapter, "adapter")
        if Path(adapter).exists() and not is_adapter(adapter):
            raise ModelError(f"adapter_name_or_path '{adapter}' holds no adapter_config.json: give the output_dir "
                             "of a LoRA run (a full model goes in model_name_or_path)")
    if is_adapter(path):
        if adapters:
            raise ModelError(f"model_name_or_path '{path}' is itself a LoRA adapter; set model_name_or_path to its "
                             "base model and list the adapter(s) in adapter_name_or_path")
        return resolve_model_path(adapter_base(path)), [path]
    for adapter in adapters:
        recorded = adapter_base(adapter) if Path(adapter).exists() else None
        if recorded and Path(recorded).resolve() != Path(path).resolve() and Path(recorded).name != Path(path).name:
            log.warning("adapter %s was trained on %s; applying it to %s", adapter, recorded, path)
    return path, adapters


def _load_preprocessor(sources: list[str], multimodal: bool, **kwargs):
    """The processor (vision/audio-language) or tokenizer of the first folder that has one: the last adapter
    (it carries the trained template), then the base."""
    from transformers import AutoProcessor, AutoTokenizer

    loader = AutoProcessor if multimodal else AutoTokenizer
    for i, source in enumerate(sources):
        has_own = not Path(source).is_dir() or (Path(source) / "tokenizer_config.json").exists()
        if has_own or i == len(sources) - 1:
            return with_chat_template(loader.from_pretrained(source, **kwargs))
    raise AssertionError("unreachable")


def load_preprocessor(path: str, adapters: list[str] | tuple[str, ...] = (), *, trust_remote_code: bool = False,
                      cache_dir: str | None = None, revision: str = "main"):
    """(base weights, adapter folders, preprocessor) without loading weights: the processor or tokenizer
    load_for_inference would use (for a backend that loads the weights itself)."""
    from transformers import AutoConfig

    base, adapters = resolve_sources(path, adapters)
    hub = {"trust_remote_code": trust_remote_code, "cache_dir": cache_dir, "revision": revision}
    try:
        multimodal = family_of(AutoConfig.from_pretrained(base, **hub)) is not None
        return base, adapters, _load_preprocessor(list(reversed(adapters)) + [base], multimodal, **hub)
    except OSError as err:
        raise ModelError(f"cannot load '{adapters[-1] if adapters else base}': {err}") from None


def _check_quantizable(adapters: list[str], merge: bool) -> None:
    """A quantized base takes one unmerged LoRA / OFT adapter, not a PiSSA one (its base is rebuilt from the weights
    by an SVD, which packed quantized weights are not)."""
    from ..models.pissa import is_pissa

    if len(adapters) > 1 or (merge and adapters):
        raise ModelError("quantization_bit: a quantized model cannot take merged adapters (several adapters, or "
                         "lora_modules beside one); merge them into the unquantized model first (tunesmith export)")
    if adapters and is_pissa(adapters[0]):
        raise ModelError(f"quantization_bit: {adapters[0]} is a PiSSA adapter, whose base is rebuilt from the "
                         "unquantized weights; chat with its run's pissa_converted folder, or merge it first "
                         "(tunesmith export) and quantize the merged model")


def load_for_inference(path: str, *, device: torch.device, dtype: torch.dtype = torch.float32, merge: bool = False,
                       adapters: list[str] | tuple[str, ...] = (), trust_remote_code: bool = False,
                       cache_dir: str | None = None, revision: str = "main", quantization=None):
    """(model, preprocessor): the processor for vision/audio-language models, else the tokenizer.

    `path` is a model folder, a hub id, or an adapter folder (loaded on its recorded base); `adapters` are
    applied to `path` in order. All but the last are merged; merge=True folds the last in too. `quantization`
    (a BitsAndBytesConfig) loads the base's linear layers quantized, on `device`; an adapter then stays unmerged.
    """
    from transformers import AutoConfig

    base, adapters = resolve_sources(path, adapters)
    if quantization is not None:
        _check_quantizable(adapters, merge)
    placed = {"quantization_config": quantization, "device_map": {"": device}} if quantization is not None else {}
    head = adapters[-1] if adapters else base
    hub = {"trust_remote_code": trust_remote_code, "cache_dir": cache_dir, "revision": revision}
    try:
        config = AutoConfig.from_pretrained(base, **hub)
        multimodal = family_of(config) is not None
        preprocessor = _load_preprocessor(list(reversed(adapters)) + [base], multimodal, **hub)
        scale_rope_as_trained(config, adapters)
        reward = _is_reward_model(head)
        config.num_labels = 1 if reward else config.num_labels
        model = report_loading(*_model_class(config, head).from_pretrained(
            base, config=config, dtype=dtype, output_loading_info=True, **placed, **hub), base,
            fresh_head=bool(adapters) and reward)  # a reward adapter brings its score head
        for i, adapter in enumerate(adapters):
            from ..models.pissa import load_adapter_model

            model = load_adapter_model(model, adapter)
            if merge or i < len(adapters) - 1:
                model = model.merge_and_unload()
    except OSError as err:
        raise ModelError(f"cannot load '{head}': {err}") from None
    model.config.use_cache = True
    return (model if placed else model.to(device)).eval(), preprocessor
