"""The README and docs/ stay navigable: every relative link resolves, and the README stays short.

Checks every relative Markdown link (inline links, images and reference definitions) in
README.md and docs/**/*.md: the target file or folder exists, relative to the linking file,
and a link with a #anchor into a Markdown file names a heading of that file by its GitHub
slug. http(s) and mailto links, links in fenced code blocks and in inline code are ignored.
Standard library only: no torch, no network.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 300

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1)(?!\n[ \t]*\n)[\s\S])+?\1")
# [text](target) and ![alt](target); the text may hold one level of nested brackets
# (an image inside a link, inline code with brackets)
INLINE_LINK = re.compile(r"!?\[(?:(?!\n[ \t]*\n)[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)"
                         r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ANCHOR = re.compile(r"<a\s[^>]*(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...
MARKUP = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")  # a link in a heading slugs as its text


def markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("**/*.md"))]


def prose_lines(text: str):
    """(line number, line) for each line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), start=1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
                continue
            yield number, line
        elif match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence) \
                and not line.strip()[len(match.group(1)):].strip():
            fence = None


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lowercase; drop every character that is not a
    letter, a digit, a space, a hyphen or an underscore; each space becomes a hyphen."""
    text = MARKUP.sub(r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    kept = []
    for char in text:
        category = unicodedata.category(char)
        if char in " -_" or category.startswith("L") or category.startswith("N") \
                or category == "Mn":
            kept.append(char)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub makes for the Markdown file: headings (duplicates get -1, -2, ...)
    and explicit <a name/id> anchors."""
    seen: dict[str, int] = {}
    found: set[str] = set()

    def add(heading: str) -> None:
        slug = github_slug(heading)
        if slug in seen:
            seen[slug] += 1
            slug = f"{slug}-{seen[slug]}"
        else:
            seen[slug] = 0
        found.add(slug)

    previous = ""
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        heading = ATX_HEADING.match(line)
        if heading:
            add(heading.group(2) or "")
            previous = ""
            continue
        if SETEXT_UNDERLINE.match(line) and previous.strip() and not previous.startswith(
                ("    ", "\t", "|", "-", "*", "+", ">")) and not re.match(r"^\s*\d+[.)]\s", previous):
            add(previous.strip())
            previous = ""
            continue
        for anchor in HTML_ANCHOR.findall(line):
            found.add(anchor)
        previous = line
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in the file outside code; a link's text may run
    over several lines."""
    text = path.read_text(encoding="utf-8")
    prose = dict(prose_lines(text))
    found = []
    lines = []
    for number in range(1, text.count("\n") + 2):
        line = prose.get(number, "")
        definition = REFERENCE_DEF.match(line)
        if definition:
            found.append((number, definition.group(1)))
            line = ""
        lines.append(line)
    # inline code goes, but never across a blank line, and its newlines stay (line numbers)
    joined = INLINE_CODE.sub(lambda m: "\n" * m.group(0).count("\n"), "\n".join(lines))
    for match in INLINE_LINK.finditer(joined):
        found.append((joined.count("\n", 0, match.start()) + 1, match.group(1)))
    found.sort()
    return [(number, target.strip("<>").strip()) for number, target in found]


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        if not target or EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not resolved.exists():
            problems.append(f"{where} (no such file or folder)")
            continue
        if anchor and resolved.is_file() and resolved.suffix.lower() == ".md":
            if unquote(anchor).lower() not in anchors(resolved):
                problems.append(f"{where} (no heading with that anchor in {resolved.name})")
    return problems


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}"


def test_docs_has_an_index_of_its_pages() -> None:
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    linked = {target.partition("#")[0] for _, target in links(ROOT / "docs" / "index.md")}
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "index.md":
            assert page.name in linked, f"docs/index.md does not link {page.name}"
    assert index.startswith("# ")


@pytest.mark.parametrize("heading, slug", [
    ("Deploy: SuperLink + SuperNodes as real processes", "deploy-superlink--supernodes-as-real-processes"),
    ("How a run goes (message API)", "how-a-run-goes-message-api"),
    ("Simulation: what `make run` does", "simulation-what-make-run-does"),
    ("Measured: label shift (the study's setting)", "measured-label-shift-the-studys-setting"),
    ("torch, torchvision and timm on CPU-only machines", "torch-torchvision-and-timm-on-cpu-only-machines"),
    ("Feature geometry (Sec. 3.2)", "feature-geometry-sec-32"),
    ("snake_case and [a link](x.md)", "snake_case-and-a-link"),
])
def test_github_slug(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


def test_duplicate_headings_get_numbered_anchors(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Measured\n\n## Measured\n\n```\n# not a heading\n```\n\n## Measured\n")
    assert anchors(page) == {"measured", "measured-1", "measured-2"}


def test_links_in_code_are_not_links(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("[a](a.md) `[b](b.md)`\n\n```\n[c](c.md)\n```\n![d](d.png \"title\") "
                    "[e](https://example.org) [f]: f.md\n[g]: g.md\n[a link over\ntwo lines](h.md#x)\n"
                    "[not\n\na link](i.md)\n")
    assert links(page) == [(1, "a.md"), (6, "d.png"), (6, "https://example.org"), (7, "g.md"),
                           (8, "h.md#x")]
