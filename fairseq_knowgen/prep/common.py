"""Tokenization and writing shared by the data-preparation modules."""

import json
import os
from typing import Iterable, List, Sequence

from ..textio import atomic_write

_TOK = {}


def moses_tokenize(text: str, lowercase: bool = True) -> str:
    """sacremoses English tokenization (no HTML escaping), optionally lower-cased."""
    if "en" not in _TOK:
        from sacremoses import MosesTokenizer

        _TOK["en"] = MosesTokenizer(lang="en")
    out = _TOK["en"].tokenize(text.strip(), escape=False, return_str=True)
    return out.lower() if lowercase else out


def write_lines(path: str, lines: Iterable[str]):
    with atomic_write(path) as f:
        for line in lines:
            f.write(line.replace("\n", " ") + "\n")


def write_jsonl(path: str, items: Iterable[List[str]]):
    with atomic_write(path) as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")


def ensure_dir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path


def replace_numbered(hyp: str, pattern, values: Sequence[str]) -> str:
    """Replace each token of ``hyp`` that ``pattern`` matches (group 1: an index N) by
    ``values[N]``; a token whose N is out of range is left as it is. Restores the ``<unk-N>``
    and ``<ent-K>`` placeholders."""
    out = []
    for w in hyp.split():
        m = pattern.match(w)
        out.append(values[int(m.group(1))] if m and int(m.group(1)) < len(values) else w)
    return " ".join(out)
