"""Prototype retrieval for retrieve-and-edit generation (EKI: "An Enhanced Knowledge Injection Model for
Commonsense Generation").

For each concept set, the best prototype sentence of a text corpus: BM25 (``bm25s``) over
the corpus with the concepts as the query gives ``--candidates`` sentences, which are
re-ranked by how many of the concepts they cover (lemma match with ``simplemma``), BM25
score breaking ties.

Corpora:

- in-domain: the training references, never a sentence that any line of the query's own
  concept set (in any order) has as target: a sentence written for several concept sets is
  the answer of each of them, so it is excluded for all of them (an example must not see its
  own answers; the excluded hits are counted in the printed ``excluded_own``);
- test-like in-domain (``--max-shared-concepts K``): also excludes every sentence written
  for a concept set that shares more than K concepts with the query. CommonGen's unseen
  concept sets share few concepts with any training set, while a training set usually
  shares all but one with another one; without this limit, training queries find near-copies
  of their answers and the model learns to copy prototypes (``--overlap-report`` prints the
  distribution of the closest-set overlap, to choose K);
- out-of-domain: any plain text, one sentence or paragraph a line (WikiText's ``= Heading =``
  lines are dropped and paragraphs are split into sentences), in the targets' text form
  (``--text moses``: lower-cased, Moses-tokenized; ``--text raw``: cased, detokenized, for BART).

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
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..text import lemma, tokenize
from ..textio import atomic_write, cli_entry, read_lines, read_parallel


def concept_key(concepts: str) -> str:
    return " ".join(sorted(concepts.split()))


def split_plain_text(lines: Sequence[str], min_words: int = 5, max_words: int = 40, text: str = "moses") -> List[str]:
    """Sentences of a plain-text corpus in the targets' text form: lower-cased and Moses-tokenized
    (``moses``), or cased and untokenized (``raw``, for BART: WikiText's tokenization undone with
    Moses' detokenizer, ``The game 's plot`` -> ``The game's plot``)."""
    from ..text import moses_tokenize

    if text not in ("moses", "raw"):
        raise ValueError(f"text must be moses or raw, got {text!r}")
    detok = None
    if text == "raw":
        from sacremoses import MosesDetokenizer

        detok = MosesDetokenizer(lang="en")
    out = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("="):
            continue
        line = line.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
        for sent in re.split(r"(?<=[.!?])\s+", line):
            n = len(sent.split())
            if min_words <= n <= max_words and "<unk>" not in sent:  # WikiText's own unknown-word mark
                out.append(moses_tokenize(sent) if detok is None else detok.detokenize(sent.split()))
    return out


def concept_overlap_histogram(queries: Sequence[str], corpus_keys: Sequence[str]) -> Dict[int, int]:
    """How many concepts each distinct query shares with its closest *other* concept set of
    the corpus: ``{shared: number of queries}`` (a query's own set, in any order, is skipped).

    This is the measure the test-like option ``max_shared`` is set from: an unseen concept set
    shares few concepts with any training set, a training set usually shares all but one with
    another training set.
    """
    from scipy import sparse

    sets = sorted(set(corpus_keys))
    vocab: Dict[str, int] = {}

    def rows(keys):
        data, ind, ptr = [], [], [0]
        for k in keys:
            cols = sorted({vocab.setdefault(c, len(vocab)) for c in k.split()})
            ind.extend(cols)
            data.extend([1] * len(cols))
            ptr.append(len(ind))
        return data, ind, ptr

    cdata, cind, cptr = rows(sets)
    uq = sorted({concept_key(q) for q in queries})
    qdata, qind, qptr = rows(uq)
    n = len(vocab)
    corpus_m = sparse.csr_matrix((cdata, cind, cptr), shape=(len(sets), n), dtype=np.int32)
    query_m = sparse.csr_matrix((qdata, qind, qptr), shape=(len(uq), n), dtype=np.int32)
    set_index = {k: i for i, k in enumerate(sets)}
    hist: Dict[int, int] = {}
    chunk = 512
    for lo in range(0, len(uq), chunk):
        shared = (query_m[lo : lo + chunk] @ corpus_m.T).toarray()  # queries x corpus sets
        for r, q in enumerate(uq[lo : lo + chunk]):
            if q in set_index:
                shared[r, set_index[q]] = 0  # the query's own concept set
            best = int(shared[r].max()) if shared.shape[1] else 0
            hist[best] = hist.get(best, 0) + 1
    return dict(sorted(hist.items()))


class PrototypeRetriever:
    """BM25 over a corpus + concept-coverage re-ranking, with leak-free exclusions.

    Args:
        corpus: candidate sentences (distinct).
        keys: for in-domain retrieval, the concept sets each corpus sentence was written
            for (a sentence written for several concept sets has several keys, each a
            :func:`concept_key`); ``None`` for plain text.
    """

    def __init__(self, corpus: Sequence[str], keys: Optional[Sequence[Sequence[str]]] = None):
        import bm25s

        self.corpus = list(corpus)
        self.keys = [tuple(k) for k in keys] if keys is not None else None
        if self.keys is not None and len(self.keys) != len(self.corpus):
            raise ValueError("one tuple of concept keys per corpus sentence")
        self.index = bm25s.BM25()
        self.index.index(bm25s.tokenize(self.corpus, stopwords="en", show_progress=False), show_progress=False)
        self._lemmas = [None] * len(self.corpus)
        self.stats: Dict[str, int] = {}

    def lemmas(self, i: int) -> set:
        if self._lemmas[i] is None:
            self._lemmas[i] = {lemma(t) for t in tokenize(self.corpus[i])}
        return self._lemmas[i]

    def exclusion(self, d: int, qkey: str, qset: set, max_shared: Optional[int]) -> Optional[str]:
        """Why corpus sentence ``d`` may not be the prototype of query ``qkey``, or None.

        ``own``: some line of the query's concept set has ``d`` as its target (the answer
        itself); ``overlap``: ``d`` was written for a concept set that shares more than
        ``max_shared`` concepts with the query (a near-duplicate no unseen query would find).
        """
        if self.keys is None:
            return None
        if qkey in self.keys[d]:
            return "own"
        if max_shared is not None and any(len(qset & set(k.split())) > max_shared for k in self.keys[d]):
            return "overlap"
        return None

    def retrieve(
        self,
        queries: Sequence[str],
        candidates: int = 30,
        n_threads: int = 0,
        max_shared: Optional[int] = None,
    ) -> List[Tuple[int, float]]:
        """Best prototype index (-1: none left) and the share of concepts it covers, per query.

        The ``candidates`` best BM25 hits that are not excluded (:meth:`exclusion`) are
        re-ranked by concept coverage; when exclusions leave fewer than ``candidates``, BM25
        is asked again for 4x as many hits. ``self.stats`` counts the excluded hits among
        those seen (``excluded_own``, ``excluded_overlap``) and the queries left without one.
        """
        import bm25s

        unique = sorted(set(queries))
        n = len(self.corpus)
        best: Dict[str, Tuple[int, float]] = {}
        stats = {"excluded_own": 0, "excluded_overlap": 0, "no_prototype": 0}
        pending, k = unique, min(candidates, n)
        while pending:
            docs, scores = self.index.retrieve(
                bm25s.tokenize(pending, stopwords="en", show_progress=False),
                k=k,
                show_progress=False,
                n_threads=n_threads,
            )
            retry = []
            for q, row, srow in zip(pending, docs, scores):
                concepts = [lemma(c) for c in q.split()]
                qkey, qset = concept_key(q), set(q.split())
                kept, excluded = [], {"own": 0, "overlap": 0}
                for d, s in zip(row.tolist(), srow.tolist()):
                    why = self.exclusion(d, qkey, qset, max_shared)
                    if why:
                        excluded[why] += 1
                    elif len(kept) < candidates:
                        kept.append((d, s))
                if len(kept) < candidates and k < n:
                    retry.append(q)
                    continue
                stats["excluded_own"] += excluded["own"]
                stats["excluded_overlap"] += excluded["overlap"]
                choice, choice_rank = -1, (-1, -np.inf)
                for d, s in kept:
                    have = self.lemmas(d)
                    rank = (sum(c in have for c in concepts), s)
                    if rank > choice_rank:
                        choice, choice_rank = d, rank
                stats["no_prototype"] += choice < 0
                best[q] = (choice, max(choice_rank[0], 0) / max(len(concepts), 1))
            pending, k = retry, min(4 * k, n)
        self.stats = stats
        return [best[q] for q in queries]


def in_domain_corpus(sentences: Sequence[str], concept_sets: Sequence[str]) -> Tuple[List[str], List[Tuple[str, ...]]]:
    """Distinct training sentences, each with *every* concept set it was written for.

    (Keeping only the first set would let a sentence written for two sets become the
    prototype of the second one: its own answer.)
    """
    keys: Dict[str, Dict[str, None]] = {}
    for sent, concepts in zip(sentences, concept_sets):
        keys.setdefault(sent, {})[concept_key(concepts)] = None
    return list(keys), [tuple(k) for k in keys.values()]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queries", required=True, help="concept sets, one per line (space-separated)")
    p.add_argument("--corpus", required=True, help="sentences to retrieve from, one per line")
    p.add_argument(
        "--corpus-keys",
        help="concept set of each corpus line (in-domain): a sentence any line of the query's own concept set "
        "has as target is never its prototype",
    )
    p.add_argument("--plain-text", action="store_true", help="the corpus is running text: split into sentences")
    p.add_argument(
        "--text",
        choices=("moses", "raw"),
        default="moses",
        help="--plain-text sentences lower-cased and Moses-tokenized (moses, the from-scratch recipe) or cased and "
        "untokenized (raw, BART)",
    )
    p.add_argument("--out", required=True, help="prototype per query line")
    p.add_argument("--candidates", type=int, default=30, help="BM25 candidates re-ranked by concept coverage")
    p.add_argument(
        "--max-shared-concepts",
        type=int,
        default=None,
        metavar="K",
        help="test-like retrieval (needs --corpus-keys): also exclude every sentence written for a concept set "
        "that shares more than K concepts with the query (default: no such limit)",
    )
    p.add_argument(
        "--overlap-report",
        action="store_true",
        help="with --corpus-keys: print how many concepts each query shares with its closest other corpus set",
    )
    p.add_argument("--threads", type=int, default=0, help="bm25s threads (0: one, -1: all cores)")
    a = p.parse_args(argv)
    if a.max_shared_concepts is not None and not a.corpus_keys:
        p.error("--max-shared-concepts needs --corpus-keys")
    t0 = time.time()
    queries = [" ".join(q.split()) for q in read_lines(a.queries, "query")]
    keys = None
    if a.corpus_keys:
        corpus, key_lines = read_parallel(a.corpus, a.corpus_keys, what="corpus")
        corpus, keys = in_domain_corpus(corpus, key_lines)
    else:
        corpus = read_lines(a.corpus, "corpus")
        corpus = split_plain_text(corpus, text=a.text) if a.plain_text else corpus
    retriever = PrototypeRetriever(corpus, keys)
    found = retriever.retrieve(queries, a.candidates, a.threads, max_shared=a.max_shared_concepts)
    with atomic_write(a.out) as f:
        f.writelines((corpus[d] if d >= 0 else "") + "\n" for d, _ in found)
    report = {
        "queries": len(queries),
        "distinct": len(set(queries)),
        "corpus": len(corpus),
        "max_shared_concepts": a.max_shared_concepts,
        **retriever.stats,
        "prototype_concept_coverage": round(100 * float(np.mean([c for _, c in found])), 2),
    }
    if a.overlap_report and keys is not None:
        hist = concept_overlap_histogram(queries, [k for ks in keys for k in ks])
        report["closest_set_shares"] = {str(k): v for k, v in hist.items()}
    report["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    sys.exit(0 if cli_entry(main) else 1)
