"""Floors for the K-BERT tables that need no neural network.

    python -m fairseq_knowgen.evaluation.kbert_floors tfidf --data OUT/data --split valid --pred P
    python -m fairseq_knowgen.evaluation.kbert_floors dictionary --data OUT/data --kg KG --split valid --pred P

* ``tfidf`` (classification): character 1-3-gram TF-IDF + logistic regression (scikit-learn),
  fitted on ``DATA/train.tsv``.
* ``dictionary`` (tagging): longest match of the KG's subjects over the characters (the same trie
  as K-BERT's knowledge layer), each match typed by its subject's category (``--category-predicate``,
  default ``类别``) through ``--type-map`` (default: 疾病=Disease 症状=Symptom 部位=BodyPart
  治疗=Cure 检查=Examine; printed); a subject with no mapped category is not tagged; the first
  mapped category in file order wins.

The predictions are written in the format ``scripts/kbert_score.py`` reads (score them with it).
"""

import argparse
import os
from typing import Dict, List

from ..data.kbert_dataset import read_tsv
from ..modules.knowledge_graph import KnowledgeGraph, read_triples
from ..textio import DataError, atomic_write, cli_entry

DEFAULT_TYPE_MAP = "疾病=Disease,症状=Symptom,部位=BodyPart,治疗=Cure,检查=Examine"


def tfidf_floor(data: str, split: str, seed: int = 1) -> List[str]:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    train = read_tsv(os.path.join(data, "train.tsv"), False)
    test = read_tsv(os.path.join(data, f"{split}.tsv"), False)
    vec = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True, min_df=2)
    x = vec.fit_transform("".join(ex.tokens) for ex in train)
    clf = LogisticRegression(max_iter=2000, C=4.0, random_state=seed).fit(x, [ex.label for ex in train])
    return list(clf.predict(vec.transform("".join(ex.tokens) for ex in test)))


def parse_type_map(spec: str) -> Dict[str, str]:
    pairs = [x.split("=", 1) for x in spec.split(",") if x.strip()]
    if any(len(p) != 2 for p in pairs):
        raise DataError("--type-map", 0, f"expected category=TYPE,... not {spec!r}")
    return {k.strip(): v.strip() for k, v in pairs}


def dictionary_floor(
    data: str, kg_path: str, split: str, type_map: Dict[str, str], predicate: str = "类别"
) -> List[str]:
    types: Dict[str, str] = {}
    for s, p, o in read_triples(kg_path):
        if p == predicate and o in type_map:
            types.setdefault(s, type_map[o])
    kg = KnowledgeGraph([(s, predicate, t) for s, t in types.items()], max_entities=1)
    out = []
    for ex in read_tsv(os.path.join(data, f"{split}.tsv"), True):
        tags = ["O"] * len(ex.tokens)
        for start, end in kg.mentions(ex.tokens):
            kind = "".join(kg.triples_of(ex.tokens[start:end])[0][1])
            tags[start:end] = [f"B-{kind}"] + [f"I-{kind}"] * (end - start - 1)
        out.append(" ".join(tags))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("floor", choices=("tfidf", "dictionary"))
    p.add_argument("--data", required=True, help="the task folder (train.tsv, SPLIT.tsv)")
    p.add_argument("--split", default="valid")
    p.add_argument("--pred", required=True)
    p.add_argument("--kg", help="dictionary: the KG whose subjects are matched")
    p.add_argument("--type-map", default=DEFAULT_TYPE_MAP, help="dictionary: category=NER type, comma-separated")
    p.add_argument("--category-predicate", default="类别")
    a = p.parse_args(argv)
    if a.floor == "tfidf":
        preds = tfidf_floor(a.data, a.split)
    else:
        if not a.kg:
            p.error("dictionary needs --kg")
        type_map = parse_type_map(a.type_map)
        print("category -> NER type: " + ", ".join(f"{k} -> {v}" for k, v in type_map.items()))
        preds = dictionary_floor(a.data, a.kg, a.split, type_map, a.category_predicate)
    with atomic_write(a.pred) as f:
        f.writelines(x + "\n" for x in preds)


if __name__ == "__main__":
    cli_entry(main)
