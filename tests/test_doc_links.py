"""Every relative link in README.md, docs/*.md and the committed benchmark results
(benchmarks/results/embedded/*.md) resolves: the file (or folder) exists, and a `#anchor`
names a heading of the markdown file it points at (GitHub's slug of the heading) or an
explicit `<a id=…>` / `<a name=…>` there. No network: links with a scheme (https:,
mailto:) are left alone."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:[^>]*?\s)?(?:id|name)=[\"']([^\"']+)[\"']", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "benchmarks" / "results" / "embedded").glob("*.md"))]
    return [f for f in files if f.is_file()]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code spans blanked."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, INLINE_CODE.sub("", line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces to
    hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    text = path.read_text(encoding="utf-8")
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        found += [(number, target) for target in INLINE_LINK.findall(line)]
        match = REFERENCE_DEF.match(line)
        if match:
            found.append((number, match.group(1)))
    return found


def broken(path: Path) -> list[str]:
    """What is wrong with each relative link of one markdown file."""
    problems = []
    for number, target in links(path):
        if SCHEME.match(target) or target.startswith("//"):
            continue
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{where}: no such file")
            continue
        if anchor and dest.is_file() and dest.suffix == ".md":
            if unquote(anchor).lower() not in anchors(dest):
                problems.append(f"{where}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    return problems


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    assert broken(path) == []


def test_readme_is_short() -> None:
    """The README is read in five minutes: the rest lives in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200


def test_checker_catches_a_broken_file_an_anchor_and_skips_code(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## Why? `engine diff`\n", "utf-8")
    page.write_text(
        "# Page\n\n"
        "[ok](other.md#why-engine-diff) [self](#page) [web](https://example.com/x.md)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere)\n"
        "`[code](not-a-link.md)`\n\n"
        "```\n[fenced](also-not-a-link.md)\n```\n",
        "utf-8")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        problems = broken(page)
    finally:
        ROOT = saved
    assert problems == ["page.md:4: missing.md: no such file",
                        "page.md:4: other.md#nowhere: no heading #nowhere in other.md"]
