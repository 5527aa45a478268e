"""`tunesmith chat`: one answer (--prompt) or an interactive, streaming session."""

from __future__ import annotations

from threading import Thread

import torch

from ..models.load import pick_device
from .load import load_for_inference


def stop_token_ids(model, tokenizer) -> list[int]:
    """EOS ids from the generation config plus the tokenizer's eos."""
    ids = model.generation_config.eos_token_id
    ids = list(ids) if isinstance(ids, (list, tuple)) else ([ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


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
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()


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
        answer = "".join(_echo(piece) for piece in streamer)
        worker.join()
        history.append({"role": "assistant", "content": answer.strip()})


def _echo(piece: str) -> str:
    print(piece, end="", flush=True)
    return piece
