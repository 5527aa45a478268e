"""Every option of every command explains itself."""

import argparse
import typing

import pytest

from tunesmith.cli import chat_parser, export_parser, literal_choices, score_parser, train_help
from tunesmith.config.schema import GROUPS


def test_every_config_field_is_described_and_in_train_help():
    helptext = train_help()
    lines = helptext.splitlines()
    for group, cls in GROUPS.items():
        assert f"{group}:" in lines
        for key, field in cls.model_fields.items():
            assert field.description and field.description.strip(), f"{group}.{key} has no description"
            line = next((ln for ln in lines if ln.split()[:1] == [key]), None)
            assert line is not None, f"{key} missing from `tunesmith train --help`"
            assert field.description in line, key
            assert "[default: " in line, key


@pytest.mark.parametrize("key", ["flash_attn", "lr_scheduler_type", "policy_loss"])
def test_literal_choices_are_listed(key):
    field = next(cls.model_fields[key] for cls in GROUPS.values() if key in cls.model_fields)
    choices = typing.get_args(field.annotation)
    assert choices
    line = next(ln for ln in train_help().splitlines() if ln.split()[:1] == [key])
    assert f"[choices: {', '.join(choices)}]" in line


def test_every_literal_field_lists_its_choices():
    lines = train_help().splitlines()
    for cls in GROUPS.values():
        for key, field in cls.model_fields.items():
            choices = literal_choices(field.annotation)
            line = next(ln for ln in lines if ln.split()[:1] == [key])
            assert ("[choices: " in line) == bool(choices), key


def test_literal_choices_inside_optional_and_union():
    assert literal_choices(typing.Optional[typing.Literal["a", "b"]]) == ["a", "b"]
    assert literal_choices(typing.Union[int, typing.Literal["x"], None]) == ["x"]
    assert literal_choices(typing.Literal[1, 2] | None) == [1, 2]
    assert literal_choices(int | None) is None
    assert literal_choices(str) is None


@pytest.mark.parametrize("build", [chat_parser, export_parser, score_parser])
def test_every_argparse_option_has_help(build):
    parser = build()
    options = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    assert options
    for action in options:
        assert action.help and action.help.strip(), f"{parser.prog} {action.option_strings[0]} has no help"


def test_named_options_say_what_they_do():
    export = {a.dest: a for a in export_parser()._actions}
    assert "dtype of the written weights" in export["export_dtype"].help
    assert "export_size" in export and "shard" in export["export_size"].help
    score = {a.dest: a for a in score_parser()._actions}
    assert "records scored per forward" in score["batch_size"].help


def test_chat_and_export_help_list_their_yaml_keys():
    from tunesmith.infer.options import CHAT_GROUPS, EXPORT_GROUPS

    for parser, groups in ((chat_parser(), CHAT_GROUPS), (export_parser(), EXPORT_GROUPS)):
        text = parser.format_help()
        assert "[cfg.yaml]" in text
        text = text[text.index("YAML keys"):]
        for cls in groups.values():
            for key, field in cls.model_fields.items():
                line = next((ln for ln in text.splitlines() if ln.split()[:1] == [key]), None)
                assert line is not None and field.description in line, f"{parser.prog}: {key}"


def test_help_into_a_closed_pipe_ends_quietly():
    """`tunesmith train --help | head`: the reader leaves early; no BrokenPipeError traceback."""
    import os
    import subprocess
    import sys

    code = ("import sys, time; time.sleep(2); from tunesmith.cli import run; "
            "sys.argv = ['tunesmith', 'train', '--help']; run()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    proc.stdout.close()  # before it writes
    assert proc.stderr.read().decode() == "" and proc.wait() == 1
