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
