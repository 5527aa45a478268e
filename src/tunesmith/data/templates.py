"""Named chat templates, for models whose tokenizer has none or the wrong one.

tunesmith renders prompts with the tokenizer's own chat template (`template: auto`,
the default): the format a model was trained on is then never hand-copied. A
base model often ships without a template, or with one that is not the format
you want to fine-tune into; `template: <name>` picks one of the Jinja templates
below instead (the names follow LLaMA-Factory's). Every template here is plain
Jinja for `tokenizer.apply_chat_template`, so the same string can be saved into
the fine-tuned tokenizer and is then what transformers, vLLM and the chat CLI use.

Every other name of LLaMA-Factory's template registry (data/lf_templates.py) resolves too: to the
tokenizer's own template (with `enable_thinking=False` for the *_nothink variants), or to an error
naming the model family it is for and what to use instead.

Message content may be a string or a list of `{"type": "text", "text": ...}`
parts (the OpenAI shape); the parts' texts are concatenated.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from tunesmith.errors import ModelError

from .lf_templates import LF_TEMPLATES, OWN, REFUSED


@dataclass(frozen=True)
class TemplateSpec:
    """One named template.

    chat_template: the Jinja text, or None for "the tokenizer's own".
    render_kwargs: extra variables passed to `apply_chat_template` (e.g. enable_thinking).
    strip_think: the template drops `<think>` blocks from some assistant turns
        (history turns for qwen3, every turn for the *_nothink ones), so those
        tokens of the data are never trained on.
    stop_words: tokens that end an assistant turn; empty for `auto` (found from the tokenizer).
    family_tokens: for an LLaMA-Factory name rendered by the tokenizer's own template, special tokens
        every tokenizer of that name's family has; a tokenizer lacking one is refused for the name.
    family: the models such a name is for, in words (for that refusal).
    """

    name: str
    chat_template: str | None
    description: str
    render_kwargs: dict = field(default_factory=dict)
    strip_think: bool = False
    stop_words: tuple[str, ...] = ()
    family_tokens: tuple[str, ...] = ()
    family: str = ""


# --- Jinja building blocks --------------------------------------------------
# All output goes through {{- ... -}} so the template's own layout adds no
# whitespace (transformers renders with trim_blocks/lstrip_blocks, vLLM may not).

# Content as text: a string, or the concatenated texts of a list of parts.
_TEXT_MACRO = r"""
{%- macro text(content) -%}
  {%- if content is string -%}{{- content -}}
  {%- elif content is iterable -%}
    {%- for part in content -%}
      {%- if part.type == 'text' -%}{{- part.text -}}
      {%- else -%}{{- raise_exception("this template cannot render " + part.type + " input") -}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
"""

# Qwen-VL models: image and video parts become the vision markers the processor expands.
_QWEN_TEXT_MACRO = r"""
{%- macro text(content) -%}
  {%- if content is string -%}{{- content -}}
  {%- elif content is iterable -%}
    {%- for part in content -%}
      {%- if part.type == 'text' -%}{{- part.text -}}
      {%- elif part.type == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
      {%- elif part.type == 'video' -%}{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
      {%- else -%}{{- raise_exception("this template cannot render " + part.type + " input") -}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
"""

_NO_TOOLS = r"""
{%- if tools -%}{{- raise_exception("template '@NAME@' cannot render tools; use template qwen or qwen3, or drop the tools column") -}}{%- endif -%}
"""

# Qwen's tool prompt: the function signatures as JSON lines inside <tools></tools>,
# in the system turn, after the system prompt.
_QWEN_SYSTEM = r"""
{%- set system = text(messages[0].content) if messages[0].role == 'system' else @DEFAULT_SYSTEM@ -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if system -%}{{- system + '\n\n' -}}{%- endif -%}
  {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
  {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
  {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments '
      'within <tool_call></tool_call> XML tags:\n<tool_call>\n'
      '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif system -%}
  {{- '<|im_start|>system\n' + system + '<|im_end|>\n' -}}
{%- endif -%}
"""

# Index of the last real user query (a user turn that only wraps tool responses
# does not count): qwen3 keeps reasoning only on assistant turns after it.
_QWEN_LAST_QUERY = r"""
{%- set ns = namespace(last_query=-1) -%}
{%- for message in messages -%}
  {%- set content = text(message.content) -%}
  {%- if message.role == 'user' and not (content.startswith('<tool_response>') and content.endswith('</tool_response>')) -%}
    {%- set ns.last_query = loop.index0 -%}
  {%- endif -%}
{%- endfor -%}
"""

# The assistant turn's think handling is spliced in at @ASSISTANT@.
_QWEN_MESSAGES = r"""
{%- for message in messages -%}
  {%- set content = text(message.content) -%}
  {%- if message.role == 'system' and loop.first -%}
  {%- elif message.role == 'user' or message.role == 'system' -%}
    {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' -}}
  {%- elif message.role == 'assistant' -%}
    @ASSISTANT@
    {%- for tool_call in message.tool_calls or [] -%}
      {%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
      {%- set call = tool_call.function if tool_call.function is defined else tool_call -%}
      {%- set arguments = call.arguments if call.arguments is string else (call.arguments | tojson) -%}
      {{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' + arguments + '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + content + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
"""

# qwen3: reasoning comes from `reasoning_content` or a <think> block in the
# content; it is kept only on turns after the last user query, and the final
# turn always carries a (possibly empty) think block.
_QWEN3_ASSISTANT = r"""
    {%- set reasoning = '' -%}
    {%- if message.reasoning_content is string -%}
      {%- set reasoning = message.reasoning_content -%}
    {%- elif '</think>' in content -%}
      {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
      {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
    {%- endif -%}
    {%- set reasoning = reasoning.strip('\n') -%}
    {%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}
      {{- '<|im_start|>assistant\n<think>\n' + reasoning + '\n</think>\n\n' + content.lstrip('\n') -}}
    {%- else -%}
      {{- '<|im_start|>assistant\n' + content -}}
    {%- endif -%}
"""

# *_nothink: a <think> block at the start of the content is dropped, everywhere.
_NOTHINK_ASSISTANT = r"""
    {%- if content.lstrip().startswith('<think>') and '</think>' in content -%}
      {%- set content = content.split('</think>', 1)[1].lstrip('\n') -%}
    {%- endif -%}
    {{- '<|im_start|>assistant\n' + content -}}
"""

_PLAIN_ASSISTANT = r"""
    {{- '<|im_start|>assistant\n' + content -}}
"""

_CHATML_PROMPT = r"""
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

_QWEN3_PROMPT = r"""
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
"""

_CHATML_MESSAGES = r"""
{%- for message in messages -%}
  {%- if message.tool_calls -%}{{- raise_exception("template 'chatml' cannot render tool calls; use template qwen or qwen3") -}}{%- endif -%}
  {{- '<|im_start|>' + message.role + '\n' + text(message.content) + '<|im_end|>\n' -}}
{%- endfor -%}
"""

# Llama 3: content is trimmed, as Meta's template does; tool results use the ipython role.
_LLAMA3_MESSAGES = r"""
{{- '<|begin_of_text|>' -}}
{%- for message in messages -%}
  {%- if message.tool_calls -%}{{- raise_exception("template 'llama3' cannot render tool calls; use template qwen or qwen3") -}}{%- endif -%}
  {%- set role = 'ipython' if message.role == 'tool' else message.role -%}
  {{- '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + text(message.content) | trim + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}
"""


# PaliGemma (1 and 2): no chat turns. The prompt is the images' <image> tokens, <bos>, the text and a newline
# (the prefix, which the model attends both ways); the answer follows with <eos> (the causal suffix). A later turn
# continues the same way: its images, its text and a newline, its answer and <eos>.
_PALIGEMMA = r"""
{%- if tools -%}{{- raise_exception("template 'paligemma' cannot render tools; drop the tools column") -}}{%- endif -%}
{%- for message in messages -%}
  {%- set parts = [{'type': 'text', 'text': message.content}] if message.content is string else message.content -%}
  {%- for part in parts -%}
    {%- if part.type == 'image' -%}{{- '<image>' -}}
    {%- elif part.type != 'text' -%}{{- raise_exception("PaliGemma takes images and text, not " + part.type) -}}
    {%- endif -%}
  {%- endfor -%}
  {%- if loop.first -%}{{- bos_token -}}{%- endif -%}
  {%- for part in parts if part.type == 'text' -%}{{- part.text -}}{%- endfor -%}
  {{- eos_token if message.role == 'assistant' else '\n' -}}
{%- endfor -%}
"""


def _join(*parts: str) -> str:
    return "\n".join(p.strip("\n") for p in parts)


def _qwen(assistant: str, prompt: str, default_system: str = "''") -> str:
    """A Qwen-family template: system + tools, messages, generation prompt."""
    system = _QWEN_SYSTEM.replace("@DEFAULT_SYSTEM@", default_system)
    messages = _QWEN_MESSAGES.replace("@ASSISTANT@", assistant.strip("\n"))
    return _join(_QWEN_TEXT_MACRO, system, _QWEN_LAST_QUERY, messages, prompt)


_CHATML = _join(_QWEN_TEXT_MACRO, _NO_TOOLS.replace("@NAME@", "chatml"), _CHATML_MESSAGES, _CHATML_PROMPT)
_LLAMA3 = _join(_TEXT_MACRO, _NO_TOOLS.replace("@NAME@", "llama3"), _LLAMA3_MESSAGES)
_QWEN3 = _qwen(_QWEN3_ASSISTANT, _QWEN3_PROMPT)
_QWEN3_NOTHINK = _qwen(_NOTHINK_ASSISTANT, _CHATML_PROMPT)
QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."  # Qwen2.5's and LF's
_QWEN25 = _qwen(_PLAIN_ASSISTANT, _CHATML_PROMPT, default_system=repr(QWEN25_SYSTEM))

_IM_END = ("<|im_end|>",)

TEMPLATES: dict[str, TemplateSpec] = {
    spec.name: spec
    for spec in (
        TemplateSpec("auto", None, "The tokenizer's own chat template (the default)."),
        TemplateSpec("chatml", _CHATML, "Plain ChatML: <|im_start|>role ... <|im_end|>, no default system, no tools.",
                     stop_words=_IM_END),
        TemplateSpec("qwen", _QWEN25, "Qwen2.5: ChatML with Qwen tool calls and Qwen2.5's default system prompt "
                     f"'{QWEN25_SYSTEM}'", stop_words=_IM_END),
        TemplateSpec("qwen3", _QWEN3, "Qwen3 with reasoning: <think> kept after the last user query only; "
                     "enable_thinking=false closes an empty think block in the prompt.",
                     strip_think=True, stop_words=_IM_END),
        TemplateSpec("qwen3_nothink", _QWEN3_NOTHINK, "Qwen3 without reasoning: <think> blocks are stripped "
                     "from every assistant turn.", strip_think=True, stop_words=_IM_END),
        TemplateSpec("qwen3_vl_nothink", _QWEN3_NOTHINK, "Qwen3-VL instruct models: the qwen3_nothink text format.",
                     strip_think=True, stop_words=_IM_END),
        TemplateSpec("paligemma", _PALIGEMMA, "PaliGemma / PaliGemma 2: the images, <bos>, the prompt and a "
                     "newline (attended both ways), then the answer and <eos>.", stop_words=("<eos>",)),
        TemplateSpec("llama3", _LLAMA3, "Llama 3 instruct: <|start_header_id|>role<|end_header_id|> ... <|eot_id|>.",
                     stop_words=("<|eot_id|>",)),
    )
}

# End-of-turn tokens recognised in a tokenizer's own template (`auto`).
_KNOWN_STOP_WORDS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>", "<|return|>")


def _own_spec(name: str) -> TemplateSpec:
    """An LLaMA-Factory name rendered by the tokenizer's own template."""
    row = LF_TEMPLATES[name]
    kwargs = {} if row.enable_thinking is None else {"enable_thinking": row.enable_thinking}
    thinking = "" if row.enable_thinking is None else " with enable_thinking=false"
    return TemplateSpec(name, None, f"{row.family}: the tokenizer's own chat template{thinking}.",
                        render_kwargs=kwargs, strip_think=row.enable_thinking is False,
                        family_tokens=row.tokens, family=row.family)


def get_template(name: str) -> TemplateSpec:
    """The template called `name` (tunesmith's or LLaMA-Factory's).

    A ModelError for an LLaMA-Factory name of an unsupported family (naming it and the fix), and for an
    unknown name (naming the closest and tunesmith's own).
    """
    if name in TEMPLATES:
        return TEMPLATES[name]
    row = LF_TEMPLATES.get(name)
    if row is not None and row.use == OWN:
        return _own_spec(name)
    if row is not None and row.use == REFUSED:
        raise ModelError(row.refusal())
    known = sorted(TEMPLATES)
    close = difflib.get_close_matches(str(name), known + sorted(LF_TEMPLATES), n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise ModelError(f"Unknown template '{name}'.{hint} Known templates: {', '.join(known)}, and the names of "
                     f"LLaMA-Factory's template registry (docs/models.md).")


def _own_template(tokenizer) -> str | None:
    """The tokenizer's (or processor's) template; the 'default' one when it has several."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    return template or None


def _check_family(tokenizer, spec: TemplateSpec) -> None:
    """An LLaMA-Factory family name on a tokenizer of another family is an error, not a silent `auto`."""
    vocab = getattr(tokenizer, "tokenizer", tokenizer).get_vocab() if spec.family_tokens else {}
    missing = [token for token in spec.family_tokens if token not in vocab]
    if missing:
        raise ModelError(
            f"Template '{spec.name}' is for {spec.family} models, but the tokenizer of this model "
            f"({getattr(tokenizer, 'name_or_path', '?')}) lacks their tokens {missing}, so it is not one of them. "
            f"Use template: auto (the model's own chat template), or the template of this model's family.")


def resolve(tokenizer, name: str = "auto") -> tuple[str, dict]:
    """The Jinja text to render with and the kwargs for `apply_chat_template`."""
    spec = get_template(name)
    if spec.chat_template is not None:
        return spec.chat_template, dict(spec.render_kwargs)
    _check_family(tokenizer, spec)
    template = _own_template(tokenizer)
    if template is None:
        names = ", ".join(n for n in TEMPLATES if n != "auto")
        raise ModelError(
            f"The tokenizer of this model ({getattr(tokenizer, 'name_or_path', '?')}) has no chat template, so "
            f"`template: auto` cannot be used. Set the template that matches the model, e.g. `template: chatml` "
            f"(one of: {names})."
        )
    return template, dict(spec.render_kwargs)


def stop_tokens(tokenizer, name: str = "auto") -> list[str]:
    """Tokens that end an assistant turn (for generation and eos ids).

    For a named template they must be single tokens of the vocabulary; otherwise
    the model could never emit them and generation would not stop.
    """
    spec = get_template(name)
    vocab = tokenizer.get_vocab()
    if spec.stop_words:
        missing = [w for w in spec.stop_words if w not in vocab]
        if missing:
            raise ModelError(
                f"Template '{name}' ends turns with {missing}, which the tokenizer "
                f"({getattr(tokenizer, 'name_or_path', '?')}) does not have as a token. "
                f"Pick the template of this model's family (or `template: auto`)."
            )
        return list(spec.stop_words)
    template = resolve(tokenizer, name)[0]
    words = [w for w in _KNOWN_STOP_WORDS if w in template and w in vocab]
    eos = getattr(tokenizer, "eos_token", None)
    if eos and eos not in words:
        words.append(eos)
    return words
