from tunesmith.infer.chat import _stream, strip_empty_think


def test_strip_empty_think_only_removes_an_empty_leading_block():
    assert strip_empty_think("<think>\n\n</think>\n\nHello") == "Hello"
    assert strip_empty_think("<think>plan</think>Hi") == "<think>plan</think>Hi"
    assert strip_empty_think("Hello <think></think>") == "Hello <think></think>"


def test_stream_hides_empty_think_block(capsys):
    pieces = ["<th", "ink>", "\n\n</think>", "\n\nI am", " here"]
    assert _stream(iter(pieces)) == "I am here"
    assert capsys.readouterr().out.strip() == "I am here"


def test_stream_without_think_prints_everything(capsys):
    assert _stream(iter(["Hi", " there"])) == "Hi there"
    assert capsys.readouterr().out.strip() == "Hi there"


def test_stream_shows_a_think_block_that_never_closes(capsys):
    # the reply ran out of tokens while thinking: the thinking is shown as it is, not swallowed
    pieces = ["<th", "ink>", "\nI am still", " thinking"]
    assert _stream(iter(pieces)) == "<think>\nI am still thinking"
    assert capsys.readouterr().out.strip() == "<think>\nI am still thinking"


def test_stream_shows_a_closed_think_block_with_its_answer(capsys):
    assert _stream(iter(["<think>", "plan", "</think>", "Hi"])) == "<think>plan</think>Hi"
    assert capsys.readouterr().out.strip() == "<think>plan</think>Hi"


def test_stream_with_a_think_opened_by_the_prompt(capsys):
    # templates whose generation prompt ends with <think>: the reply starts inside the block
    assert _stream(iter(["\n\n</think>", "\n\nHello"]), prefix="<think>") == "Hello"
    assert capsys.readouterr().out.strip() == "Hello"
    assert _stream(iter(["still thinking"]), prefix="<think>") == "<think>still thinking"
    assert capsys.readouterr().out.strip() == "<think>still thinking"


def test_finish_reply_keeps_an_unclosed_think_block():
    from tunesmith.infer.chat import finish_reply

    assert finish_reply("<think>\nreasoning that ran out of tokens") == "<think>\nreasoning that ran out of tokens"
    assert finish_reply("  <think></think>  Hi ") == "Hi"


class _StubModel:
    """generate() appends fixed token ids to the prompt: a reply we choose, through the real decode path."""

    def __init__(self, reply_ids):
        import torch
        from transformers import GenerationConfig

        self.reply_ids = torch.tensor([reply_ids])
        self.generation_config = GenerationConfig(eos_token_id=None)
        self.device = torch.device("cpu")
        self.calls = []

    def generate(self, input_ids, **kwargs):
        import torch

        self.calls.append(kwargs)
        return torch.cat([input_ids, self.reply_ids], dim=1)


def test_generate_returns_an_unclosed_think_reply(tiny_qwen3):
    from transformers import AutoTokenizer

    from tunesmith.infer.chat import generate
    from tunesmith.infer.options import GenerationKeys

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    reply = "<think>I am still thinking"
    model = _StubModel(tokenizer(reply, add_special_tokens=False).input_ids)
    answer = generate(model, tokenizer, [{"role": "user", "content": "hi"}], generation=GenerationKeys())
    assert answer == reply
    assert model.calls[0]["do_sample"] is False and model.calls[0]["max_new_tokens"] == 1024


def test_generation_keys_map_to_generate_kwargs():
    from tunesmith.infer.options import GenerationKeys

    assert GenerationKeys().generate_kwargs() == {"max_new_tokens": 1024, "do_sample": False, "num_beams": 1}
    sampled = GenerationKeys(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.1).generate_kwargs()
    assert sampled == {"max_new_tokens": 1024, "do_sample": True, "num_beams": 1, "temperature": 0.7, "top_p": 0.8,
                       "top_k": 20, "repetition_penalty": 1.1}
    # LLaMA-Factory's do_sample: true without a temperature samples at its default 0.95
    assert GenerationKeys(do_sample=True).generate_kwargs()["temperature"] == 0.95
    # ...and LLaMA-Factory's top_p and top_k when the YAML sets only a temperature
    assert {k: v for k, v in GenerationKeys(temperature=0.7).generate_kwargs().items() if k.startswith("top")} == \
        {"top_p": 0.7, "top_k": 50}
    assert GenerationKeys(temperature=0.7, do_sample=False).generate_kwargs()["do_sample"] is False
    # top_k 0 (or null) is passed as 0, off: left out, generate would take the model's generation_config top_k
    assert GenerationKeys(temperature=0.7, top_k=0).generate_kwargs()["top_k"] == 0
    assert GenerationKeys(temperature=0.7, top_k=None).generate_kwargs()["top_k"] == 0
