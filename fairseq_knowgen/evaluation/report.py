"""Reading system outputs and references, normalizing them, and computing the report.

Inputs accepted by :func:`read_hypotheses`:

- ``fairseq-generate`` output: ``D-<id>`` lines (detokenized) are used when present, else
  ``H-<id>`` lines; outputs are re-ordered by id (fairseq prints them in batch order);
- a plain hypothesis file, one output per line.

References: either several line-aligned files (reference k of every input in file k) or a
JSON-lines file with one list of references per input. Both hypotheses and references go
through the same :func:`normalize` (BPE joins, optional Moses detokenization).
"""

import re
from typing import Dict, List, Optional, Sequence

from ..textio import DataError, check_same_length, read_jsonl_lists, read_lines
from . import metrics

_GEN_LINE = re.compile(r"^([HD])-(\d+)\t([^\t]*)\t(.*)$")


def read_hypotheses(path: str) -> List[str]:
    """Hypotheses in input order from fairseq-generate output or a plain file."""
    lines = read_lines(path, "hypothesis")
    if not any(_GEN_LINE.match(x) for x in lines[:10000]):
        return lines
    found: Dict[str, Dict[int, str]] = {"H": {}, "D": {}}
    for n, line in enumerate(lines, start=1):
        m = _GEN_LINE.match(line)
        if not m:
            continue
        kind, idx, _score, text = m.groups()
        if int(idx) in found[kind]:
            # with --nbest > 1 only the best (first) hypothesis of each input is scored
            continue
        found[kind][int(idx)] = text
    hyps = found["D"] or found["H"]
    ids = sorted(hyps)
    if ids != list(range(len(ids))):
        missing = sorted(set(range(ids[-1] + 1)) - set(ids))[:5]
        raise DataError(path, 0, f"fairseq-generate output lacks hypotheses for ids {missing}")
    return [hyps[i] for i in ids]


def read_references(paths: Sequence[str]) -> List[List[str]]:
    """References per input from line-aligned files or one ``.jsonl`` file of lists.

    Inputs have different numbers of references: in line-aligned files an empty line is a missing
    reference (the files are padded with them), in a ``.jsonl`` list an empty string is none. An
    input left with no reference at all cannot be scored: a :class:`DataError` at its line (of the
    first file)."""
    if len(paths) == 1 and paths[0].endswith(".jsonl"):
        refs = [[r for r in rs if r.strip()] for rs in read_jsonl_lists(paths[0])]
        where = f"in the list of {paths[0]}"
    else:
        columns = [read_lines(p, "reference") for p in paths]
        check_same_length(paths, columns)
        refs = [[c[i] for c in columns if c[i].strip()] for i in range(len(columns[0]))]
        where = "in every reference file" if len(paths) == 1 else f"in every reference file ({', '.join(paths)})"
    for n, rs in enumerate(refs, start=1):
        if not rs:
            raise DataError(paths[0], n, f"no reference for this input: the line is empty {where}")
    return refs


def normalize(text: str, bpe: Optional[str] = "subword_nmt", detok: Optional[str] = None) -> str:
    """Undo subword segmentation and (optionally) Moses tokenization.

    ``bpe='subword_nmt'`` joins ``@@ `` continuations (a no-op on text without them);
    ``detok='moses'`` applies sacremoses' English detokenizer.
    """
    if bpe == "subword_nmt":
        text = re.sub(r"@@( |$)", "", text)
    text = " ".join(text.split())
    if detok == "moses":
        from sacremoses import MosesDetokenizer

        text = _detokenizer(MosesDetokenizer).detokenize(text.split())
    return text


_DETOK = {}


def _detokenizer(cls):
    if "en" not in _DETOK:
        _DETOK["en"] = cls(lang="en")
    return _DETOK["en"]


def evaluate_outputs(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    sources: Optional[Sequence[str]] = None,
    concepts: Optional[Sequence[Sequence[str]]] = None,
    entities: Optional[Sequence[Sequence[str]]] = None,
    repeat_n: int = 3,
    novel_n: int = 2,
    with_cider: bool = True,
) -> Dict[str, float]:
    """All metrics of the shared report as a flat dict (every score 0-100 but CIDEr-D)."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but references for {len(refs)} inputs")
    out = {"n": len(hyps), "bleu4": metrics.bleu4(hyps, refs), "rougeL": metrics.rouge_l(hyps, refs)}
    if with_cider:
        out["cider_d"] = metrics.cider_d(hyps, refs)
    if concepts is not None:
        out["coverage"] = metrics.concept_coverage(hyps, concepts)
    if entities is not None:
        out.update(metrics.entity_copy(hyps, entities, refs))
    if sources is not None:
        out.update(metrics.copy_precision_recall(hyps, sources, refs))
        out[f"novel{novel_n}"] = metrics.novel_ngram_ratio(hyps, sources, novel_n)
    out.update(metrics.repeated_ngram_rate(hyps, repeat_n))
    return out


def format_table(rows: Dict[str, Dict[str, float]]) -> str:
    """A Markdown table, one row per system, columns in first-seen order."""
    cols: List[str] = []
    for r in rows.values():
        cols += [k for k in r if k not in cols]
    lines = ["| system | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, r in rows.items():
        cells = [_fmt(r.get(c)) for c in cols]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)
