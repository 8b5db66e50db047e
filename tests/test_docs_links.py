"""Every relative link and image in README.md and docs/*.md names a file that is in the repository:
a page of findings whose plots or records are missing does not count (issue 42)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_every_relative_link_of_the_docs_resolves():
    missing = []
    for page in _pages():
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                missing.append(f"{page.relative_to(REPO)}: {target}")
    assert missing == []


def test_the_findings_page_is_one_page_linked_from_the_readme():
    findings = REPO / "docs" / "FINDINGS.md"
    assert len(findings.read_text(encoding="utf-8").splitlines()) <= 150
    first_screen = "\n".join((REPO / "README.md").read_text(encoding="utf-8").splitlines()[:20])
    assert "docs/FINDINGS.md" in first_screen
