"""Corpus metrics for knowledge-to-text generation.

Every function takes plain (detokenized) strings; one hypothesis per input and one *list*
of references per input (CommonGen and WebNLG have several). Where a metric needs tokens
it uses :func:`tokenize` (lower-cased words and punctuation), so that all metrics of one
report see the same tokens. Well-kept libraries do the work wherever one exists:

- BLEU-4: ``sacrebleu`` (corpus BLEU, multiple references, its own 13a tokenizer);
- ROUGE-L: ``rouge_score`` (F-measure, best reference per input, averaged);
- CIDEr-D: ``pycocoevalcap`` (the COCO caption implementation, which is CIDEr-D);
- lemmas for concept coverage: ``simplemma``.

Tokens, lemmas and entity mentions (WebNLG) come from :mod:`fairseq_knowgen.text`, whose
:class:`~fairseq_knowgen.text.EntityMatcher` also makes the whole-entity placeholders, so that
``entity_recall`` of an output and prep's ``entity_match_rate`` of a reference count the same way.
"""

import math
from collections import Counter
from typing import Dict, List, Optional, Sequence

from ..text import EntityMatcher, lemma, moses_tokenize, tokenize

def _check_aligned(hyps: Sequence, other: Sequence, what: str):
    if len(hyps) != len(other):
        raise ValueError(f"{len(hyps)} hypotheses but {len(other)} {what}")


def bleu4(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """Corpus BLEU-4 (0-100) with a variable number of references per input (sacrebleu)."""
    from sacrebleu.metrics import BLEU

    _check_aligned(hyps, refs, "reference lists")
    n_streams = max(len(r) for r in refs)
    # sacrebleu takes reference *streams*; inputs with fewer references are padded with None
    streams = [[r[k] if k < len(r) else None for r in refs] for k in range(n_streams)]
    return BLEU(max_ngram_order=4).corpus_score(list(hyps), streams).score


def rouge_l(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """ROUGE-L F-measure (0-100): for each input the best reference, then the mean."""
    from rouge_score.rouge_scorer import RougeScorer

    _check_aligned(hyps, refs, "reference lists")
    # rouge_score's default tokenizer drops punctuation and lower-cases; no stemming
    scorer = RougeScorer(["rougeL"], use_stemmer=False)
    best = [max(scorer.score(r, h)["rougeL"].fmeasure for r in rs) for h, rs in zip(hyps, refs)]
    return 100.0 * sum(best) / max(len(best), 1)


def cider_d(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """CIDEr-D (x10 scale, as the COCO implementation reports it) over :func:`tokenize`d text."""
    from pycocoevalcap.cider.cider import Cider

    _check_aligned(hyps, refs, "reference lists")
    gts = {i: [" ".join(tokenize(r)) for r in rs] for i, rs in enumerate(refs)}
    res = {i: [" ".join(tokenize(h))] for i, h in enumerate(hyps)}
    score, _ = Cider().compute_score(gts, res)
    return float(score)


def concept_coverage(hyps: Sequence[str], concepts: Sequence[Sequence[str]]) -> float:
    """Share (0-100) of input concepts found in the output, matching lemmas.

    A concept (possibly several words, e.g. "ice cream") counts as covered when the lemma
    of each of its words occurs among the lemmas of the output tokens. The score is the mean
    over inputs of the covered share, as in CommonGen's coverage metric.
    """
    _check_aligned(hyps, concepts, "concept lists")
    shares = []
    for h, cs in zip(hyps, concepts):
        if not cs:
            continue
        have = {lemma(t) for t in tokenize(h)}
        covered = sum(all(lemma(w) in have for w in tokenize(c)) for c in cs)
        shares.append(covered / len(cs))
    return 100.0 * sum(shares) / max(len(shares), 1)


def copy_precision_recall(
    hyps: Sequence[str], sources: Sequence[str], refs: Sequence[Sequence[str]]
) -> Dict[str, float]:
    """Copy precision and recall (0-100) against source tokens, over word types per input.

    - copied words C = types in the output that also occur in the source;
    - wanted words W = source types that occur in at least one reference;
    - precision = sum |C ∩ W| / sum |C|: how many copied words a reference also copies;
    - recall    = sum |C ∩ W| / sum |W|: how many words that should be copied were.
    Punctuation-only tokens are ignored.
    """
    _check_aligned(hyps, sources, "sources")
    _check_aligned(hyps, refs, "reference lists")
    hit = copied = wanted = 0
    for h, s, rs in zip(hyps, sources, refs):
        src = _words(s)
        c = _words(h) & src
        w = src & set().union(*(_words(r) for r in rs))
        hit += len(c & w)
        copied += len(c)
        wanted += len(w)
    return {
        "copy_precision": 100.0 * hit / copied if copied else 0.0,
        "copy_recall": 100.0 * hit / wanted if wanted else 0.0,
    }


def _words(text: str) -> set:
    return {t for t in tokenize(text) if any(ch.isalnum() for ch in t)}


def _ngrams(tokens: List[str], n: int) -> List[tuple]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def novel_ngram_ratio(hyps: Sequence[str], sources: Sequence[str], n: int = 2) -> float:
    """Share (0-100) of output n-grams (all occurrences, corpus level) absent from the source."""
    _check_aligned(hyps, sources, "sources")
    novel = total = 0
    for h, s in zip(hyps, sources):
        src = set(_ngrams(tokenize(s), n))
        grams = _ngrams(tokenize(h), n)
        novel += sum(g not in src for g in grams)
        total += len(grams)
    return 100.0 * novel / total if total else 0.0


def repeated_ngram_rate(hyps: Sequence[str], n: int = 3) -> Dict[str, float]:
    """Repetition within each output (0-100).

    - ``rep{n}_outputs``: share of outputs in which some n-gram occurs more than once;
    - ``rep{n}_ngrams``: share of all output n-grams that duplicate an earlier one in the
      same output (the paper's "duplicate n-grams" rate), at corpus level.
    """
    with_rep = dup = total = 0
    for h in hyps:
        grams = _ngrams(tokenize(h), n)
        counts = Counter(grams)
        extra = sum(c - 1 for c in counts.values())
        with_rep += extra > 0
        dup += extra
        total += len(grams)
    return {
        f"rep{n}_outputs": 100.0 * with_rep / len(hyps) if hyps else 0.0,
        f"rep{n}_ngrams": 100.0 * dup / total if total else 0.0,
    }


def coverage_entropy(coverage: Sequence[float], eps: float = 1e-12) -> Optional[float]:
    """Entropy (nats) of a coverage vector normalized to a distribution (diminishing attention,
    Section 5 analysis): higher means attention spread more evenly over the source."""
    total = float(sum(coverage))
    if total <= 0:
        return None
    ps = [c / total for c in coverage if c > eps]
    return -sum(p * math.log(p) for p in ps)


def entity_mention_counts(hyps: Sequence[str], entities: Sequence[Sequence[str]]) -> List[List[int]]:
    """Per output, the number of mentions of each of its source entities.

    A thin adapter over the matcher that ``prep.webnlg --entity-placeholders`` uses on the
    references (:class:`fairseq_knowgen.text.EntityMatcher`, default ``text`` style), so
    that this count and the placeholder upper bound ``entity_match_rate`` agree: the entities (the
    cleaned DBpedia forms of the ``.entities`` file) and the output are Moses-tokenized as prep
    tokenizes them, and mentions are found ignoring case, accents and punctuation, with the
    matcher's variants (no disambiguating parenthesis, numbers without ``.0`` and with or without
    their unit, dates in the usual English forms, ``Austin`` for ``Austin, Texas``, ``English`` for
    ``English language``, case-sensitive initials). Mentions never overlap and the longest is
    taken first, so ``Texas`` inside a mention of ``Abilene, Texas`` is no mention of ``Texas``.
    An entity listed twice for one input is counted once (both positions get the same count).
    """
    _check_aligned(hyps, entities, "entity lists")
    out = []
    for h, ents in zip(hyps, entities):
        forms = [moses_tokenize(e, lowercase=False) for e in ents]
        unique = list(dict.fromkeys(forms))
        counts = [0] * len(unique)
        for _, _, k in EntityMatcher(unique).find(moses_tokenize(h, lowercase=False).split()):
            counts[k] += 1
        out.append([counts[unique.index(f)] for f in forms])
    return out


def entity_copy(
    hyps: Sequence[str], entities: Sequence[Sequence[str]], refs: Sequence[Sequence[str]]
) -> Dict[str, float]:
    """Entity copying (0-100), for data-to-text inputs with named entities (WebNLG).

    - ``entity_recall``: share of source entities mentioned at least once in the output, as
      :func:`entity_mention_counts` finds mentions (micro-averaged over all entities of all
      inputs): the output-side counterpart of prep's ``entity_match_rate``;
    - ``entity_recall_exact``: share of source entities whose whole :func:`tokenize` token
      sequence (the cleaned DBpedia form, e.g. ``1932 - 03 - 15``) occurs in the output, the
      metric of earlier tables (micro-averaged); a nested entity counts even inside a longer one;
    - ``entity_repeat_outputs``: share of outputs that mention some source entity twice or more
      (non-overlapping mentions, longest first; inputs without entities count as not repeating);
    - ``entity_precision``: per input, the output word types (:func:`tokenize`, punctuation
      dropped) that occur in some source entity of the input ("copied entity words"); the
      share of them that also occur in some reference of the input, summed over inputs
      (sum of hits / sum of copied words).
    """
    _check_aligned(hyps, entities, "entity lists")
    _check_aligned(hyps, refs, "reference lists")
    mentions = entity_mention_counts(hyps, entities)
    found = exact = total = repeating = hit = copied = 0
    for h, ents, rs, counts in zip(hyps, entities, refs, mentions):
        text = " " + " ".join(tokenize(h)) + " "
        for e, c in zip(ents, counts):
            total += 1
            found += c > 0
            exact += (" " + " ".join(tokenize(e)) + " ") in text
        repeating += any(c >= 2 for c in counts)
        ent_words = set().union(*(_words(e) for e in ents)) if ents else set()
        c = _words(h) & ent_words
        hit += len(c & set().union(*(_words(r) for r in rs)))
        copied += len(c)
    return {
        "entity_recall": 100.0 * found / total if total else 0.0,
        "entity_recall_exact": 100.0 * exact / total if total else 0.0,
        "entity_precision": 100.0 * hit / copied if copied else 0.0,
        "entity_repeat_outputs": 100.0 * repeating / len(hyps) if hyps else 0.0,
    }
