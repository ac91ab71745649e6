"""Writing shared by the data-preparation modules (their tokenization is in :mod:`fairseq_knowgen.text`).

Every prep module writes all of its outputs at once: inside ``with output_folder(OUT, owned=...)
as tmp`` (:func:`fairseq_knowgen.textio.output_folder`, re-exported here) it writes into ``tmp``,
and the folder replaces ``OUT`` only when the whole run succeeded; a failed, interrupted or killed
run leaves the previous complete ``OUT`` (or none). ``owned`` lists the module's output names as
glob patterns: the entries of the old ``OUT`` matching none of them are carried over, those
matching are replaced (or dropped when this run did not write them again). For example::

    from .common import output_folder, write_lines

    def prepare(data, out):
        with output_folder(out, owned=OUTPUTS) as tmp:
            train = read_split(data, "train")        # a DataError here leaves `out` as it was
            write_lines(f"{tmp}/train.src", ...)
            write_lines(f"{tmp}/eval_splits", ...)

``prep.webnlg``, ``prep.placeholders encode`` and ``demo_data`` do so. Outputs that go to
several places, or a single file into a folder that other stages fill (``prep.constraints``
into the binarized data), use :func:`fairseq_knowgen.textio.atomic_write` or
:func:`fairseq_knowgen.textio.atomic_files` (several files renamed into place together).
"""

import json
import os
from typing import Iterable, List, Sequence

from ..textio import atomic_write, output_folder  # noqa: F401  (output_folder: re-exported for the prep modules)


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
