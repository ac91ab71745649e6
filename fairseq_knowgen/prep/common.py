"""Writing shared by the data-preparation modules (their tokenization is in :mod:`fairseq_knowgen.text`)."""

import json
import os
from typing import Iterable, List, Sequence

from ..textio import atomic_write

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
