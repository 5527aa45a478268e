"""`tunesmith chat`: one answer (--prompt) or an interactive, streaming session.

Generation is the shared engine's (serve/engine.py), so chat, `tunesmith serve` and the web UI render
prompts and sample the same way; this module holds only the terminal side.
"""

from __future__ import annotations

from ..errors import DataError
from ..serve.backends import load_engine
from ..serve.engine import Engine, Finished, GenerationRequest
from ..serve.hf_engine import HFEngine
from ..serve.render import Rendering, finish_reply, model_inputs, stop_token_ids, strip_empty_think, think_open
from ..serve.sampling import Sampling
from .media import MediaInputs
from .options import ChatOptions, GenerationKeys

__all__ = ["generate", "run_chat", "Rendering", "model_inputs", "stop_token_ids", "strip_empty_think",
           "finish_reply"]  # the rendering helpers moved to serve/render.py; importable from here as before


def generate(model, preprocessor, messages: list[dict], *, generation: GenerationKeys,
             rendering: Rendering = Rendering(), media: MediaInputs | None = None) -> str:
    """One reply of an already loaded model, as shown (see finish_reply)."""
    engine = HFEngine.for_model(model, preprocessor, rendering)
    prepared = engine.prepare(GenerationRequest(messages=messages, media=media, sampling=Sampling.of(generation)))
    return finish_reply("".join(e.text for e in engine.run(prepared) if not isinstance(e, Finished)))


_NEEDS = {"images": ("image_processor",), "videos": ("video_processor",),
          "audios": ("feature_extractor", "audio_processor")}  # Phi-4-multimodal's is its audio_processor


def check_media_kinds(preprocessor, media: dict, given: str = "--{kind} given") -> None:
    """--image/--video/--audio (or records with media: `given` says where they come from) only for a model whose
    processor takes that kind of input."""
    for kind, parts in _NEEDS.items():
        if media.get(kind) and all(getattr(preprocessor, part, None) is None for part in parts):
            what = "a text-only model" if not hasattr(preprocessor, "tokenizer") else "this model"
            raise DataError(f"{given.format(kind=kind[:-1])}, but {what} takes no {kind[:-1]} input")


def run_chat(options: ChatOptions, *, prompt: str | None, system: str | None = None,
             media: dict | None = None) -> str | None:
    """Answer `prompt` and print it, or run an interactive session when prompt is None."""
    engine = load_engine(options)
    check_media_kinds(engine.preprocessor, media or {})
    served = engine.served(None)
    attached = MediaInputs.load(served.path, **(media or {}), overrides=options.media.overrides())
    system = system if system is not None else options.generation.default_system
    base = [{"role": "system", "content": system}] if system else []
    sampling = Sampling.of(options.generation)
    if prompt is not None:
        messages = base + [{"role": "user", "content": attached.placeholders() + prompt}]
        text, _ = engine.generate(GenerationRequest(messages=messages, media=attached, sampling=sampling))
        answer = finish_reply(text)
        print(answer)
        return answer
    _interactive(engine, base, sampling, attached)
    return None


def _interactive(engine: Engine, base: list[dict], sampling: Sampling, attached: MediaInputs) -> None:
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
        prepared = engine.prepare(GenerationRequest(messages=history, media=attached, sampling=sampling))
        print("Assistant: ", end="", flush=True)
        answer = _stream(e.text for e in engine.run(prepared, stream=True) if not isinstance(e, Finished))
        history.append({"role": "assistant", "content": answer})


def _stream(pieces, prefix: str = "") -> str:
    """Print pieces as they come, holding back a leading think block until it closes (then drop it if empty).

    A think block that never closes (the reply ran out of tokens while thinking) is printed at the end as it
    is, never swallowed. `prefix` is text the prompt already opened (`<think>`), shown with the reply.
    """
    text, shown = prefix, 0
    for piece in pieces:
        text += piece
        if think_open(text):
            continue
        hidden = len(text) - len(strip_empty_think(text))
        print(text[max(hidden, shown):], end="", flush=True)
        shown = len(text)
    if shown < len(text):
        hidden = len(text) - len(strip_empty_think(text))
        print(text[max(hidden, shown):].rstrip(), end="")
    print()
    return finish_reply(text)
