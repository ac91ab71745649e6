"""CommonGen (v1.0) raw files -> tokenized text for fairseq, with grouped dev references.

Input: ``commongen.{train,dev}.src_alpha.txt`` (space-separated concepts) and
``commongen.{train,dev}.tgt.txt`` (one reference a line), line-aligned. Several references
of one concept set stand on consecutive lines with the same source; each group becomes one
evaluation input.

Output (``--out``), all lower-cased and Moses-tokenized:

- ``train.{src,tgt}``: every training pair;
- ``valid.{src,tgt}``: one line per dev concept set (target: its first reference, for the
  validation loss), ``valid.refs.jsonl``: all its references (lower-cased, untokenized),
  ``valid.concepts``: the concepts, ``|``-separated, for the coverage metric.

    python -m fairseq_knowgen.prep.commongen --data ../shared/data/commongen --out OUT
"""

import argparse
import os
from typing import List, Tuple

from ..textio import cli_entry, read_parallel
from .common import ensure_dir, moses_tokenize, write_jsonl, write_lines


def group_consecutive(src: List[str], tgt: List[str]) -> List[Tuple[str, List[str]]]:
    """[(source, [references...])] for runs of consecutive identical source lines."""
    groups: List[Tuple[str, List[str]]] = []
    for s, t in zip(src, tgt):
        if groups and groups[-1][0] == s:
            groups[-1][1].append(t)
        else:
            groups.append((s, [t]))
    return groups


def prepare(data: str, out: str, dev_name: str = "dev"):
    ensure_dir(out)
    split_files = {"train": "train", "valid": dev_name}
    for split, name in split_files.items():
        src_path = os.path.join(data, f"commongen.{name}.src_alpha.txt")
        tgt_path = os.path.join(data, f"commongen.{name}.tgt.txt")
        src, tgt = read_parallel(src_path, tgt_path, what=f"CommonGen {name}")
        src = [" ".join(s.lower().split()) for s in src]
        if split == "train":
            write_lines(f"{out}/train.src", src)
            write_lines(f"{out}/train.tgt", (moses_tokenize(t) for t in tgt))
            continue
        groups = group_consecutive(src, tgt)
        write_lines(f"{out}/valid.src", (g[0] for g in groups))
        write_lines(f"{out}/valid.tgt", (moses_tokenize(g[1][0]) for g in groups))
        write_jsonl(f"{out}/valid.refs.jsonl", ([" ".join(r.lower().split()) for r in g[1]] for g in groups))
        write_lines(f"{out}/valid.concepts", ("|".join(g[0].split()) for g in groups))
        print(f"{name}: {len(src)} pairs, {len(groups)} concept sets")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="folder with the raw CommonGen files")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    prepare(a.data, a.out)


if __name__ == "__main__":
    cli_entry(main)
