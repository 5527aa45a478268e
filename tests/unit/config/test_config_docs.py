"""docs/config.md and docs/llamafactory-keys.md are what scripts/gen_config_docs.py writes from the schema and
the LLaMA-Factory key table: a change to either that is not regenerated fails here."""

import pytest
from conftest import REPO, load_script

from tunesmith.config.lf_keys import LF_KEYS


@pytest.fixture(scope="module")
def gen():
    return load_script("gen_config_docs")


@pytest.mark.parametrize("page, render", [("config.md", "render"), ("llamafactory-keys.md", "render_lf_keys")])
def test_generated_docs_are_up_to_date(gen, page, render):
    on_disk = (REPO / "docs" / page).read_text(encoding="utf-8")
    assert on_disk == getattr(gen, render)(), f"docs/{page} is out of date; run python scripts/gen_config_docs.py"


def test_every_llamafactory_key_has_a_row(gen):
    rows = {line.split("|")[1].strip().strip("`") for line in gen.render_lf_keys().splitlines()
            if line.startswith("| `")}
    assert set(LF_KEYS) <= rows


def test_migration_guide_links_the_key_table():
    assert "(llamafactory-keys.md)" in (REPO / "docs" / "migrating-from-llamafactory.md").read_text(encoding="utf-8")
