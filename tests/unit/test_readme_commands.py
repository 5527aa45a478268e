"""Running the README's commands one after another never overwrites an earlier run: every training command
(and the quickstart script's) writes to its own output_dir, and no example asks to overwrite."""

import re
import shlex

from conftest import REPO
from tunesmith.config.load import build_config, parse_cli_items, read_yaml


def _train_commands(text: str) -> list[list[str]]:
    return [shlex.split(m.group(1).split("#")[0]) for m in re.finditer(r"^tunesmith train (.+)$", text, re.M)]


def test_readme_training_commands_write_to_distinct_folders_and_never_overwrite():
    readme = _train_commands((REPO / "README.md").read_text(encoding="utf-8"))
    assert readme, "the README shows no `tunesmith train` command"
    quickstart = _train_commands((REPO / "scripts" / "quickstart.sh").read_text(encoding="utf-8"))
    outs = []
    for args in readme:
        cfg = build_config(*parse_cli_items(args))
        assert not cfg.output.overwrite_output_dir, args
        outs.append(cfg.output.output_dir)
    outs += [build_config(*parse_cli_items(args)).output.output_dir for args in quickstart]
    assert len(outs) == len(set(outs)), outs


def test_no_example_yaml_asks_to_overwrite_and_each_has_its_own_folder():
    outs = {}
    for path in sorted((REPO / "examples").glob("*.yaml")):
        data = read_yaml(path)
        assert "overwrite_output_dir" not in data, path.name
        outs.setdefault(data.get("output_dir"), []).append(path.name)
    assert all(len(names) == 1 for names in outs.values()), outs
