"""`tunesmith chat`: one answer (--prompt) or an interactive, streaming session."""

from __future__ import annotations

import re
from threading import Thread

import torch

from ..data.templates import stop_tokens
from ..models.load import pick_device
from .load import load_for_inference


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


def generate(model, tokenizer, messages: list[dict], *, max_new_tokens: int, temperature: float, top_p: float,
             streamer=None) -> str:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                        return_tensors="pt")
    ids = {k: v.to(model.device) for k, v in ids.items()}
    sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p} if temperature > 0 else {"do_sample": False}
    with torch.no_grad():
        out = model.generate(
            **ids,
            max_new_tokens=max_new_tokens,
            eos_token_id=stop_token_ids(model, tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            streamer=streamer,
            **sampling,
        )
    return strip_empty_think(tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)).strip()


def run_chat(model_path: str, *, prompt: str | None, system: str | None, max_new_tokens: int, temperature: float,
             top_p: float) -> str | None:
    model, tokenizer = load_for_inference(model_path, device=pick_device())
    base = [{"role": "system", "content": system}] if system else []
    options = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p}
    if prompt is not None:
        answer = generate(model, tokenizer, base + [{"role": "user", "content": prompt}], **options)
        print(answer)
        return answer
    _interactive(model, tokenizer, base, options)
    return None


def _interactive(model, tokenizer, base: list[dict], options: dict) -> None:
    from transformers import TextIteratorStreamer

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
        history.append({"role": "user", "content": query})
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        worker = Thread(target=generate, args=(model, tokenizer, history), kwargs={**options, "streamer": streamer})
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
