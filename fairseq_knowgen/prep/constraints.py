"""Constraint files for ``--constraints-from`` (:mod:`fairseq_knowgen.data.constraints`),
taken from the *encoded* sources the model reads, so that every constraint is written exactly
as the source writes it (same BPE pieces, same ``<unk-N>`` / ``<ent-K>`` placeholders):

- ``concepts`` (CommonGen): each concept of the source (the words before ``<sep>`` in an EKI
  source, or the whole line), one constraint per concept; BPE pieces ``xx@@ yy`` stay one
  constraint. ``--form`` says in which form each concept is constrained (fairseq's constraints
  are conjunctive token sequences: one form per concept, no disjunction of forms):

  - ``concept`` (default): the form the input gives it. CommonGen gives lemmas ("dog") while
    its references often inflect them ("two dogs run"), so the constraint forces the lemma:
    the honest baseline of concept-constrained decoding, its cost in BLEU measured in the README;
  - ``prototype``: the form the concept takes in the retrieved prototype of that input (the
    words after ``<sep>`` of an EKI source ``concepts <sep> prototype``): the concept itself when
    the prototype has it verbatim, else the first prototype word of the same lemma (the lemma
    of the coverage metric, :func:`fairseq_knowgen.text.lemma`, so a constraint
    in the prototype's form is always a covered concept), else (the prototype lacks the
    concept) the concept itself. Lemma matching is only as good as ``simplemma``'s dictionary,
    which knows no part of speech: the concept "saw" (lemma "see") takes "sees" from "he sees a
    dog", and "sit" does not match "sitting" (lemma "sitting"), so it stays "sit". The
    prototype comes from ``--prototypes`` (an EKI source of the same split, line-aligned with
    ``--src`` and with the same concepts) or, without it, from ``--src`` itself, which must then
    be an EKI source: a plain concept line has no prototype, and is refused rather than silently
    constrained in the concept form. Words are matched after joining their BPE pieces, and the
    constraint is the prototype word's pieces as the encoded file writes them: joint BPE codes
    segment a word the same way wherever it occurs, so these are the target side's pieces;
- ``entities`` (WebNLG): each distinct subject and object of the linearized triples
  ``<S> subject <P> predicate <O> object ...`` (one constraint per entity, in order of first
  occurrence), e.g. ``<ent-0>`` with entity placeholders or ``Alan <unk-2>`` at word level.

One output line per source line, constraints separated by TABs (an empty line: none)::

    python -m fairseq_knowgen.prep.constraints entities --src bpe/valid.src --out bin/valid.cons
    python -m fairseq_knowgen.prep.constraints concepts --form prototype --src bpe/valid.src \
        --prototypes bpe/valid.eki.src --out bin/valid.cons-prototype
"""

import argparse
from typing import Dict, List, Optional

from ..text import lemma
from ..textio import DataError, atomic_write, cli_entry, read_lines, read_parallel

SEP = "<sep>"
MARKERS = ("<S>", "<P>", "<O>")
FORMS = ("concept", "prototype")


def bpe_words(text: str) -> List[str]:
    """The words of a BPE'd text, each as its pieces joined by spaces (``"fris@@ bee"``)."""
    words, current = [], []
    for tok in text.split():
        current.append(tok)
        if not tok.endswith("@@"):
            words.append(" ".join(current))
            current = []
    if current:  # a trailing continuation piece: keep what is there
        words.append(" ".join(current))
    return words


def _plain(word: str) -> str:
    """A word of :func:`bpe_words` with its pieces merged (``"fris@@ bee"`` -> ``"frisbee"``)."""
    return word.replace("@@ ", "")


def concept_constraints(line: str) -> List[str]:
    """The concepts of a CommonGen (or EKI) source line, BPE pieces joined into one constraint."""
    return list(dict.fromkeys(bpe_words(line.split(SEP)[0])))


def prototype_form(concept: str, prototype: List[str]) -> Optional[str]:
    """The form ``concept`` takes in ``prototype`` (both as :func:`bpe_words`), or None when it
    has none: the concept itself when it occurs verbatim, else the first word whose lemma is the
    concept's (:func:`fairseq_knowgen.text.lemma`, as concept coverage matches)."""
    plain = [_plain(w) for w in prototype]
    if _plain(concept) in plain:
        return concept
    want = lemma(_plain(concept).lower())
    return next((w for w, p in zip(prototype, plain) if lemma(p.lower()) == want), None)


def prototype_constraints(line: str, eki_line: Optional[str] = None) -> List[str]:
    """The concepts of ``line``, each in the form the prototype of ``eki_line`` (default: ``line``
    itself; ``concepts <sep> prototype``) gives it, or the concept itself where it has none."""
    eki_line = line if eki_line is None else eki_line
    prototype = bpe_words(eki_line.split(SEP, 1)[1]) if SEP in eki_line else []
    forms = [prototype_form(c, prototype) or c for c in concept_constraints(line)]
    return list(dict.fromkeys(forms))


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


def _check_eki_line(path: str, n: int, line: str, concepts: List[str], src: str, src_concepts: List[str]):
    if SEP not in line:
        how = "" if path != src else " (a plain concept line has no prototype: give --prototypes, an EKI source)"
        raise DataError(path, n, f"no {SEP} in this line: not an EKI source 'concepts {SEP} prototype'{how}")
    if concepts != src_concepts:
        raise DataError(path, n, f"concepts {concepts} differ from {src_concepts} of {src}:{n} (not the same split?)")


def write_constraints(
    kind: str, src: str, out: str, form: str = "concept", prototypes: Optional[str] = None
) -> Dict[str, int]:
    """Write the constraint file of ``src``; returns counts: ``constraints``, and for the
    prototype form ``from_prototype`` (found in the prototype), ``inflected`` (of those, in
    another form than the concept's) and ``fallback`` (the concept itself: the prototype lacks it).
    Nothing is written when a line is bad."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, not {form!r}")
    if form == "prototype" and kind != "concepts":
        raise ValueError("--form prototype is for concepts only")
    if prototypes is None:
        lines = read_lines(src, "source")
        eki_lines = lines
    else:
        if form != "prototype":
            raise ValueError("--prototypes needs --form prototype")
        lines, eki_lines = read_parallel(src, prototypes, what="source")
    eki_path = prototypes or src
    counts = {"constraints": 0, "from_prototype": 0, "inflected": 0, "fallback": 0}
    rows = []
    for n, (line, eki_line) in enumerate(zip(lines, eki_lines), start=1):
        if form == "prototype":
            concepts = concept_constraints(line)
            _check_eki_line(eki_path, n, eki_line, concept_constraints(eki_line), src, concepts)
            prototype = bpe_words(eki_line.split(SEP, 1)[1])
            found = [prototype_form(c, prototype) for c in concepts]
            counts["from_prototype"] += sum(f is not None for f in found)
            counts["inflected"] += sum(f is not None and f != c for f, c in zip(found, concepts))
            counts["fallback"] += sum(f is None for f in found)
            cons = prototype_constraints(line, eki_line)
        else:
            cons = KINDS[kind](line)
        if kind == "entities" and line.strip() and not cons:
            raise DataError(src, n, "no <S>/<O> entity in this line (is it a linearized WebNLG source?)")
        counts["constraints"] += len(cons)
        rows.append("\t".join(cons))
    with atomic_write(out) as f:
        f.writelines(r + "\n" for r in rows)
    return counts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=sorted(KINDS), help="what to constrain: the concepts or the entities")
    p.add_argument("--src", required=True, help="encoded source file (as binarized)")
    p.add_argument("--out", required=True, help="constraint file (DATA_BIN/SPLIT.SUFFIX)")
    p.add_argument(
        "--form",
        choices=FORMS,
        default="concept",
        help="concepts only: constrain each concept in the form the input gives it (concept), or in the form it "
        "takes in the retrieved prototype, matched by lemma, falling back to the concept (prototype)",
    )
    p.add_argument(
        "--prototypes",
        help="--form prototype: the encoded EKI source 'concepts <sep> prototype' of the same split whose prototypes "
        "to use (default: --src itself, which must then be an EKI source)",
    )
    a = p.parse_args(argv)
    if a.form == "prototype" and a.kind != "concepts":
        p.error("--form prototype is for concepts only")
    if a.prototypes and a.form != "prototype":
        p.error("--prototypes needs --form prototype")
    c = write_constraints(a.kind, a.src, a.out, form=a.form, prototypes=a.prototypes)
    more = ""
    if a.form == "prototype":
        more = (
            f" ({c['from_prototype']} in the prototype's form, {c['inflected']} of them inflected; "
            f"{c['fallback']} absent from the prototype: the concept itself)"
        )
    print(f"{a.out}: {c['constraints']} constraints{more}")


if __name__ == "__main__":
    cli_entry(main)
