"""Every relative link in README.md and docs/*.md points at a file that exists, and at a heading
that exists when it names one (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)")
_CODE_SPAN = re.compile(r"`[^`]*`")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code removed."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(_CODE_SPAN.sub("", line))
    return out


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens,
    repeats numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"^#{1,6} ", line):
            continue
        title = line.lstrip("#").strip().replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(page: Path) -> list[str]:
    return [m.group(1) for line in prose_lines(page.read_text()) for m in _LINK.finditer(line)]


def test_the_pages_are_found_and_link_to_each_other():
    assert len(PAGES) > 5
    readme_links = links(REPO / "README.md")
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in readme_links, f"README.md's contents list does not link {page.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(REPO) if file.is_relative_to(REPO) else file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(f"{target}: no heading with anchor #{anchor} in {file.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)} has broken links:\n" + "\n".join(broken)


def test_the_anchor_rule_matches_githubs():
    text = "# Strategies, FSDP and resuming\n## Kubeflow Trainer v2 (TrainJob)\n### `kubernetes.elastic`\n## A\n## A\n"
    assert anchors(text) == {
        "strategies-fsdp-and-resuming",
        "kubeflow-trainer-v2-trainjob",
        "kuberneteselastic",
        "a",
        "a-1",
    }


pytestmark = pytest.mark.timeout(120)


def test_the_readme_has_the_credentials_section_errors_point_to():
    readme = (REPO / "README.md").read_text()
    assert "\n### Credentials\n" in readme or "\n## Credentials\n" in readme
