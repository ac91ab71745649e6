"""WebNLG (2017, enriched XML) -> linearized triples and texts for fairseq.

Input: ``{train,dev}/Ntriples/Category.xml``. For every ``<entry>``, the modified triples
(``<mtriple>subject | predicate | object</mtriple>``) are linearized with markers::

    <S> Aarhus Airport <P> city served <O> Aarhus <S> Aarhus <P> leader name <O> Jacob Bundsgaard

(underscores to spaces, quotes dropped, camel-case predicates split and lower-cased, entity
case kept so that names can be copied as they are). Every ``<text>`` of the entry is a
reference; each one is a training pair.

Splits written to ``--out`` (Moses-tokenized, case kept):

- ``train``: training entries outside the held-out categories, one line per text;
- ``valid``: the dev set (all categories are seen in training), one line per entry;
- ``heldout``: the training entries of ``--heldout-categories`` (default Astronaut,
  Monument, University: 17% of train), one line per entry. Trained without them, a model
  meets their entity names for the first time: this is where copying shows. ``''``: none;
- ``test_seen``, ``test_unseen``: when the data folder has a ``test/`` folder (the WebNLG
  test set, whose 5 categories absent from training are unseen), its entries of categories
  the model trained on and of the others, one line per entry.

``eval_splits`` lists the evaluation splits written (``valid`` and those above that exist).
All outputs are written into a temporary folder beside ``--out`` that replaces it only when every
split is written (:func:`fairseq_knowgen.textio.output_folder`): bad XML anywhere, even in
``test/``, leaves an earlier ``--out`` as it was. Files in ``--out`` that are none of this module's
outputs are kept.

Evaluation inputs per split (one line per entry): ``.refs.jsonl`` (all texts, untokenized),
``.entities`` (subjects and objects, ``|``-separated), ``.category``.

With ``--entity-placeholders`` (see :mod:`.entities`) every subject and object of ``.src``
is one token ``<ent-K>`` and its mentions in ``.tgt`` are that token; per split ``.lex.src``
keeps the linearized source with the entities (for scoring copies), ``.entmap`` the surface
form of ``<ent-K>`` per line (``placeholders restore --entmap`` puts them back), and
``entity_match.json`` the share of (reference, source entity) pairs whose entity the matcher
finds in the reference (train: every line; evaluation splits: every reference of an entry),
the upper bound of what delexicalized training sees.

    python -m fairseq_knowgen.prep.webnlg --data ../shared/data/webnlg --out OUT [--entity-placeholders]
"""

import argparse
import glob
import json
import os
import re
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional, Sequence
from xml.parsers import expat

from ..text import SURFACE_STYLES, EntityMatcher, moses_tokenize, surface_form
from ..textio import DataError, atomic_write, cli_entry
from . import entities as ent
from .common import output_folder, write_jsonl, write_lines

DEFAULT_HELDOUT = ("Astronaut", "Monument", "University")
# every name this module writes into --out (the old ones are replaced or dropped, others kept)
OUTPUTS = ("*.src", "*.tgt", "*.refs.jsonl", "*.entities", "*.category", "*.entmap", "eval_splits", "entity_match.json")


def clean_entity(text: str) -> str:
    """``Abilene,_Texas`` -> ``Abilene, Texas``; ``"11.5"^^xsd:double`` and ``"Aarhus"@en`` lose
    their datatype or language tag and quotes."""
    text = re.sub(r'"(\^\^\S+|@[A-Za-z-]+)$', '"', text.strip())
    text = text.replace("_", " ").replace('"', " ")
    return " ".join(text.split())


def split_predicate(pred: str) -> str:
    """``elevationAboveTheSeaLevel_(in_metres)`` -> ``elevation above the sea level ( in metres )``."""
    pred = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", pred.replace("_", " "))
    pred = re.sub(r"([()])", r" \1 ", pred)
    return " ".join(pred.lower().split())


def parse_triple(text: str, path: str, line: int = 0) -> List[str]:
    parts = [p.strip() for p in text.split(" | ")]
    if len(parts) != 3 or not all(parts):
        raise DataError(path, line, f"malformed triple {text!r} (expected 'subject | predicate | object')")
    for what, part in (("subject", parts[0]), ("predicate", parts[1]), ("object", parts[2])):
        if not (split_predicate(part) if what == "predicate" else clean_entity(part)):
            raise DataError(path, line, f"empty {what} {part!r} in triple {text!r}")
    return parts


def parse_xml(path: str):
    """The root element of an XML file and the line on which each element starts (for errors)."""
    if os.path.isdir(path):
        raise DataError(path, 0, "a folder, not an XML file")
    builder, lines = ET.TreeBuilder(), {}
    parser = expat.ParserCreate()
    parser.buffer_text = True

    def start(tag, attrs):
        lines[builder.start(tag, attrs)] = parser.CurrentLineNumber

    parser.StartElementHandler = start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    try:
        with open(path, "rb") as f:
            parser.ParseFile(f)
    except expat.ExpatError as e:
        raise DataError(path, e.lineno, f"XML parse error: {expat.errors.messages[e.code]}") from None
    return builder.close(), lines


def read_entries(split_dir: str) -> List[Dict]:
    """All entries of one split, in file order: category, triples, texts."""
    # train/dev: one file per category under Ntriples/; the test set may also be one file in the folder
    files = sorted(
        glob.glob(os.path.join(split_dir, "*triples", "*.xml")) + glob.glob(os.path.join(split_dir, "*.xml"))
    )
    if not files:
        raise DataError(split_dir, 0, "no */*triples/*.xml or *.xml files found (is this a WebNLG split folder?)")
    entries, skipped = [], 0
    for path in files:
        root, lines = parse_xml(path)
        for entry in root.iter("entry"):
            triples = [parse_triple(t.text or "", path, lines[t]) for t in entry.iter("mtriple")]
            texts = [" ".join((t.text or "").split()) for t in entry.iter("text")]
            texts = [t for t in texts if t]
            if not triples:
                raise DataError(path, lines[entry], f"entry {entry.get('eid')} has no <mtriple>")
            if not texts:  # the released files have a few entries whose <text> are all empty
                skipped += 1
                continue
            entries.append({"category": entry.get("category"), "triples": triples, "texts": texts})
    if skipped:
        print(f"{split_dir}: skipped {skipped} entries without any <text>")
    return entries


def linearize(triples: Sequence[Sequence[str]], tok=lambda x: x) -> str:
    """Markers ``<S> <P> <O>`` around each part; ``tok`` tokenizes the parts (not the markers)."""
    return " ".join(
        f"<S> {tok(clean_entity(s))} <P> {tok(split_predicate(p))} <O> {tok(clean_entity(o))}" for s, p, o in triples
    )


def entities(triples) -> List[str]:
    seen = []
    for s, _, o in triples:
        for e in (clean_entity(s), clean_entity(o)):
            if e and e not in seen:
                seen.append(e)
    return seen


def write_split(
    out: str,
    name: str,
    entries: List[Dict],
    one_line_per_text: bool,
    entity_surface: Optional[str] = None,
    shown: Optional[str] = None,
) -> Optional[Dict]:
    """Write ``name.src/.tgt`` (and the evaluation files) into ``out``. With ``entity_surface`` (a
    style of :func:`fairseq_knowgen.text.surface_form`) entities become ``<ent-K>`` and ``.lex.src``
    and ``.entmap`` are written; returns the entity match counts (else None). Errors name the
    folder ``shown`` (default ``out``)."""
    src, tgt, lex, maps = [], [], [], []
    mentions = found = 0
    for e in entries:
        s = linearize(e["triples"], lambda x: moses_tokenize(x, lowercase=False))
        if entity_surface is None:
            for text in e["texts"] if one_line_per_text else e["texts"][:1]:
                src.append(s)
                tgt.append(moses_tokenize(text, lowercase=False))
            continue
        delex, ents = ent.delexicalize_source(s.split(), f"{shown or out}/{name}.src", len(src) + 1)
        matcher = EntityMatcher(ents, entity_surface)
        surfaces = [surface_form(x, entity_surface) for x in ents]
        # the upper bound is counted on every reference (train: every reference is a line)
        for r, text in enumerate(e["texts"]):
            tokens, hit = matcher.delexicalize(moses_tokenize(text, lowercase=False).split())
            mentions += len(ents)
            found += len(hit)
            if one_line_per_text or r == 0:
                src.append(" ".join(delex))
                tgt.append(" ".join(tokens))
                lex.append(s)
                maps.append(surfaces)
    write_lines(f"{out}/{name}.src", src)
    write_lines(f"{out}/{name}.tgt", tgt)
    if entity_surface is not None:
        write_lines(f"{out}/{name}.lex.src", lex)
        ent.write_entmap(f"{out}/{name}.entmap", maps)
    if not one_line_per_text:
        write_jsonl(f"{out}/{name}.refs.jsonl", (e["texts"] for e in entries))
        write_lines(f"{out}/{name}.entities", ("|".join(entities(e["triples"])) for e in entries))
        write_lines(f"{out}/{name}.category", (e["category"] for e in entries))
    print(f"{name}: {len(entries)} entries, {len(src)} lines")
    if entity_surface is None:
        return None
    stats = {"mentions": mentions, "found": found, "entity_match_rate": found / mentions if mentions else 0.0}
    print(json.dumps({"split": name, **stats}))
    return stats


def prepare(
    data: str, out: str, heldout: Sequence[str] = DEFAULT_HELDOUT, entity_surface: Optional[str] = None
) -> List[str]:
    """Write the splits; returns the evaluation splits written (also in ``OUT/eval_splits``).
    ``entity_surface``: whole-entity placeholders restored in this style (None: none). ``out`` is
    replaced as a whole once everything is written (see the module's docstring)."""
    with output_folder(out, owned=OUTPUTS) as tmp:
        train = read_entries(os.path.join(data, "train"))
        dev = read_entries(os.path.join(data, "dev"))
        known = {e["category"] for e in train}
        unknown = set(heldout) - known
        if unknown:
            raise DataError(
                os.path.join(data, "train"),
                0,
                f"--heldout-categories {sorted(unknown)} not among the train categories {sorted(known)}",
            )
        test_dir = os.path.join(data, "test")
        test = read_entries(test_dir) if os.path.isdir(test_dir) else None

        def split(name, entries, one_line_per_text=False):
            return write_split(tmp, name, entries, one_line_per_text, entity_surface, shown=out)

        match = {"train": split("train", [e for e in train if e["category"] not in heldout], True)}
        match["valid"] = split("valid", dev)
        splits = ["valid"]
        if heldout:
            match["heldout"] = split("heldout", [e for e in train if e["category"] in heldout])
            splits.append("heldout")
        if test is not None:
            # seen / unseen by the model: a held-out category is unseen too
            seen = known - set(heldout)
            for name, part in (
                ("test_seen", [e for e in test if e["category"] in seen]),
                ("test_unseen", [e for e in test if e["category"] not in seen]),
            ):
                if part:
                    match[name] = split(name, part)
                    splits.append(name)
        write_lines(f"{tmp}/eval_splits", splits)
        if entity_surface is not None:
            with atomic_write(f"{tmp}/entity_match.json") as f:
                json.dump(match, f, indent=1)
    print("evaluation splits: " + " ".join(splits))
    return splits


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="the WebNLG folder holding train/ and dev/")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--heldout-categories",
        default=",".join(DEFAULT_HELDOUT),
        help="training categories held out as the unseen-category split (comma list; '' for none)",
    )
    p.add_argument(
        "--entity-placeholders",
        action="store_true",
        help="each subject and object becomes one token <ent-K> in .src and its mentions in .tgt "
        "(see fairseq_knowgen.prep.entities); writes .lex.src, .entmap and entity_match.json",
    )
    p.add_argument(
        "--entity-surface",
        choices=SURFACE_STYLES,
        default="text",
        help="what <ent-K> is restored to: 'text' (disambiguation parentheses dropped, units without "
        "parentheses, ISO dates spelled out) or 'dbpedia' (the cleaned DBpedia form of the source)",
    )
    a = p.parse_args(argv)
    prepare(
        a.data,
        a.out,
        [c for c in a.heldout_categories.split(",") if c],
        a.entity_surface if a.entity_placeholders else None,
    )


if __name__ == "__main__":
    cli_entry(main)
