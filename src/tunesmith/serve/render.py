"""Prompts from messages: the chat template (the tokenizer's own or a named one), media, stop tokens.

The one place chat, serve and the web UI turn messages into model input, so all three render the
same prompt for the same conversation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..data.mm import to_content_parts
from ..data.templates import get_template, resolve, stop_tokens
from ..errors import DataError

_EMPTY_THINK = re.compile(r"^\s*<think>\s*</think>\s*")


class RenderError(DataError):
    """The chat template refused the messages (e.g. tools given to a template that has none)."""


def tokenizer_of(preprocessor):
    """The tokenizer of a processor (vision/audio-language models), or the tokenizer itself."""
    return getattr(preprocessor, "tokenizer", preprocessor)


def takes_media(preprocessor) -> bool:
    return any(hasattr(preprocessor, part) for part in ("image_processor", "feature_extractor", "audio_processor"))


def stop_ids_of(eos_ids, tokenizer, template: str = "auto") -> list[int]:
    """`eos_ids` (a generation config's eos_token_id: an id, a list or None) plus the tokenizer's eos and its chat
    template's end-of-turn tokens."""
    ids = list(eos_ids) if isinstance(eos_ids, (list, tuple)) else ([eos_ids] if eos_ids is not None else [])
    for tok in tokenizer.convert_tokens_to_ids(stop_tokens(tokenizer, template)):
        if tok is not None and tok not in ids:
            ids.append(tok)
    return ids


def stop_token_ids(model, tokenizer, template: str = "auto") -> list[int]:
    """EOS ids from the model's generation config, the tokenizer's eos and its chat template's end-of-turn tokens."""
    return stop_ids_of(model.generation_config.eos_token_id, tokenizer, template)


def strip_empty_think(text: str) -> str:
    """Reasoning templates (qwen3) make the model open and close an empty think block: not worth showing."""
    return _EMPTY_THINK.sub("", text)


def finish_reply(text: str) -> str:
    """The reply as shown: an empty leading think block dropped; a think block that never closed (the answer
    ran out of tokens while thinking) is kept as it is, so the thinking is still shown."""
    return strip_empty_think(text).strip()


def think_open(text: str) -> bool:
    """Whether the text so far is (the start of) a leading think block that has not closed yet."""
    head = text.lstrip()
    return ("<think>".startswith(head) or head.startswith("<think>")) and "</think>" not in head


@dataclass(frozen=True)
class Rendering:
    """How prompts are rendered: a named template's Jinja (None = the tokenizer's own) and its variables."""

    chat_template: str | None = None
    kwargs: dict = field(default_factory=dict)
    template: str = "auto"

    @classmethod
    def of(cls, preprocessor, template: str = "auto", enable_thinking: bool = True,
           own_template: str | None = None) -> "Rendering":
        """`own_template`: the Jinja an adapter folder carries, used for `auto` instead of the base tokenizer's."""
        if template == "auto":
            return cls(own_template, {"enable_thinking": enable_thinking}, template)
        chat_template, kwargs = resolve(tokenizer_of(preprocessor), template)
        if get_template(template).chat_template is None:  # an LF name rendered by the model's own template
            chat_template = own_template
        # a template's own variables win: LLaMA-Factory's *_nothink names force enable_thinking=False
        return cls(chat_template, {"enable_thinking": enable_thinking, **kwargs}, template)

    def jinja(self, preprocessor) -> str:
        """The template text that renders (for telling which tool-call format it asks for)."""
        return self.chat_template or resolve(preprocessor, "auto")[0]

    def with_kwargs(self, extra: dict) -> "Rendering":
        return Rendering(self.chat_template, {**self.kwargs, **extra}, self.template) if extra else self


@dataclass
class Prompt:
    inputs: dict
    opens_think: bool  # the generation prompt ends inside an open <think> (some reasoning templates do)
    text: str = ""

    @property
    def num_tokens(self) -> int:
        return int(self.inputs["input_ids"].shape[-1])


def render_text(preprocessor, messages: list[dict], rendering: Rendering = Rendering(),
                tools: list[dict] | None = None, generation_prompt: bool = True) -> str:
    """The prompt text: messages through the chat template, ending with the assistant's generation prompt (or,
    generation_prompt false, with the last message as the template closes it)."""
    from jinja2 import TemplateError

    options = {"add_generation_prompt": generation_prompt, "tokenize": False, "chat_template": rendering.chat_template,
               **rendering.kwargs}
    if tools:
        options["tools"] = tools
    shaped = to_content_parts(messages) if takes_media(preprocessor) else messages
    try:
        return preprocessor.apply_chat_template(shaped, **options)
    except TemplateError as err:
        raise RenderError(f"the chat template cannot render these messages: {err}") from None


def model_inputs(preprocessor, messages: list[dict], media=None, rendering: Rendering = Rendering(),
                 tools: list[dict] | None = None) -> Prompt:
    """Prompt tensors for generate(): the tokenizer's chat template, or the processor with decoded media
    (`media`: infer.media.MediaInputs)."""
    text = render_text(preprocessor, messages, rendering, tools)
    if not takes_media(preprocessor):
        inputs = preprocessor(text, add_special_tokens=False, return_tensors="pt")
    elif type(preprocessor).__name__ == "PaliGemmaProcessor":
        inputs = _prefix_lm_inputs(preprocessor, text, media)
    else:
        # the template writes every special token (LLaVA's <s> too), as training tokenizes it
        inputs = preprocessor(text=[text], add_special_tokens=False, return_tensors="pt",
                              **(media.processor_kwargs() if media else {}))
    return Prompt(dict(inputs), text.rstrip().endswith("<think>"), text)


def _prefix_lm_inputs(processor, text: str, media) -> dict:
    """PaliGemma: its processor adds <bos> and a newline to whatever text it is given, and the chat template has
    already written both; so the text is tokenized as training tokenizes it, each <image> expanded to the
    processor's count, the images go through its image processor, and the whole prompt is the prefix the model
    attends both ways (token_type_ids 0)."""
    import torch

    expanded = text.replace(processor.image_token, processor.image_token * processor.image_seq_length)
    inputs = dict(processor.tokenizer(expanded, add_special_tokens=False, return_tensors="pt"))
    if media and media.images:
        inputs["pixel_values"] = processor.image_processor(media.images, return_tensors="pt")["pixel_values"]
    inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
    return inputs


def text_inputs(preprocessor, text: str) -> Prompt:
    """A raw prompt (/v1/completions): the text as it is, no chat template, the tokenizer's usual special tokens."""
    inputs = tokenizer_of(preprocessor)(text, return_tensors="pt")
    return Prompt(dict(inputs), False, text)
