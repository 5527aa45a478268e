"""The web chat's generation, on the code `tunesmith chat` uses (infer/): loading, the chat template and its
stop tokens, the sampling settings; here only the page's request is turned into those, and the reply is
streamed as events."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterator

import torch

from ..errors import DataError
from ..infer.chat import Rendering, finish_reply, model_inputs, stop_token_ids, strip_empty_think
from ..infer.load import load_for_inference
from ..infer.media import MediaInputs, saved_config
from ..infer.options import GenerationKeys
from ..models.load import pick_device


def load_chat_model(folder: Path, run_dir: Path):
    """(model, preprocessor, rendering) for a run's model or checkpoint, rendered as the run was trained."""
    device = pick_device()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model, preprocessor = load_for_inference(str(folder), device=device, dtype=dtype)
    thinking = bool(saved_config(str(run_dir)).get("enable_thinking", True))
    return model, preprocessor, Rendering.of(preprocessor, "auto", thinking)


def _check_images(preprocessor, images: list[list[Path]]) -> None:
    if any(images) and getattr(preprocessor, "image_processor", None) is None:
        raise DataError("this model takes no image input (a text-only model); remove the image or pick a "
                        "vision-language model")


def build_prompt(loaded, run_dir: Path, request, images: list[list[Path]]):
    """(prompt tensors, decoded media): each message's images as placeholders before its text, all images
    decoded with the pixel budgets the run trained with."""
    _check_images(loaded.preprocessor, images)
    flat = [p for paths in images for p in paths]
    media = MediaInputs.load(str(run_dir), images=[str(p) for p in flat])
    messages = [{"role": "system", "content": request.system}] if request.system.strip() else []
    for message, paths in zip(request.messages, images):
        messages.append({"role": message.role, "content": "<image>" * len(paths) + message.content})
    return model_inputs(loaded.preprocessor, messages, media, loaded.rendering), media


def _generation(request) -> GenerationKeys:
    return GenerationKeys(max_new_tokens=request.max_new_tokens, temperature=request.temperature,
                          top_p=request.top_p)


class _Cancelled:
    """A stopping criterion the page's Stop (the stream closed) sets."""

    def __init__(self):
        self.event = threading.Event()

    def __call__(self, input_ids, scores, **kwargs):
        return self.event.is_set()


def stream_reply(loaded, prompt, media, request) -> Iterator[dict]:
    """{'delta': text} as the reply grows (a leading think block held back until it closes, dropped when empty),
    then {'done': True, 'text': the reply as `tunesmith chat` shows it}."""
    from transformers import StoppingCriteriaList, TextIteratorStreamer

    tokenizer = getattr(loaded.preprocessor, "tokenizer", loaded.preprocessor)
    generation = _generation(request)
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=generation.skip_special_tokens)
    cancelled = _Cancelled()
    inputs = {k: v.to(loaded.model.device) if hasattr(v, "to") else v for k, v in prompt.inputs.items()}
    kwargs = dict(**inputs, eos_token_id=stop_token_ids(loaded.model, tokenizer, loaded.rendering.template),
                  pad_token_id=tokenizer.pad_token_id, streamer=streamer,
                  stopping_criteria=StoppingCriteriaList([cancelled]), **generation.generate_kwargs(),
                  **media.generate_kwargs())
    worker = threading.Thread(target=_generate, args=(loaded.model, kwargs, streamer), daemon=True)
    worker.start()
    try:
        yield from _events(streamer, "<think>" if prompt.opens_think else "")
    finally:
        cancelled.event.set()
        worker.join()


def _generate(model, kwargs: dict, streamer) -> None:
    try:
        with torch.no_grad():
            model.generate(**kwargs)
    except Exception as err:
        streamer.error = err  # read by _events once the stream ends
        streamer.end()


def _events(streamer, text: str) -> Iterator[dict]:
    shown = 0
    for piece in streamer:
        text += piece
        visible = strip_empty_think(text)
        if visible.lstrip().startswith("<think>") and "</think>" not in visible or "<think>".startswith(visible.strip()):
            continue  # inside a think block that may still turn out empty
        start = max(len(text) - len(visible), shown)
        if len(text) > start:
            yield {"delta": text[start:]}
        shown = len(text)
    error = getattr(streamer, "error", None)
    if error is not None:
        raise error
    yield {"done": True, "text": finish_reply(text)}
