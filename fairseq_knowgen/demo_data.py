"""A small built-in knowledge-to-text data set: DBpedia-like triples rendered by templates.

Used by the README demo, the benchmark harness (as its synthetic default) and the tests.
Each input is 1-3 triples about one person, linearized WebNLG-style with subject,
predicate and object markers; the target verbalizes them with one of several templates
per predicate, joined in random order. Entity names come from finite pools, so every
token of dev and test also occurs in train, while the name *combinations* are new::

    <S> Mara Delcourt <P> birth place <O> Lisbon <S> Mara Delcourt <P> occupation <O> chemist
    -> "Mara Delcourt works as a chemist and was born in Lisbon ."

With ``--disjoint-names`` valid and test draw their person, city and club names from other
pools (:data:`UNSEEN`), none of whose words occurs in train: every name of valid and test is
new to the model, as the entities of WebNLG's held-out categories are (the README demo;
occupations stay shared, they are common nouns). The train split is the same as without the
flag (same seed), only valid and test change.

    python -m fairseq_knowgen.demo_data --out DIR [--train 3000 --valid 200 --test 200] [--disjoint-names]

writes ``{train,valid,test}.{src,tgt}`` (space-tokenized), ``{valid,test}.refs.jsonl``
(all template renderings of the same triples, as multiple references) and
``{valid,test}.entities`` (the subject and objects of each input, ``|``-separated, for the
entity recall of ``scripts/evaluate.py --entities``).
"""

import argparse
import json
import os
import random
from typing import Dict, List, Sequence, Tuple

from .textio import atomic_write, cli_entry, output_folder

FIRST = (
    "Mara Ivo Lena Tomas Ada Kofi Nils Rosa Emil Yara Otto Ines Bruno Lia Sven Noor "
    "Pavel Greta Omar Hana Felix Zora Anton Mira Leo Dina Hugo Elsa Rafael Juno"
).split()
LAST = (
    "Delcourt Berg Okafor Lindqvist Moreau Tanaka Varga Novak Haddad Ferreira Kowalski "
    "Brandt Santos Dubois Eriksen Rossi Petrov Nakamura Weber Almeida Costa Fischer "
    "Quinn Horvat Silva Jensen Marsh Kaplan Ortega Vogel"
).split()
CITIES = (
    "Lisbon Oslo Nairobi Kyoto Porto Tallinn Lyon Dakar Cusco Bergen Riga Sapporo "
    "Malaga Turku Accra Gdansk Lima Graz Hue Quito"
).split()
JOBS = "chemist painter pilot architect violinist surgeon poet engineer botanist sculptor".split()
CLUBS = ("Riverside Harriers|Northfield Rovers|Atlas United|Harbour City|Union Vale|" "Granite Athletic").split("|")

# valid and test names with --disjoint-names: no word here is a word of the pools above or of a template
UNSEEN = {
    "first": (
        "Ilse Joaquin Maren Taro Ayla Bram Selin Dario Nadia Ulf Keira Matteo Odile Ravi Thea Cyrus "
        "Wanda Idris Esme Lorcan"
    ).split(),
    "last": (
        "Achterberg Mbeki Solberg Ivanova Castellanos Yilmaz Marchetti Oyelaran Halvorsen Duarte "
        "Kuznetsov Lindahl Abernathy Zielinski Okonkwo Bianchi Sorensen Takeda Vasquez Gallagher"
    ).split(),
    "cities": "Tromso Antwerp Valparaiso Hobart Krakow Asmara Leuven Izmir Windhoek Trieste Mombasa Bilbao".split(),
    "clubs": "Kestrel Albion|Ironbridge Dynamo|Westmoor Comets|Lakeshore Wanderers".split("|"),
}
SEEN = {"first": FIRST, "last": LAST, "cities": CITIES, "clubs": CLUBS}

PREDICATES = {
    "birth place": (CITIES, ["was born in {o}", "is from {o}", "comes from {o}"]),
    "occupation": (JOBS, ["works as a {o}", "is a {o}", "is employed as a {o}"]),
    "residence": (CITIES, ["lives in {o}", "resides in {o}", "has a home in {o}"]),
    "club": (CLUBS, ["plays for {o}", "is a member of {o}", "is on the {o} team"]),
}


def sample_triples(rng: random.Random, pools: Dict[str, Sequence[str]] = SEEN) -> List[Tuple[str, str, str]]:
    """1-3 triples about one person; names from ``pools`` (:data:`SEEN` or :data:`UNSEEN`)."""
    subject = f"{rng.choice(pools['first'])} {rng.choice(pools['last'])}"
    preds = rng.sample(sorted(PREDICATES), rng.randint(1, 3))
    objects = {"birth place": pools["cities"], "residence": pools["cities"], "club": pools["clubs"], "occupation": JOBS}
    return [(subject, p, rng.choice(objects[p])) for p in preds]


def entities(triples) -> List[str]:
    """The subject and objects of one input, each once, in order (the ``.entities`` line)."""
    out = []
    for s, _, o in triples:
        out += [e for e in (s, o) if e not in out]
    return out


def linearize(triples) -> str:
    return " ".join(f"<S> {s} <P> {p} <O> {o}" for s, p, o in triples)


def render(triples, rng: random.Random) -> str:
    """One verbalization: a verb phrase per triple, in random order, in one sentence
    ("X vp1 , vp2 and vp3 .") or, for several triples, two ("X Y vp1 . X vp2 and vp3 .", with the first name)."""
    subject = triples[0][0]
    phrases = [rng.choice(PREDICATES[p][1]).format(o=o) for _, p, o in triples]
    rng.shuffle(phrases)
    if len(phrases) > 1 and rng.random() < 0.3:
        return f"{subject} {phrases[0]} . {subject.split()[0]} {_join(phrases[1:])} ."
    return f"{subject} {_join(phrases)} ."


def _join(phrases: List[str]) -> str:
    return phrases[0] if len(phrases) == 1 else " , ".join(phrases[:-1]) + " and " + phrases[-1]


def all_renderings(triples, rng: random.Random, k: int = 4) -> List[str]:
    seen = []
    for _ in range(8 * k):
        r = render(triples, rng)
        if r not in seen:
            seen.append(r)
        if len(seen) == k:
            break
    return seen


def write_split(out: str, split: str, n: int, rng: random.Random, pools: Dict[str, Sequence[str]] = SEEN):
    src, tgt, refs, ents = [], [], [], []
    for _ in range(n):
        triples = sample_triples(rng, pools)
        src.append(linearize(triples))
        tgt.append(render(triples, rng))
        refs.append(all_renderings(triples, rng))
        ents.append("|".join(entities(triples)))
    with atomic_write(os.path.join(out, f"{split}.src")) as f:
        f.write("\n".join(src) + "\n")
    with atomic_write(os.path.join(out, f"{split}.tgt")) as f:
        f.write("\n".join(tgt) + "\n")
    if split != "train":
        with atomic_write(os.path.join(out, f"{split}.refs.jsonl")) as f:
            f.write("\n".join(json.dumps(r) for r in refs) + "\n")
        with atomic_write(os.path.join(out, f"{split}.entities")) as f:
            f.write("\n".join(ents) + "\n")


def make_dataset(
    out: str, train: int = 3000, valid: int = 200, test: int = 200, seed: int = 1, disjoint_names: bool = False
):
    """Write the three splits to ``out``; ``disjoint_names``: valid and test names from :data:`UNSEEN`.
    ``out`` is replaced as a whole once all are written (:func:`fairseq_knowgen.textio.output_folder`;
    files there that are none of these outputs are kept)."""
    rng = random.Random(seed)
    with output_folder(out, owned=OUTPUTS) as tmp:
        for split, n in (("train", train), ("valid", valid), ("test", test)):
            write_split(tmp, split, n, rng, UNSEEN if disjoint_names and split != "train" else SEEN)


OUTPUTS = ("*.src", "*.tgt", "*.refs.jsonl", "*.entities")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--train", type=int, default=3000)
    p.add_argument("--valid", type=int, default=200)
    p.add_argument("--test", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--disjoint-names",
        action="store_true",
        help="valid and test take person, city and club names that never occur in train (the UNSEEN pools)",
    )
    a = p.parse_args(argv)
    make_dataset(a.out, a.train, a.valid, a.test, a.seed, a.disjoint_names)


if __name__ == "__main__":
    cli_entry(main)
