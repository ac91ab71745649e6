"""Constraint files for ``--constraints-from`` (:mod:`fairseq_knowgen.data.constraints`),
taken from the *encoded* sources the model reads, so that every constraint is written exactly
as the source writes it (same BPE pieces, same ``<unk-N>`` / ``<ent-K>`` placeholders):

- ``concepts`` (CommonGen): each concept of the source (the words before ``<sep>`` in an EKI
  source, or the whole line), one constraint per concept; BPE pieces ``xx@@ yy`` stay one
  constraint. The concept is constrained in the form the input gives it (CommonGen gives
  lemmas: "dog", while references often inflect: "dogs"); that is the honest baseline of
  concept-constrained decoding, and its cost in BLEU is measured in the README;
- ``entities`` (WebNLG): each distinct subject and object of the linearized triples
  ``<S> subject <P> predicate <O> object ...`` (one constraint per entity, in order of first
  occurrence), e.g. ``<ent-0>`` with entity placeholders or ``Alan <unk-2>`` at word level.

One output line per source line, constraints separated by TABs (an empty line: none)::

    python -m fairseq_knowgen.prep.constraints entities --src bpe/valid.src --out bin/valid.cons
"""

import argparse
from typing import List

from ..textio import DataError, atomic_write, cli_entry, read_lines

SEP = "<sep>"
MARKERS = ("<S>", "<P>", "<O>")


def concept_constraints(line: str) -> List[str]:
    """The concepts of a CommonGen (or EKI) source line, BPE pieces joined into one constraint."""
    words, current = [], []
    for tok in line.split(SEP)[0].split():
        current.append(tok)
        if not tok.endswith("@@"):
            words.append(" ".join(current))
            current = []
    if current:  # a trailing continuation piece: keep what is there
        words.append(" ".join(current))
    return list(dict.fromkeys(words))


def entity_constraints(line: str) -> List[str]:
    """Distinct subjects and objects of a linearized triple line, in order of first occurrence."""
    out, marker, span = [], None, []
    for tok in line.split() + ["<S>"]:
        if tok in MARKERS:
            if marker in ("<S>", "<O>") and span:
                out.append(" ".join(span))
            marker, span = tok, []
        else:
            span.append(tok)
    return list(dict.fromkeys(out))


KINDS = {"concepts": concept_constraints, "entities": entity_constraints}


def write_constraints(kind: str, src: str, out: str) -> int:
    """Write the constraint file of ``src``; returns the number of constraints."""
    lines = read_lines(src, "source")
    extract = KINDS[kind]
    total = 0
    rows = []
    for n, line in enumerate(lines, start=1):
        cons = extract(line)
        if kind == "entities" and line.strip() and not cons:
            raise DataError(src, n, "no <S>/<O> entity in this line (is it a linearized WebNLG source?)")
        total += len(cons)
        rows.append("\t".join(cons))
    with atomic_write(out) as f:
        f.writelines(r + "\n" for r in rows)
    return total


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=sorted(KINDS), help="what to constrain: the concepts or the entities")
    p.add_argument("--src", required=True, help="encoded source file (as binarized)")
    p.add_argument("--out", required=True, help="constraint file (DATA_BIN/SPLIT.SUFFIX)")
    a = p.parse_args(argv)
    total = write_constraints(a.kind, a.src, a.out)
    print(f"{a.out}: {total} constraints")


if __name__ == "__main__":
    cli_entry(main)
