"""The ``--source-position-markers K`` of fairseq's ``transformer_pointer_generator``, read from its data.

fairseq's pointer-generator (:mod:`fairseq_knowgen.models.fairseq_pointer_generator`) takes the
*last* K entries of its joined dictionary to be the position markers ``<unk-N>``: it embeds them
all as ``<unk>`` and gives them copy probability only. This module counts them in a binarized
data directory's ``dict.src.txt`` and checks that no ``<unk-N>`` comes before a word (a word
there would lose its embedding and never be generated, and that marker would be embedded as a
word); K is 0 for a dictionary without markers (BPE)::

    python -m fairseq_knowgen.prep.position_markers DATA_BIN     # prints: --source-position-markers K

The WebNLG recipe adds that flag to ``--arch transformer_pointer_generator*`` (stage 4), and
``scripts/benchmark.py`` through the model's profile (:func:`model_args`).
"""

import argparse
import os
import re
from typing import List

from ..textio import DataError, cli_entry, read_lines

MARKER = re.compile(r"^<unk-\d+>$")


def count(dict_path: str) -> int:
    """The number K of ``<unk-N>`` entries that end the fairseq dictionary file ``dict_path``.

    Raises :class:`DataError` (file and line) for a marker followed by another entry."""
    words = []
    for n, line in enumerate(read_lines(dict_path, "dictionary"), start=1):
        fields = line.split()
        if not fields:
            raise DataError(dict_path, n, "empty line in a dictionary")
        words.append(fields[0])
    k = 0
    while k < len(words) and MARKER.match(words[len(words) - 1 - k]):
        k += 1
    for n, w in enumerate(words[: len(words) - k], start=1):
        if MARKER.match(w):
            raise DataError(
                dict_path,
                n,
                f"{w} comes before the word {words[len(words) - k - 1]!r} (line {len(words) - k}): "
                "transformer_pointer_generator needs the position markers <unk-N> at the end of the dictionary "
                "(write it with `python -m fairseq_knowgen.prep.placeholders encode` and binarize with --srcdict)",
            )
    return k


def model_args(data_dir: str) -> List[str]:
    """``["--source-position-markers", K]`` for the binarized data ``data_dir`` (its ``dict.src.txt``)."""
    return ["--source-position-markers", str(count(os.path.join(data_dir, "dict.src.txt")))]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="binarized data directory (fairseq-preprocess --joined-dictionary; its dict.src.txt)")
    a = p.parse_args(argv)
    print(" ".join(model_args(a.data)))


if __name__ == "__main__":
    cli_entry(main)
