"""Prototype retrieval for retrieve-and-edit generation (EKI, ``shared/seeds/eki_bart.txt``).

For each concept set, the best prototype sentence of a text corpus: BM25 (``bm25s``) over
the corpus with the concepts as the query gives ``--candidates`` sentences, which are
re-ranked by how many of the concepts they cover (lemma match with ``simplemma``), BM25
score breaking ties.

Corpora:

- in-domain: the training references, never those written for the same concept set (an
  example must not see its own answers: sentences whose concept set equals the query's,
  in any order, are skipped);
- out-of-domain: any plain text, one sentence or paragraph a line (WikiText's ``= Heading =``
  lines are dropped and paragraphs are split into sentences).

    python scripts/retrieve_prototypes.py --queries RAW/valid.src --out RAW/valid.proto \\
        --corpus RAW/train.tgt --corpus-keys RAW/train.src       # in-domain
    python scripts/retrieve_prototypes.py --queries RAW/valid.src --out RAW/valid.proto.wiki \\
        --corpus ../shared/data/wikitext-2/valid.txt --plain-text
"""

import argparse
import json
import re
import sys
import time
from typing import List, Optional, Sequence

import numpy as np

from ..evaluation.metrics import lemma, tokenize
from ..textio import atomic_write, read_lines, read_parallel


def concept_key(concepts: str) -> str:
    return " ".join(sorted(concepts.split()))


def split_plain_text(lines: Sequence[str], min_words: int = 5, max_words: int = 40) -> List[str]:
    """Sentences of a plain-text corpus, lower-cased and tokenized like the targets."""
    from .common import moses_tokenize

    out = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("="):
            continue
        line = line.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
        for sent in re.split(r"(?<=[.!?])\s+", line):
            n = len(sent.split())
            if min_words <= n <= max_words and "<unk>" not in sent:  # WikiText's own unknown-word mark
                out.append(moses_tokenize(sent))
    return out


class PrototypeRetriever:
    """BM25 over a corpus + concept-coverage re-ranking."""

    def __init__(self, corpus: Sequence[str], keys: Optional[Sequence[str]] = None):
        import bm25s

        self.corpus = list(corpus)
        self.keys = list(keys) if keys is not None else None
        self.index = bm25s.BM25()
        self.index.index(bm25s.tokenize(self.corpus, stopwords="en", show_progress=False), show_progress=False)
        self._lemmas = [None] * len(self.corpus)

    def lemmas(self, i: int) -> set:
        if self._lemmas[i] is None:
            self._lemmas[i] = {lemma(t) for t in tokenize(self.corpus[i])}
        return self._lemmas[i]

    def retrieve(self, queries: Sequence[str], candidates: int = 30, n_threads: int = 0):
        """Best prototype index and the share of concepts it covers, for each query."""
        import bm25s

        unique = sorted(set(queries))
        k = min(candidates, len(self.corpus))
        docs, scores = self.index.retrieve(
            bm25s.tokenize(unique, stopwords="en", show_progress=False), k=k, show_progress=False, n_threads=n_threads
        )
        best = {}
        for q, row, srow in zip(unique, docs, scores):
            concepts = [lemma(c) for c in q.split()]
            qkey = concept_key(q)
            choice, choice_rank = -1, (-1, -np.inf)
            for d, s in zip(row.tolist(), srow.tolist()):
                if self.keys is not None and self.keys[d] == qkey:
                    continue  # one of this concept set's own references
                have = self.lemmas(d)
                rank = (sum(c in have for c in concepts), s)
                if rank > choice_rank:
                    choice, choice_rank = d, rank
            best[q] = (choice, choice_rank[0] / max(len(concepts), 1))
        return [best[q] for q in queries]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queries", required=True, help="concept sets, one per line (space-separated)")
    p.add_argument("--corpus", required=True, help="sentences to retrieve from, one per line")
    p.add_argument("--corpus-keys", help="concept set of each corpus line (in-domain): own references are skipped")
    p.add_argument("--plain-text", action="store_true", help="the corpus is running text: split into sentences")
    p.add_argument("--out", required=True, help="prototype per query line")
    p.add_argument("--candidates", type=int, default=30, help="BM25 candidates re-ranked by concept coverage")
    p.add_argument("--threads", type=int, default=0, help="bm25s threads (0: one, -1: all cores)")
    a = p.parse_args(argv)
    t0 = time.time()
    queries = [" ".join(q.split()) for q in read_lines(a.queries, "query")]
    keys = None
    if a.corpus_keys:
        corpus, key_lines = read_parallel(a.corpus, a.corpus_keys, what="corpus")
        # one entry per distinct sentence; its key is the concept set it was written for
        uniq = {}
        for sent, key in zip(corpus, key_lines):
            uniq.setdefault(sent, concept_key(key))
        corpus, keys = list(uniq), list(uniq.values())
    else:
        corpus = read_lines(a.corpus, "corpus")
        corpus = split_plain_text(corpus) if a.plain_text else corpus
    retriever = PrototypeRetriever(corpus, keys)
    found = retriever.retrieve(queries, a.candidates, a.threads)
    with atomic_write(a.out) as f:
        f.writelines((corpus[d] if d >= 0 else "") + "\n" for d, _ in found)
    report = {
        "queries": len(queries),
        "distinct": len(set(queries)),
        "corpus": len(corpus),
        "prototype_concept_coverage": round(100 * float(np.mean([c for _, c in found])), 2),
        "seconds": round(time.time() - t0, 1),
    }
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
