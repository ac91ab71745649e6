"""A small built-in knowledge-to-text data set: DBpedia-like triples rendered by templates.

Used by the README demo, the benchmark harness (as its synthetic default) and the tests.
Each input is 1-3 triples about one person, linearized WebNLG-style with subject,
predicate and object markers; the target verbalizes them with one of several templates
per predicate, joined in random order. Entity names come from finite pools, so every
token of dev and test also occurs in train, while the name *combinations* are new::

    <S> Mara Delcourt <P> birth place <O> Lisbon <S> Mara Delcourt <P> occupation <O> chemist
    -> "Mara Delcourt , a chemist , was born in Lisbon ."

    python -m fairseq_knowgen.demo_data --out DIR [--train 3000 --valid 200 --test 200]

writes ``{train,valid,test}.{src,tgt}`` (space-tokenized) and ``{valid,test}.refs.jsonl``
(all template renderings of the same triples, as multiple references).
"""

import argparse
import json
import os
import random
from typing import List, Tuple

from .textio import atomic_write

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

PREDICATES = {
    "birth place": (CITIES, ["was born in {o}", "is from {o}", "comes from {o}"]),
    "occupation": (JOBS, ["works as a {o}", "is a {o}", "is employed as a {o}"]),
    "residence": (CITIES, ["lives in {o}", "resides in {o}", "has a home in {o}"]),
    "club": (CLUBS, ["plays for {o}", "is a member of {o}", "is on the {o} team"]),
}


def sample_triples(rng: random.Random) -> List[Tuple[str, str, str]]:
    subject = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    preds = rng.sample(sorted(PREDICATES), rng.randint(1, 3))
    return [(subject, p, rng.choice(PREDICATES[p][0])) for p in preds]


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


def write_split(out: str, split: str, n: int, rng: random.Random):
    src, tgt, refs = [], [], []
    for _ in range(n):
        triples = sample_triples(rng)
        src.append(linearize(triples))
        tgt.append(render(triples, rng))
        refs.append(all_renderings(triples, rng))
    with atomic_write(os.path.join(out, f"{split}.src")) as f:
        f.write("\n".join(src) + "\n")
    with atomic_write(os.path.join(out, f"{split}.tgt")) as f:
        f.write("\n".join(tgt) + "\n")
    if split != "train":
        with atomic_write(os.path.join(out, f"{split}.refs.jsonl")) as f:
            f.write("\n".join(json.dumps(r) for r in refs) + "\n")


def make_dataset(out: str, train: int = 3000, valid: int = 200, test: int = 200, seed: int = 1):
    rng = random.Random(seed)
    for split, n in (("train", train), ("valid", valid), ("test", test)):
        write_split(out, split, n, rng)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--train", type=int, default=3000)
    p.add_argument("--valid", type=int, default=200)
    p.add_argument("--test", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    make_dataset(a.out, a.train, a.valid, a.test, a.seed)


if __name__ == "__main__":
    main()
