"""Every relative link of README.md, docs/**/*.md and examples/*/README.md names a file of the repository, and
every ``#anchor`` a heading of the file it points to, with GitHub's heading slugs (lower case; markup, punctuation
and symbols out; letters, digits, ``_`` and ``-`` kept; spaces to ``-``; a repeated slug gets ``-1``, ``-2``...).
Links and headings inside fenced code blocks do not count. Reads only the Markdown files: no network, well under a second.
"""

import glob
import os
import re
import unicodedata

import pytest
from conftest import ROOT

FENCE = re.compile(r"```.*?```", re.S)  # as GitHub renders them: no links inside
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"[`*]|<[^>]+>", "", heading.strip().lower())
    text = "".join(c for c in text if c.isalnum() or c in " -_" or unicodedata.category(c).startswith("L"))
    return text.replace(" ", "-")


def anchors(path):
    """The anchors of the headings of the Markdown file PATH (outside fenced code blocks)."""
    seen, out, fence = {}, set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                fence = not fence
            if fence or not line.startswith("#"):
                continue
            s = slug(line.lstrip("#"))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links(root, files):
    """``FILE: TARGET (why)`` for each relative link of FILES (paths under ROOT) that does not resolve."""
    bad = []
    for name in files:
        with open(os.path.join(root, name), encoding="utf-8") as f:
            text = FENCE.sub("", f.read())
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(root, os.path.dirname(name), path)) if path else os.path.join(root, name)
            if not os.path.exists(dest):
                bad.append(f"{name}: {target} (no such file)")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                bad.append(f"{name}: {target} (no such heading)")
    return bad


def doc_files(root):
    docs = glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True)
    docs += glob.glob(os.path.join(root, "examples", "*", "README.md"))  # the quick starts
    return ["README.md"] + sorted(os.path.relpath(p, root) for p in docs)


def test_every_link_and_anchor_of_the_docs_resolves():
    files = doc_files(ROOT)
    assert len(files) > 10, files
    assert broken_links(ROOT, files) == []


@pytest.mark.parametrize(
    "heading, expected",
    [
        ("## At stages.sh's untuned defaults", "at-stagesshs-untuned-defaults"),
        ("## medical_ner (NER) and book_review (classification), dev, from scratch",
         "medical_ner-ner-and-book_review-classification-dev-from-scratch"),
        ("### `scripts/gpu_check.sh`", "scriptsgpu_checksh"),
        ("## EKI: prototype retrieval", "eki-prototype-retrieval"),
        ("## The demo: 2 + 2 = *four*", "the-demo-2--2--four"),
    ],
)  # fmt: skip
def test_slugs_as_github_makes_them(heading, expected):
    assert slug(heading.lstrip("#")) == expected


def test_a_broken_link_or_anchor_is_found(tmp_path):
    """The checker itself: a missing file, a missing heading, a heading inside a code block and a repeated
    heading's second anchor."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Part\n\n## Part\n\n```\n## In code\n```\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md#part) [ok2](docs/a.md#part-1) [file](docs/b.md) [head](docs/a.md#nothing)\n"
        "[code](docs/a.md#in-code) [self](#a-title) [web](https://example.org/x#y)\n\n# A title\n"
        "```\n[not a link](docs/none.md)\n```\n"
    )
    assert broken_links(str(tmp_path), doc_files(str(tmp_path))) == [
        "README.md: docs/b.md (no such file)",
        "README.md: docs/a.md#nothing (no such heading)",
        "README.md: docs/a.md#in-code (no such heading)",
    ]
