"""`tunesmith chat`: one answer (--prompt) or an interactive, streaming session."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from threading import Thread

import torch

from ..data.mm import to_content_parts
from ..data.templates import resolve, stop_tokens
from ..errors import DataError
from ..models.load import pick_device
from .load import load_for_inference
from .media import MediaInputs, saved_config
from .options import ChatOptions, GenerationKeys

_EMPTY_THINK = re.compile(r"^\s*<think>\s*</think>\s*")
_DTYPES = {"auto": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def stop_token_ids(model, tokenizer, template: str = "auto") -> list[int]:
    """EOS ids from the generation config, the tokenizer's eos and its chat template's end-of-turn tokens."""
    ids = model.generation_config.eos_token_id
    ids = list(ids) if isinstance(ids, (list, tuple)) else ([ids] if ids is not None else [])
    for tok in tokenizer.convert_tokens_to_ids(stop_tokens(tokenizer, template)):
        if tok is not None and tok not in ids:
            ids.append(tok)
    return ids


def strip_empty_think(text: str) -> str:
    """Reasoning templates (qwen3) make the model open and close an empty think block: not worth showing."""
    return _EMPTY_THINK.sub("", text)


def finish_reply(text: str) -> str:
    """The reply as shown: an empty leading think block dropped; a think block that never closed (the answer
    ran out of tokens while thinking) is kept as it is, so the thinking is still shown."""
    return strip_empty_think(text).strip()


def _think_open(text: str) -> bool:
    """Whether the text so far is (the start of) a leading think block that has not closed yet."""
    head = text.lstrip()
    return ("<think>".startswith(head) or head.startswith("<think>")) and "</think>" not in head


def _tokenizer_of(preprocessor):
    return getattr(preprocessor, "tokenizer", preprocessor)


@dataclass(frozen=True)
class Rendering:
    """How prompts are rendered: a named template's Jinja (None = the tokenizer's own) and its variables."""

    chat_template: str | None = None
    kwargs: dict = field(default_factory=dict)
    template: str = "auto"

    @classmethod
    def of(cls, preprocessor, template: str = "auto", enable_thinking: bool = True) -> "Rendering":
        if template == "auto":
            return cls(None, {"enable_thinking": enable_thinking}, template)
        chat_template, kwargs = resolve(_tokenizer_of(preprocessor), template)
        return cls(chat_template, {**kwargs, "enable_thinking": enable_thinking}, template)


@dataclass
class Prompt:
    inputs: dict
    opens_think: bool  # the generation prompt ends inside an open <think> (some reasoning templates do)


def model_inputs(preprocessor, messages: list[dict], media: MediaInputs | None,
                 rendering: Rendering = Rendering()) -> Prompt:
    """Prompt tensors for generate(): the tokenizer's chat template, or the processor with decoded media."""
    options = {"add_generation_prompt": True, "tokenize": False, "chat_template": rendering.chat_template,
               **rendering.kwargs}
    if not hasattr(preprocessor, "image_processor") and not hasattr(preprocessor, "feature_extractor"):
        text = preprocessor.apply_chat_template(messages, **options)
        inputs = preprocessor(text, add_special_tokens=False, return_tensors="pt")
    else:
        text = preprocessor.apply_chat_template(to_content_parts(messages), **options)
        inputs = preprocessor(text=[text], return_tensors="pt", **(media.processor_kwargs() if media else {}))
    return Prompt(dict(inputs), text.rstrip().endswith("<think>"))


def _generate_ids(model, tokenizer, prompt: Prompt, generation: GenerationKeys, stop_ids: list[int],
                  streamer=None, media: MediaInputs | None = None):
    inputs = {k: v.to(model.device) if hasattr(v, "to") else v for k, v in prompt.inputs.items()}
    with torch.no_grad():
        out = model.generate(**inputs, eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id, streamer=streamer,
                             **generation.generate_kwargs(), **(media.generate_kwargs() if media else {}))
    return out[0, inputs["input_ids"].shape[1]:]


def generate(model, preprocessor, messages: list[dict], *, generation: GenerationKeys,
             rendering: Rendering = Rendering(), media: MediaInputs | None = None) -> str:
    """One reply, as shown (see finish_reply)."""
    tokenizer = _tokenizer_of(preprocessor)
    prompt = model_inputs(preprocessor, messages, media, rendering)
    ids = _generate_ids(model, tokenizer, prompt, generation, stop_token_ids(model, tokenizer, rendering.template),
                        media=media)
    text = tokenizer.decode(ids, skip_special_tokens=generation.skip_special_tokens)
    return finish_reply(("<think>" if prompt.opens_think else "") + text)


_NEEDS = {"images": "image_processor", "videos": "video_processor", "audios": "feature_extractor"}


def _check_media_kinds(preprocessor, media: dict) -> None:
    """--image/--video/--audio only for a model whose processor takes that kind of input."""
    for kind, part in _NEEDS.items():
        if media.get(kind) and getattr(preprocessor, part, None) is None:
            what = "a text-only model" if not hasattr(preprocessor, "tokenizer") else "this model"
            raise DataError(f"--{kind[:-1]} given, but {what} takes no {kind[:-1]} input")


def run_chat(options: ChatOptions, *, prompt: str | None, system: str | None = None,
             media: dict | None = None) -> str | None:
    """Answer `prompt` and print it, or run an interactive session when prompt is None."""
    spec, generation = options.model, options.generation
    model, preprocessor = load_for_inference(
        spec.model_name_or_path, device=pick_device(), dtype=_DTYPES[spec.infer_dtype],
        adapters=spec.adapter_name_or_path, trust_remote_code=spec.trust_remote_code, cache_dir=spec.cache_dir,
        revision=spec.model_revision)
    _check_media_kinds(preprocessor, media or {})
    run_dir = spec.adapter_name_or_path[-1] if spec.adapter_name_or_path else spec.model_name_or_path
    thinking = generation.enable_thinking
    if "enable_thinking" not in generation.model_fields_set:
        thinking = bool(saved_config(run_dir).get("enable_thinking", True))  # as the run was trained
    rendering = Rendering.of(preprocessor, spec.template, thinking)
    attached = MediaInputs.load(run_dir, **(media or {}), overrides=options.media.overrides())
    system = system if system is not None else generation.default_system
    base = [{"role": "system", "content": system}] if system else []
    if prompt is not None:
        messages = base + [{"role": "user", "content": attached.placeholders() + prompt}]
        answer = generate(model, preprocessor, messages, generation=generation, rendering=rendering, media=attached)
        print(answer)
        return answer
    _interactive(model, preprocessor, base, generation, rendering, attached)
    return None


def _interactive(model, preprocessor, base: list[dict], generation: GenerationKeys, rendering: Rendering,
                 attached: MediaInputs) -> None:
    from transformers import TextIteratorStreamer

    tokenizer = _tokenizer_of(preprocessor)
    stop_ids = stop_token_ids(model, tokenizer, rendering.template)
    history = list(base)
    print("tunesmith chat: type a message; 'clear' resets the history, 'exit' quits.")
    while True:
        try:
            query = input("\nUser: ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return
        if query in ("exit", "quit"):
            return
        if query == "clear":
            history = list(base)
            continue
        first = not any(m["role"] == "user" for m in history)
        history.append({"role": "user", "content": (attached.placeholders() if first else "") + query})
        prompt = model_inputs(preprocessor, history, attached, rendering)
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=generation.skip_special_tokens)
        worker = Thread(target=_generate_ids, args=(model, tokenizer, prompt, generation, stop_ids),
                        kwargs={"streamer": streamer, "media": attached})
        worker.start()
        print("Assistant: ", end="", flush=True)
        answer = _stream(streamer, "<think>" if prompt.opens_think else "")
        worker.join()
        history.append({"role": "assistant", "content": answer})


def _stream(streamer, prefix: str = "") -> str:
    """Print pieces as they come, holding back a leading think block until it closes (then drop it if empty).

    A think block that never closes (the reply ran out of tokens while thinking) is printed at the end as it
    is, never swallowed. `prefix` is text the prompt already opened (`<think>`), shown with the reply.
    """
    text, shown = prefix, 0
    for piece in streamer:
        text += piece
        if _think_open(text):
            continue
        hidden = len(text) - len(strip_empty_think(text))
        print(text[max(hidden, shown):], end="", flush=True)
        shown = len(text)
    if shown < len(text):
        hidden = len(text) - len(strip_empty_think(text))
        print(text[max(hidden, shown):].rstrip(), end="")
    print()
    return finish_reply(text)
