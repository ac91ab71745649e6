"""Whole-entity placeholders ``<ent-K>`` for linearized WebNLG triples.

Word-level placeholders (:mod:`.placeholders`) copy one rare *word* per step. A WebNLG
entity is often several words (``Adolfo Suárez Madrid–Barajas Airport``) whose text form
differs from the DBpedia id, so this module turns each triple's subject and object into a
single source token, as in the delexicalized WebNLG baselines:

- source (a line of :func:`.webnlg.linearize`): the tokens between ``<S>`` and ``<P>`` and
  between ``<O>`` and the next ``<S>`` become ``<ent-K>``, K numbered by first occurrence in
  the line (a repeated entity keeps its K)::

      <S> Abilene , Texas <P> is part of <O> Texas   ->   <S> <ent-0> <P> is part of <O> <ent-1>

- target (a Moses-tokenized reference): every mention of a source entity becomes the same
  ``<ent-K>``. Mentions (the entity and its variants: ``Texas ( state )`` as ``Texas``,
  ``28.0 ( metres )`` as ``28 m``, ``1927-07-23`` as ``July 23rd , 1927``, ``United States`` as
  ``US``, ...) are found by :class:`fairseq_knowgen.text.EntityMatcher`, the matcher that
  evaluation's ``entity_recall`` also uses; the longest mention wins and mentions never overlap;
- after generation :func:`restore` replaces ``<ent-K>`` by the entity's surface form
  (:func:`fairseq_knowgen.text.surface_form`), kept per input line in a ``.entmap`` file (one JSON list of surface
  forms per line, index K), so that outputs are scored against the original references.

``<ent-K>`` is an ordinary vocabulary token of the joined dictionary (``placeholders encode``
adds ``<ent-0..M-1>`` for every K the data uses), so a copy model copies an entity in one
step and a plain transformer reads the same input. Other rare words still become ``<unk-N>``
after the entities are replaced. Being in the vocabulary V, ``<ent-K>`` is not an OOV target
for ``force-copy-unk`` (force-copy paper Eq. 12); ``force`` (Eq. 11) forces its copy.

The share of (reference, source entity) pairs in which the entity is found is the upper
bound of what delexicalized training can teach (``prep.webnlg --entity-placeholders``
prints it as ``entity_match_rate``).

Raw linearized sources for ``fairseq-interactive``::

    python -m fairseq_knowgen.prep.entities delexicalize --input raw.src --out ent.src --entmap ent.entmap
    python -m fairseq_knowgen.prep.placeholders encode-source --dict DATA/dict.src.txt < ent.src \\
      | fairseq-interactive DATA --user-dir fairseq_knowgen --path checkpoint_best.pt ... \\
      | python -m fairseq_knowgen.prep.placeholders restore --src ent.src --entmap ent.entmap > out.txt
"""

import argparse
import json
from typing import List, Sequence, Tuple

from ..text import ENTITY_TOKEN, SURFACE_STYLES, entity_token, surface_form
from ..textio import DataError, atomic_files, atomic_write, cli_entry, read_lines
from .common import replace_numbered

MARKERS = ("<S>", "<P>", "<O>")


def delexicalize_source(tokens: Sequence[str], path: str = "<input>", line: int = 0) -> Tuple[List[str], List[str]]:
    """``<S> s <P> p <O> o ...`` tokens -> (tokens with every subject and object replaced by
    ``<ent-K>``, the entities in order of K). Anything but a sequence of whole triples with
    non-empty parts is a :class:`DataError` at ``path:line``."""
    out, ents = [], []
    i, expect = 0, 0  # expect: index into MARKERS of the next marker
    if not tokens:
        raise DataError(path, line, "empty source line (expected '<S> subject <P> predicate <O> object ...')")
    while i < len(tokens):
        marker = tokens[i]
        if marker != MARKERS[expect]:
            raise DataError(
                path,
                line,
                f"token {i + 1} is {marker!r} where {MARKERS[expect]} was expected "
                "(each triple is '<S> subject <P> predicate <O> object')",
            )
        j = i + 1
        while j < len(tokens) and tokens[j] not in MARKERS:
            j += 1
        part = " ".join(tokens[i + 1 : j])
        if not part:
            what = ("subject", "predicate", "object")[expect]
            raise DataError(path, line, f"empty {what} after {marker} (token {i + 1})")
        out.append(marker)
        if marker == "<P>":
            out += tokens[i + 1 : j]
        else:
            if part not in ents:
                ents.append(part)
            out.append(entity_token(ents.index(part)))
        i, expect = j, (expect + 1) % 3
    if expect != 0:
        raise DataError(path, line, f"the last triple ends before its {('', '<P>', '<O>')[expect]} part")
    return out, ents


def restore(hyp: str, surfaces: Sequence[str]) -> str:
    """Replace ``<ent-K>`` by ``surfaces[K]`` (left as is when the line has no entity K)."""
    return replace_numbered(hyp, ENTITY_TOKEN, surfaces)


def read_entmap(path: str) -> List[List[str]]:
    """The surface forms of each line of a ``.entmap`` file (one JSON list of strings per line)."""
    out = []
    for n, line in enumerate(read_lines(path, "entity map"), start=1):
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(path, n, f"not a JSON line ({e.msg})") from None
        if not isinstance(item, list) or not all(isinstance(x, str) and x for x in item):
            raise DataError(path, n, "expected a JSON list of non-empty strings (the surface of <ent-K> at index K)")
        out.append(item)
    return out


def write_entmap(path: str, maps: Sequence[Sequence[str]]):
    with atomic_write(path) as f:
        _write_entmap_lines(f, maps)


def _write_entmap_lines(f, maps: Sequence[Sequence[str]]):
    for m in maps:
        f.write(json.dumps(list(m), ensure_ascii=False) + "\n")


def cmd_delexicalize(a):
    src = read_lines(a.input, "linearized source")
    delex, maps = [], []
    for n, line in enumerate(src, start=1):
        tokens, ents = delexicalize_source(line.split(), a.input, n)
        delex.append(" ".join(tokens))
        maps.append([surface_form(e, a.surface) for e in ents])
    # the sources and their map are renamed into place together: never one without the other
    with atomic_files([a.out, a.entmap]) as (out, entmap):
        out.writelines(x + "\n" for x in delex)
        _write_entmap_lines(entmap, maps)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser(
        "delexicalize", help="replace subjects and objects of linearized sources by <ent-K>; write the entity map"
    )
    d.add_argument("--input", required=True, help="linearized sources '<S> s <P> p <O> o ...', one per line")
    d.add_argument("--out", required=True, help="the sources with <ent-K> (model input)")
    d.add_argument("--entmap", required=True, help="per line, the JSON list of the surface forms of <ent-0..>")
    d.add_argument(
        "--surface",
        choices=SURFACE_STYLES,
        default="text",
        help="what <ent-K> is restored to: 'text' (disambiguation parentheses dropped, units without "
        "parentheses, ISO dates spelled out) or 'dbpedia' (the entity as in the source)",
    )
    a = p.parse_args(argv)
    {"delexicalize": cmd_delexicalize}[a.cmd](a)


if __name__ == "__main__":
    cli_entry(main)
