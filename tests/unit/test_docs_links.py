"""Every relative link in README.md and docs/*.md points to a file that exists, and every #anchor to a heading.

docs/architecture.md is the one target allowed to be missing (it is being written separately); any other
missing file or heading fails the test, which lists them all.
"""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO

ALLOWED_MISSING = {REPO / "docs" / "architecture.md"}

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def links(text: str) -> list[str]:
    return _LINK.findall(_prose(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", text)):
        base = slug(heading)
        count = seen.get(base, 0)
        out.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return out


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    """'page: target -> what is wrong' for each relative link of the page at `path` that does not resolve."""
    problems = []
    for target in links(path.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = path.relative_to(root)
        if not resolved.exists():
            if resolved not in ALLOWED_MISSING:
                problems.append(f"{where}: {target} -> missing {resolved}")
            continue
        if fragment and resolved.suffix == ".md" and fragment not in anchors(resolved.read_text(encoding="utf-8")):
            problems.append(f"{where}: {target} -> no heading '#{fragment}' in {resolved.name}")
    return problems


def test_slug_follows_github():
    assert slug("dataset_info.json") == "dataset_infojson"
    assert slug("Learning demo: click the named button (vision-language)") == \
        "learning-demo-click-the-named-button-vision-language"
    assert slug("`tunesmith estimate` against the peaks") == "tunesmith-estimate-against-the-peaks"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_link_extraction_skips_code():
    text = "see [a](a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n[d](d.md#x \"title\")"
    assert links(text) == ["a.md", "d.md#x"]


def test_checker_reports_a_missing_file_and_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n## Real heading\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#real-heading) [b](other.md) [c](#local) [d](https://example.org/x)\n"
                    "[x](nope.md) [y](other.md#no-such-heading) [z](#missing)\n## Local\n")
    problems = broken_links(page, root=tmp_path)
    assert [p.split(" -> ")[0] for p in problems] == ["page.md: nope.md", "page.md: other.md#no-such-heading",
                                                     "page.md: #missing"]


def test_readme_and_docs_links_resolve():
    files = doc_files()
    assert (REPO / "README.md") in files and len(files) > 1
    problems = [p for path in files for p in broken_links(path)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_stays_a_front_page():
    assert len((REPO / "README.md").read_bytes()) <= 12_000
