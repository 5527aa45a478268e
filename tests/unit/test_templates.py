"""Each named template renders exactly the format it names (the strings below pin it)."""

import pytest
from jinja2 import TemplateError
from transformers import AutoTokenizer

from tunesmith.data.templates import TEMPLATES, get_template, resolve, stop_tokens
from tunesmith.errors import ModelError

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Who are you?"},
    {"role": "assistant", "content": "<think>\nIntroduce myself.\n</think>\n\nI am tunesmith."},
    {"role": "user", "content": "Add 2 and 3."},
    {"role": "assistant", "content": "<think>\n2+3=5\n</think>\n\nIt is 5."},
]

_CHATML_HEAD = (
    "<|im_start|>system\nBe brief.<|im_end|>\n"
    "<|im_start|>user\nWho are you?<|im_end|>\n"
)
_NOTHINK = (
    _CHATML_HEAD
    + "<|im_start|>assistant\nI am tunesmith.<|im_end|>\n"
    "<|im_start|>user\nAdd 2 and 3.<|im_end|>\n"
    "<|im_start|>assistant\nIt is 5.<|im_end|>\n"
)
_VERBATIM = (  # templates that do not know about reasoning keep the content as given
    _CHATML_HEAD
    + "<|im_start|>assistant\n<think>\nIntroduce myself.\n</think>\n\nI am tunesmith.<|im_end|>\n"
    "<|im_start|>user\nAdd 2 and 3.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n2+3=5\n</think>\n\nIt is 5.<|im_end|>\n"
)

EXPECTED = {
    "chatml": _VERBATIM,
    "qwen": _VERBATIM,
    # history turn loses its reasoning; the last turn (after the last user query) keeps it
    "qwen3": (
        _CHATML_HEAD
        + "<|im_start|>assistant\nI am tunesmith.<|im_end|>\n"
        "<|im_start|>user\nAdd 2 and 3.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n2+3=5\n</think>\n\nIt is 5.<|im_end|>\n"
    ),
    "qwen3_nothink": _NOTHINK,
    "qwen3_vl_nothink": _NOTHINK,
    "llama3": (
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<think>\nIntroduce myself.\n</think>\n\n"
        "I am tunesmith.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nAdd 2 and 3.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<think>\n2+3=5\n</think>\n\nIt is 5.<|eot_id|>"
    ),
    # no turns: <bos>, each prompt and a newline, each answer and <eos> (rendered with the Llama tokenizer's)
    "paligemma": (
        "<|begin_of_text|>Be brief.\nWho are you?\n<think>\nIntroduce myself.\n</think>\n\nI am tunesmith.<|eot_id|>"
        "Add 2 and 3.\n<think>\n2+3=5\n</think>\n\nIt is 5.<|eot_id|>"
    ),
}
TOKENIZER_WITH_BOS = ("llama3", "paligemma")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
TOOL_CONVERSATION = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
    {"role": "tool", "content": "sunny"},
    {"role": "tool", "content": "rain"},
    {"role": "assistant", "content": "Paris is sunny, Rome is rainy."},
]


@pytest.fixture(scope="module")
def qwen_tok(tiny_qwen3):
    return AutoTokenizer.from_pretrained(tiny_qwen3)


@pytest.fixture(scope="module")
def llama_tok(tiny_llama):
    return AutoTokenizer.from_pretrained(tiny_llama)


def render(tok, name, messages, **kwargs):
    template, render_kwargs = resolve(tok, name)
    return tok.apply_chat_template(messages, chat_template=template, tokenize=False, **render_kwargs, **kwargs)


def test_every_template_is_pinned():
    assert set(EXPECTED) | {"auto"} == set(TEMPLATES)
    for spec in TEMPLATES.values():
        assert spec.description and "\n" not in spec.description


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_multi_turn_render_is_exact(name, qwen_tok, llama_tok):
    tok = llama_tok if name in TOKENIZER_WITH_BOS else qwen_tok
    assert render(tok, name, CONVERSATION) == EXPECTED[name]


def test_auto_uses_the_tokenizers_own_template(qwen_tok, llama_tok):
    assert render(qwen_tok, "auto", CONVERSATION) == EXPECTED["qwen3"]
    assert render(llama_tok, "auto", CONVERSATION) == EXPECTED["llama3"]


def test_auto_without_a_template_names_the_fix(tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    tok.chat_template = None
    with pytest.raises(ModelError, match="template: chatml"):
        resolve(tok, "auto")


def test_qwen_adds_default_system_only_when_missing(qwen_tok):
    assert render(qwen_tok, "qwen", [{"role": "user", "content": "Hi"}], add_generation_prompt=True) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "helpful" not in render(qwen_tok, "qwen", CONVERSATION)
    assert "helpful" not in render(qwen_tok, "chatml", CONVERSATION[1:])


def test_qwen3_generation_prompt_and_enable_thinking(qwen_tok):
    prompt = CONVERSATION[:2]
    assert render(qwen_tok, "qwen3", prompt, add_generation_prompt=True) == \
        _CHATML_HEAD + "<|im_start|>assistant\n"
    assert render(qwen_tok, "qwen3", prompt, add_generation_prompt=True, enable_thinking=False) == \
        _CHATML_HEAD + "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_qwen3_final_turn_gets_empty_think_and_reasoning_content_is_used(qwen_tok):
    plain = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    assert render(qwen_tok, "qwen3", plain) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello.<|im_end|>\n")
    field = [{"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello.", "reasoning_content": "\nGreet back.\n"}]
    assert render(qwen_tok, "qwen3", field) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nGreet back.\n</think>\n\nHello.<|im_end|>\n")


def test_qwen3_history_think_is_stripped(qwen_tok):
    text = render(qwen_tok, "qwen3", CONVERSATION)
    assert "Introduce myself" not in text and "2+3=5" in text


def test_qwen3_tools_calls_and_responses(qwen_tok):
    assert render(qwen_tok, "qwen3", TOOL_CONVERSATION, tools=TOOLS) == (
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
        "</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        "<|im_start|>assistant\nLet me check.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response>"
        "<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nParis is sunny, Rome is rainy.<|im_end|>\n"
    )


def test_qwen_puts_system_prompt_before_tools(qwen_tok):
    text = render(qwen_tok, "qwen", CONVERSATION, tools=TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\n")
    assert text.count("Be brief.") == 1


def test_nothink_strips_only_a_leading_think_block(qwen_tok):
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "  <think>hidden</think>\n\nShown."},
        {"role": "user", "content": "Tag?"},
        {"role": "assistant", "content": "Write <think>x</think> around it."},
    ]
    assert render(qwen_tok, "qwen3_nothink", messages) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nShown.<|im_end|>\n"
        "<|im_start|>user\nTag?<|im_end|>\n<|im_start|>assistant\nWrite <think>x</think> around it.<|im_end|>\n"
    )
    assert render(qwen_tok, "qwen3_nothink", CONVERSATION[:2], add_generation_prompt=True) == \
        _CHATML_HEAD + "<|im_start|>assistant\n"


def test_vl_nothink_joins_text_parts(qwen_tok):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Hi."}]}]
    assert render(qwen_tok, "qwen3_vl_nothink", messages) == (
        "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\nHi.<|im_end|>\n")


def test_llama3_trims_and_prompts(llama_tok):
    messages = [{"role": "user", "content": "  Hi \n"}]
    assert render(llama_tok, "llama3", messages, add_generation_prompt=True) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


@pytest.mark.parametrize("name", ["chatml", "llama3"])
def test_templates_without_tool_support_refuse_tools(name, qwen_tok, llama_tok):
    tok = llama_tok if name == "llama3" else qwen_tok
    with pytest.raises(TemplateError, match=f"template '{name}' cannot render tool"):
        render(tok, name, TOOL_CONVERSATION, tools=TOOLS)


def test_rendered_markers_are_single_tokens(qwen_tok):
    ids = qwen_tok.apply_chat_template(CONVERSATION, chat_template=resolve(qwen_tok, "qwen3")[0],
                                       tokenize=True, return_dict=False)
    pieces = qwen_tok.convert_ids_to_tokens(ids)
    assert pieces.count("<|im_start|>") == 5 and pieces.count("<|im_end|>") == 5
    assert pieces.count("<think>") == 1 and pieces.count("</think>") == 1


def test_unknown_template_suggests_the_closest():
    with pytest.raises(ModelError) as err:
        get_template("qwen_3")
    message = str(err.value)
    assert "'qwen_3'" in message and "Did you mean 'qwen3'?" in message
    assert all(name in message for name in TEMPLATES)


def test_stop_tokens(qwen_tok, llama_tok):
    assert stop_tokens(qwen_tok, "qwen3") == ["<|im_end|>"]
    assert stop_tokens(qwen_tok, "chatml") == ["<|im_end|>"]
    assert stop_tokens(llama_tok, "llama3") == ["<|eot_id|>"]
    assert stop_tokens(qwen_tok, "auto") == ["<|im_end|>"]
    assert stop_tokens(llama_tok, "auto") == ["<|eot_id|>"]
    with pytest.raises(ModelError, match="<\\|im_end\\|>"):
        stop_tokens(llama_tok, "chatml")
