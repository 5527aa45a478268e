"""Function-call turns (sharegpt's function_call, OpenAI's tool_calls) keep their tool-call form through
conversion and rendering, and are supervised as the assistant turns they are (as LLaMA-Factory does)."""

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tunesmith.data.formats import convert_rows
from tunesmith.data.registry import DatasetSpec
from tunesmith.data.render import IGNORE_INDEX, RenderOptions, render_sft
from tunesmith.data.sample import make_sample, template_messages, template_tools
from tunesmith.data.sources import rows_from_records
from tunesmith.data.templates import resolve
from tunesmith.errors import DataError
from tunesmith.models.tiny.build import ARCHS
from tunesmith.models.tiny.common import build_tokenizer

REAL_QWEN3 = Path(__file__).resolve().parents[2] / "fixtures" / "chat_templates" / "qwen3.jinja"
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
RENDERED_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SHAREGPT = {"conversations": [
    {"from": "human", "value": "Weather in Paris?"},
    {"from": "function_call", "value": json.dumps(CALL)},
    {"from": "observation", "value": '{"temp": 21}'},
    {"from": "gpt", "value": "It is 21 degrees."},
], "tools": json.dumps([{"name": "get_weather", "description": "Weather of a city",
                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}])}


def _convert(records, formatting="sharegpt", skip=False, **spec):
    spec = {"file_name": "x.json", "formatting": formatting, **spec}
    return convert_rows(rows_from_records(records, ["x.json"]), "calls", DatasetSpec(**spec), "/data", stage="sft",
                        placeholders={}, skip_bad_samples=skip)


def _sharegpt(records=(SHAREGPT,), **kw):
    columns = {"messages": "conversations", **({"tools": "tools"} if "tools" in records[0] else {})}
    return _convert(list(records), columns=columns, **kw)


def _opts(tok, name):
    template, kwargs = resolve(tok, name)
    return RenderOptions(chat_template=template, render_kwargs=kwargs)


def _supervised(tok, out) -> str:
    return tok.decode([t for t, label in zip(out["input_ids"], out["labels"]) if label != IGNORE_INDEX])


def test_a_function_call_turn_becomes_an_assistant_turn_with_its_calls():
    ds, skipped = _sharegpt()
    assert skipped == 0
    messages = ds[0]["messages"]
    assert messages[1]["role"] == "assistant" and messages[1]["content"] == ""
    assert json.loads(messages[1]["tool_calls"]) == [CALL]
    assert [m["tool_calls"] for i, m in enumerate(messages) if i != 1] == ["", "", ""]


def test_a_list_of_calls_and_openai_tool_calls_with_json_text_arguments():
    two = {"conversations": [{"from": "human", "value": "q"},
                             {"from": "function_call", "value": json.dumps([CALL, {"name": "now", "arguments": {}}])},
                             {"from": "observation", "value": "r"}, {"from": "gpt", "value": "a"}]}
    ds, _ = _sharegpt([two])
    assert [c["name"] for c in json.loads(ds[0]["messages"][1]["tool_calls"])] == ["get_weather", "now"]
    openai = {"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "r"}, {"role": "assistant", "content": "a"}]}
    ds, _ = _convert([openai], formatting="sharegpt", columns={"messages": "messages"},
                     tags={"role_tag": "role", "content_tag": "content", "user_tag": "user",
                           "assistant_tag": "assistant", "observation_tag": "tool", "system_tag": "system"})
    assert json.loads(ds[0]["messages"][1]["tool_calls"]) == [CALL]


@pytest.mark.parametrize("value", ["get_weather(city='Paris')", '{"arguments": {}}', "[]"])
def test_a_function_call_that_is_not_a_call_names_the_record(value):
    bad = {"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": value},
                             {"from": "observation", "value": "r"}, {"from": "gpt", "value": "a"}]}
    with pytest.raises(DataError, match=r"dataset 'calls', record 0: message 1.*function call"):
        _sharegpt([bad])


@pytest.mark.parametrize("name", ["qwen", "qwen3", "qwen3_nothink"])
def test_qwen_templates_render_and_supervise_the_call(tiny_qwen3, name):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    ds, _ = _sharegpt()
    sample = ds[0]
    opts = _opts(tok, name)
    out = render_sft(sample, tok, opts)
    expected = tok.apply_chat_template(template_messages(sample["messages"]), tools=template_tools(sample),
                                       chat_template=opts.chat_template, tokenize=True, return_dict=False,
                                       **opts.render_kwargs)
    assert out["input_ids"] == list(expected)
    assert RENDERED_CALL in tok.decode(out["input_ids"])
    supervised = _supervised(tok, out)
    assert RENDERED_CALL + "<|im_end|>" in supervised and "It is 21 degrees.<|im_end|>" in supervised
    assert "temp" not in supervised and "Weather in" not in supervised


def test_the_real_qwen3_template_supervises_a_call_in_the_history():
    tok = build_tokenizer(ARCHS["qwen3"])
    tok.chat_template = REAL_QWEN3.read_text(encoding="utf-8")
    ds, _ = _sharegpt()
    out = render_sft(ds[0], tok, RenderOptions())
    assert out["input_ids"] == list(tok.apply_chat_template(
        template_messages(ds[0]["messages"]), tools=template_tools(ds[0]), tokenize=True, return_dict=False))
    assert RENDERED_CALL + "<|im_end|>" in _supervised(tok, out)


def test_a_template_without_tool_calls_is_refused_not_trained_as_an_empty_answer(tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    ds, _ = _sharegpt([{"conversations": SHAREGPT["conversations"]}])
    with pytest.raises(DataError, match="record 0.*cannot render tool calls"):
        render_sft(ds[0], tok, _opts(tok, "chatml"))
    ignoring = ("{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
                "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
    with pytest.raises(DataError, match="record 0.*calls 'get_weather'.*does not render tool calls"):
        render_sft(ds[0], tok, RenderOptions(chat_template=ignoring))


def test_samples_built_in_code_take_tool_calls_as_a_list():
    sample = make_sample([{"role": "user", "content": "q"},
                          {"role": "assistant", "content": "", "tool_calls": [CALL]}], source="s", index=0)
    assert json.loads(sample["messages"][1]["tool_calls"]) == [CALL]
    assert template_messages(sample["messages"])[1]["tool_calls"] == [{"type": "function", "function": CALL}]


def test_bare_function_specs_are_wrapped_as_openai_tools(tiny_qwen3):
    """LLaMA-Factory's tools column holds bare specs; the model sees them as an OpenAI request gives them."""
    ds, _ = _sharegpt()
    (tool,) = template_tools(ds[0])
    assert tool["type"] == "function" and tool["function"]["name"] == "get_weather"
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    text = tok.decode(render_sft(ds[0], tok, _opts(tok, "qwen"))["input_ids"])
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert template_tools({"tools": json.dumps([tool])}) == [tool]


def test_rl_prompts_render_the_tools_column(tiny_qwen3):
    from tunesmith.data.prompts import render_prompt_batch

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    sample = make_sample([{"role": "user", "content": "Weather in Paris?"}], source="s", index=0,
                         tools=SHAREGPT["tools"])
    out = render_prompt_batch({k: [v] for k, v in sample.items()}, tok, RenderOptions(
        stage="grpo", **dict(zip(("chat_template", "render_kwargs"), resolve(tok, "qwen")))))
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in out["text"][0]
    assert out["text"][0].endswith("<|im_start|>assistant\n")


def test_tools_or_arguments_that_are_not_json_name_the_record():
    bad_tools = {**SHAREGPT, "tools": "not json ["}
    with pytest.raises(DataError, match=r"record 0: the tools column is not JSON"):
        _sharegpt([bad_tools])
    ds, skipped = _sharegpt([bad_tools, SHAREGPT], skip=True)
    assert skipped == 1 and len(ds) == 1
    openai = {"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}]},
        {"role": "tool", "content": "r"}, {"role": "assistant", "content": "a"}]}
    with pytest.raises(DataError, match=r"record 0: message 1: the arguments of the call to 'get_weather' are not"):
        _convert([openai], formatting="openai")


def test_openai_shaped_calls_given_in_code_are_stored_as_the_converter_stores_them():
    """A scored file's OpenAI messages ({"function": {...}} items, arguments as JSON text) reach the template once
    wrapped, not twice."""
    openai_call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    sample = make_sample([{"role": "user", "content": "q"},
                          {"role": "assistant", "content": "", "tool_calls": [openai_call]}], source="s", index=0)
    assert json.loads(sample["messages"][1]["tool_calls"]) == [CALL]
