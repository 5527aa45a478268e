"""docs/models.md's families and template-name tables are what scripts/gen_families_table.py writes from
models/families.py, the tiny builders, data/lf_templates.py and the end-to-end tests: a change to any of
them that is not regenerated fails here."""

import pytest
from conftest import REPO, load_script

from tunesmith.data.lf_templates import LF_TEMPLATES
from tunesmith.models.families import FAMILIES, TEXT_FAMILIES


@pytest.fixture(scope="module")
def gen():
    return load_script("gen_families_table")


@pytest.fixture(scope="module")
def node_ids(gen):
    return gen.collected_tests()


def test_models_page_is_up_to_date(gen, node_ids):
    on_disk = (REPO / "docs" / "models.md").read_text(encoding="utf-8")
    assert on_disk == gen.render_page(on_disk, node_ids), \
        "docs/models.md is out of date; run python scripts/gen_families_table.py"


def test_every_family_and_template_name_has_a_row(gen, node_ids):
    table = gen.families_table(node_ids).splitlines()[2:]
    assert [line.split("|")[1].strip() for line in table] == list({**TEXT_FAMILIES, **FAMILIES})
    names = {line.split("|")[1].strip().strip("`") for line in gen.templates_table().splitlines()[2:]}
    assert names == set(LF_TEMPLATES)


def test_stages_come_from_the_collected_tests(gen, node_ids):
    stages = gen.stages_tested(node_ids)
    assert {"sft full", "sft LoRA", "dpo", "grpo"} <= stages["gemma3"]
    assert stages["qwen2_audio"] == {"sft full", "sft LoRA", "dpo"}
    # every test function the table reads still exists: a renamed test must be renamed in the script too
    collected = {node.split("::")[1].split("[")[0] for node in node_ids}
    assert set(gen.STAGES_OF_TEST) <= collected
    assert stages == gen.stages_tested([n for n in node_ids] + ["tests/e2e/x.py::test_unknown[qwen3]"])
