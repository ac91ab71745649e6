"""CommonGen (v1.0) raw files -> tokenized text for fairseq, with grouped dev references.

Input: ``commongen.{train,dev}.src_alpha.txt`` (space-separated concepts) and
``commongen.{train,dev}.tgt.txt`` (one reference a line), line-aligned. Several references
of one concept set stand on consecutive lines with the same source; each group becomes one
evaluation input.

Output (``--out``), all lower-cased and Moses-tokenized:

- ``train.{src,tgt}``: every training pair;
- ``valid.{src,tgt}``: one line per dev concept set (target: its first reference, for the
  validation loss), ``valid.refs.jsonl``: all its references (lower-cased, untokenized),
  ``valid.concepts``: the concepts, ``|``-separated, for the coverage metric;
- ``test.*`` the same for ``commongen.test.*`` when the data folder has them (references
  optional: the official test set ships without them);
- ``eval_splits``: the evaluation splits written.

    python -m fairseq_knowgen.prep.commongen --data ../shared/data/commongen --out OUT
"""

import argparse
import os
from typing import List, Optional, Tuple

from ..text import moses_tokenize
from ..textio import cli_entry, read_lines, read_parallel
from .common import ensure_dir, write_jsonl, write_lines


def group_consecutive(src: List[str], tgt: List[str]) -> List[Tuple[str, List[str]]]:
    """[(source, [references...])] for runs of consecutive identical source lines."""
    groups: List[Tuple[str, List[str]]] = []
    for s, t in zip(src, tgt):
        if groups and groups[-1][0] == s:
            groups[-1][1].append(t)
        else:
            groups.append((s, [t]))
    return groups


def prepare(data: str, out: str, dev_name: str = "dev") -> List[str]:
    """Write the splits; returns the evaluation splits written (also in ``OUT/eval_splits``):
    ``valid``, and ``test`` when ``commongen.test.src_alpha.txt`` exists (its references
    ``commongen.test.tgt.txt`` are optional: without them the recipe generates but cannot score)."""
    ensure_dir(out)
    src, tgt = read_parallel(*split_paths(data, "train"), what="CommonGen train")
    write_lines(f"{out}/train.src", (normalize_concepts(s) for s in src))
    write_lines(f"{out}/train.tgt", (moses_tokenize(t) for t in tgt))
    splits = ["valid"]
    write_eval_split(out, "valid", *split_paths(data, dev_name))
    test_src, test_tgt = split_paths(data, "test")
    if os.path.isfile(test_src):
        write_eval_split(out, "test", test_src, test_tgt if os.path.isfile(test_tgt) else None)
        splits.append("test")
    write_lines(f"{out}/eval_splits", splits)
    return splits


def split_paths(data: str, name: str) -> Tuple[str, str]:
    return os.path.join(data, f"commongen.{name}.src_alpha.txt"), os.path.join(data, f"commongen.{name}.tgt.txt")


def normalize_concepts(line: str) -> str:
    return " ".join(line.lower().split())


def write_eval_split(out: str, split: str, src_path: str, tgt_path: Optional[str]):
    """One line per concept set (consecutive lines with the same source are one set)."""
    if tgt_path is None:
        src = read_lines(src_path, f"CommonGen {split} concepts", allow_empty_lines=False)
        tgt = [""] * len(src)
    else:
        src, tgt = read_parallel(src_path, tgt_path, what=f"CommonGen {split}")
    groups = group_consecutive([normalize_concepts(s) for s in src], tgt)
    write_lines(f"{out}/{split}.src", (g[0] for g in groups))
    write_lines(f"{out}/{split}.tgt", (moses_tokenize(g[1][0]) for g in groups))
    if tgt_path is not None:
        write_jsonl(f"{out}/{split}.refs.jsonl", ([" ".join(r.lower().split()) for r in g[1]] for g in groups))
    elif os.path.exists(f"{out}/{split}.refs.jsonl"):
        os.remove(f"{out}/{split}.refs.jsonl")  # stale references of another data folder
    write_lines(f"{out}/{split}.concepts", ("|".join(g[0].split()) for g in groups))
    refs = "" if tgt_path is None else f", {len(src)} references"
    print(f"{split}: {len(groups)} concept sets{refs}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="folder with the raw CommonGen files")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    prepare(a.data, a.out)


if __name__ == "__main__":
    cli_entry(main)
