"""`tunesmith chat`: one answer (--prompt) or an interactive, streaming session."""

from __future__ import annotations

import re
from threading import Thread

import torch

from ..data.mm import to_content_parts
from ..errors import DataError
from ..data.templates import stop_tokens
from ..models.load import pick_device
from .load import load_for_inference
from .media import MediaInputs


_EMPTY_THINK = re.compile(r"^\s*<think>\s*</think>\s*")


def stop_token_ids(model, tokenizer) -> list[int]:
    """EOS ids from the generation config, the tokenizer's eos and its chat template's end-of-turn tokens."""
    ids = model.generation_config.eos_token_id
    ids = list(ids) if isinstance(ids, (list, tuple)) else ([ids] if ids is not None else [])
    for tok in tokenizer.convert_tokens_to_ids(stop_tokens(tokenizer, "auto")):
        if tok is not None and tok not in ids:
            ids.append(tok)
    return ids


def strip_empty_think(text: str) -> str:
    """Reasoning templates (qwen3) make the model open and close an empty think block: not worth showing."""
    return _EMPTY_THINK.sub("", text)


def _tokenizer_of(preprocessor):
    return getattr(preprocessor, "tokenizer", preprocessor)


def model_inputs(preprocessor, messages: list[dict], media: MediaInputs | None) -> dict:
    """Prompt tensors for generate(): the tokenizer's chat template, or the processor with decoded media."""
    if not hasattr(preprocessor, "image_processor") and not hasattr(preprocessor, "feature_extractor"):
        return preprocessor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=True, return_tensors="pt")
    text = preprocessor.apply_chat_template(to_content_parts(messages), add_generation_prompt=True, tokenize=False)
    kwargs = media.processor_kwargs() if media else {}
    return preprocessor(text=[text], return_tensors="pt", **kwargs)


def generate(model, preprocessor, messages: list[dict], *, max_new_tokens: int, temperature: float, top_p: float,
             streamer=None, media: MediaInputs | None = None) -> str:
    tokenizer = _tokenizer_of(preprocessor)
    inputs = {k: v.to(model.device) if hasattr(v, "to") else v
              for k, v in model_inputs(preprocessor, messages, media).items()}
    sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p} if temperature > 0 else {"do_sample": False}
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            eos_token_id=stop_token_ids(model, tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            streamer=streamer,
            **sampling,
            **(media.generate_kwargs() if media else {}),
        )
    return strip_empty_think(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)).strip()


_NEEDS = {"images": "image_processor", "videos": "video_processor", "audios": "feature_extractor"}


def _check_media_kinds(preprocessor, media: dict) -> None:
    """--image/--video/--audio only for a model whose processor takes that kind of input."""
    for kind, part in _NEEDS.items():
        if media.get(kind) and getattr(preprocessor, part, None) is None:
            what = "a text-only model" if not hasattr(preprocessor, "tokenizer") else "this model"
            raise DataError(f"--{kind[:-1]} given, but {what} takes no {kind[:-1]} input")


def run_chat(model_path: str, *, prompt: str | None, system: str | None, max_new_tokens: int, temperature: float,
             top_p: float, media: dict | None = None) -> str | None:
    model, preprocessor = load_for_inference(model_path, device=pick_device())
    _check_media_kinds(preprocessor, media or {})
    attached = MediaInputs.load(model_path, **(media or {}))
    base = [{"role": "system", "content": system}] if system else []
    options = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p}
    if prompt is not None:
        messages = base + [{"role": "user", "content": attached.placeholders() + prompt}]
        answer = generate(model, preprocessor, messages, media=attached, **options)
        print(answer)
        return answer
    _interactive(model, preprocessor, base, options, attached)
    return None


def _interactive(model, preprocessor, base: list[dict], options: dict, attached: MediaInputs) -> None:
    from transformers import TextIteratorStreamer

    tokenizer = _tokenizer_of(preprocessor)
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
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        worker = Thread(target=generate, args=(model, preprocessor, history),
                        kwargs={**options, "streamer": streamer, "media": attached})
        worker.start()
        print("Assistant: ", end="", flush=True)
        answer = _stream(streamer)
        worker.join()
        history.append({"role": "assistant", "content": answer})


def _stream(streamer) -> str:
    """Print pieces as they come, holding back a leading think block until it closes (then drop it if empty)."""
    text, shown = "", 0
    for piece in streamer:
        text += piece
        head = text.lstrip()
        opening = "<think>".startswith(head) or head.startswith("<think>")
        if opening and "</think>" not in head:
            continue
        hidden = len(text) - len(strip_empty_think(text))
        print(text[max(hidden, shown):], end="", flush=True)
        shown = len(text)
    print()
    return strip_empty_think(text).strip()
