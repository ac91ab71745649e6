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

Evaluation inputs per split (one line per entry): ``.refs.jsonl`` (all texts, untokenized),
``.entities`` (subjects and objects, ``|``-separated), ``.category``.

    python -m fairseq_knowgen.prep.webnlg --data ../shared/data/webnlg --out OUT
"""

import argparse
import glob
import os
import re
import xml.etree.ElementTree as ET
from typing import Dict, List, Sequence

from ..textio import DataError, cli_entry
from .common import ensure_dir, moses_tokenize, write_jsonl, write_lines

DEFAULT_HELDOUT = ("Astronaut", "Monument", "University")


def clean_entity(text: str) -> str:
    text = text.replace("_", " ").replace('"', " ")
    return " ".join(text.split())


def split_predicate(pred: str) -> str:
    """``elevationAboveTheSeaLevel_(in_metres)`` -> ``elevation above the sea level ( in metres )``."""
    pred = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", pred.replace("_", " "))
    pred = re.sub(r"([()])", r" \1 ", pred)
    return " ".join(pred.lower().split())


def parse_triple(text: str, path: str) -> List[str]:
    parts = [p.strip() for p in text.split(" | ")]
    if len(parts) != 3 or not all(parts):
        raise DataError(path, 0, f"malformed triple {text!r} (expected 'subject | predicate | object')")
    return parts


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
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError as e:
            raise DataError(path, e.position[0], f"XML parse error: {e.msg if hasattr(e, 'msg') else e}") from None
        for entry in root.iter("entry"):
            triples = [parse_triple(t.text or "", path) for t in entry.iter("mtriple")]
            texts = [" ".join((t.text or "").split()) for t in entry.iter("text")]
            texts = [t for t in texts if t]
            if not triples:
                raise DataError(path, 0, f"entry {entry.get('eid')} has no <mtriple>")
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


def write_split(out: str, name: str, entries: List[Dict], one_line_per_text: bool):
    src, tgt = [], []
    for e in entries:
        s = linearize(e["triples"], lambda x: moses_tokenize(x, lowercase=False))
        for text in e["texts"] if one_line_per_text else e["texts"][:1]:
            src.append(s)
            tgt.append(moses_tokenize(text, lowercase=False))
    write_lines(f"{out}/{name}.src", src)
    write_lines(f"{out}/{name}.tgt", tgt)
    if not one_line_per_text:
        write_jsonl(f"{out}/{name}.refs.jsonl", (e["texts"] for e in entries))
        write_lines(f"{out}/{name}.entities", ("|".join(entities(e["triples"])) for e in entries))
        write_lines(f"{out}/{name}.category", (e["category"] for e in entries))
    print(f"{name}: {len(entries)} entries, {len(src)} lines")


def prepare(data: str, out: str, heldout: Sequence[str] = DEFAULT_HELDOUT) -> List[str]:
    """Write the splits; returns the evaluation splits written (also in ``OUT/eval_splits``)."""
    ensure_dir(out)
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
    write_split(out, "train", [e for e in train if e["category"] not in heldout], one_line_per_text=True)
    write_split(out, "valid", dev, one_line_per_text=False)
    splits = ["valid"]
    if heldout:
        write_split(out, "heldout", [e for e in train if e["category"] in heldout], one_line_per_text=False)
        splits.append("heldout")
    test_dir = os.path.join(data, "test")
    if os.path.isdir(test_dir):
        # seen / unseen by the model: a held-out category is unseen too
        seen = known - set(heldout)
        test = read_entries(test_dir)
        for name, part in (
            ("test_seen", [e for e in test if e["category"] in seen]),
            ("test_unseen", [e for e in test if e["category"] not in seen]),
        ):
            if part:
                write_split(out, name, part, one_line_per_text=False)
                splits.append(name)
    write_lines(f"{out}/eval_splits", splits)
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
    a = p.parse_args(argv)
    prepare(a.data, a.out, [c for c in a.heldout_categories.split(",") if c])


if __name__ == "__main__":
    cli_entry(main)
