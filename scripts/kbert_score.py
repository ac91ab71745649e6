#!/usr/bin/env python
"""Predict with a K-BERT checkpoint and score on the original sentences.

    python scripts/kbert_score.py --data OUT/data --split valid \\
        --path RUN/checkpoints/checkpoint_best.pt --pred RUN/valid.pred --json-out RUN/valid.scores.json
    python scripts/kbert_score.py --data OUT/data --split valid --pred FLOOR.pred ...

With ``--path`` the predictions are made first (one label per line; for tagging one tag per
original character, space-separated: tags of injected tokens are never read, sentence characters
a too long tree lost are tagged ``O``) and written to ``--pred``; without it ``--pred`` is read and
scored. Every row of the split is predicted (batches of any size; no row is dropped). A predicted
label or tag that ``DATA/labels.txt`` (else ``DATA/train.tsv``) lacks is no prediction of the task's
model: it stops the scoring with ``error: PRED:LINE: ...`` and exit status 2, as a prediction file of
another length or a tag line of another length than its sentence does.

Tagging predictions are the argmax of each character's tag distribution (the paper's and the
authors' tagger), or with ``--viterbi`` the best valid IOB2 sequence
(:mod:`fairseq_knowgen.evaluation.kbert_iob2`: no ``I-X`` without a ``B-X`` / ``I-X`` before it);
``[ENT]`` (the authors' tag of injected tokens, ``--kg-injected-label ent``) is never predicted for a
character. Scores: accuracy (classification); strict typed entity F1 with ``seqeval``
(``mode="strict"``, IOB2) on the original characters, and beside it span-only F1 (types removed;
how the authors' code scores NER). The printed line and ``--json-out`` give both, in percent:
``{"NAME/SPLIT": {"accuracy": ...}}`` or ``{"NAME/SPLIT": {"typed_f1": ..., "typed_precision": ...,
"typed_recall": ..., "span_f1": ..., "sentences": N}}`` (``scripts/results_table.py`` reads it).
"""

import argparse
import json
import os
import sys
from typing import List, Optional, Sequence, Tuple

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fairseq_knowgen.data.kbert_dataset import ENT, read_tsv  # noqa: E402
from fairseq_knowgen.evaluation.kbert_iob2 import iob2_transitions, untyped, viterbi  # noqa: E402
from fairseq_knowgen.textio import DataError, atomic_write, cli_entry, read_lines  # noqa: E402


def accuracy(gold: Sequence[str], pred: Sequence[str]) -> float:
    return sum(g == p for g, p in zip(gold, pred)) / max(len(gold), 1)


def tagging_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict:
    """seqeval's strict IOB2 precision/recall/F1 with types, and F1 without types."""
    from seqeval.metrics import f1_score, precision_score, recall_score
    from seqeval.scheme import IOB2

    kw = {"mode": "strict", "scheme": IOB2, "zero_division": 0}
    gold, pred = [list(x) for x in gold], [list(x) for x in pred]
    return {
        "typed_f1": f1_score(gold, pred, **kw),
        "typed_precision": precision_score(gold, pred, **kw),
        "typed_recall": recall_score(gold, pred, **kw),
        "span_f1": f1_score([untyped(x) for x in gold], [untyped(x) for x in pred], **kw),
        "sentences": len(gold),
    }


def task_labels(data: str, tagging: bool) -> Tuple[Optional[List[str]], str]:
    """``(labels, their file)``: what a model of the task folder ``data`` can predict, from
    ``DATA/labels.txt`` as the ``kbert_*`` tasks read it, else the labels of ``DATA/train.tsv``;
    ``(None, "")`` when the folder has neither."""
    path = os.path.join(data, "labels.txt")
    if os.path.isfile(path):
        return [x.strip() for x in read_lines(path, "labels") if x.strip()], path
    train = os.path.join(data, "train.tsv")
    if os.path.isfile(train):
        examples = read_tsv(train, tagging)
        return sorted({t for ex in examples for t in ex.label} if tagging else {ex.label for ex in examples}), train
    return None, ""


def check_known(pred_path: str, n: int, predicted: Sequence[str], labels: Sequence[str], labels_path: str, what):
    """A predicted label (tag) that the task's labels lack is no prediction of its model: an error naming
    ``pred_path:n`` (a wrong answer would be counted otherwise)."""
    unknown = [x for x in predicted if x not in labels]
    if unknown:
        shown = ", ".join(labels[:12]) + (f", ... ({len(labels)} in all)" if len(labels) > 12 else "")
        raise DataError(
            pred_path,
            n,
            f"{what} {unknown[0]!r} is not among the {what}s of {labels_path} ({shown}): predictions of another "
            "task or a damaged file; predict again with --path",
        )


def score(gold_tsv: str, pred_path: str, tagging: bool, labels=None, labels_path: str = "") -> dict:
    """The scores of ``pred_path`` against ``gold_tsv``; with ``labels`` (of ``labels_path``), a
    predicted label or tag outside them is an error."""
    examples = read_tsv(gold_tsv, tagging)
    preds = read_lines(pred_path, "predictions")
    if len(preds) != len(examples):
        raise DataError(
            pred_path,
            min(len(preds), len(examples)) + 1,
            f"{len(preds)} predictions, {len(examples)} examples in {gold_tsv}",
        )
    if not tagging:
        if labels is not None:
            for n, p in enumerate(preds, start=1):
                check_known(pred_path, n, [p.strip()], labels, labels_path, "label")
        return {
            "accuracy": accuracy([ex.label for ex in examples], [p.strip() for p in preds]),
            "sentences": len(preds),
        }
    pred_tags = []
    for n, (ex, p) in enumerate(zip(examples, preds), start=1):
        tags = p.split()
        if len(tags) != len(ex.tokens):
            raise DataError(pred_path, n, f"{len(tags)} tags for {len(ex.tokens)} characters ({gold_tsv}:{ex.line})")
        if labels is not None:
            check_known(pred_path, n, tags, labels, labels_path, "tag")
        pred_tags.append(tags)
    return tagging_scores([ex.label for ex in examples], pred_tags)


def load(checkpoint: str, data: str):
    """The model (eval mode) and task of a K-BERT checkpoint, with the task reading ``data``."""
    from fairseq import checkpoint_utils

    import fairseq_knowgen  # noqa: F401

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data})
    return models[0].eval(), task


@torch.no_grad()
def predict(model, task, split: str, batch_size: int = 64, use_viterbi: bool = False) -> List[str]:
    """Predictions of ``model`` for ``DATA/{split}.tsv`` in file order (as the lines of ``--pred``).

    Tagging: the logits of tree position ``ds.trunk_index[i]`` are the tags of the sentence's
    characters (injected tokens, ``<s>`` and ``</s>`` are never read); characters a too long tree
    lost are tagged ``O``, so that each line has one tag per original character. ``[ENT]`` is never
    a character's tag; ``use_viterbi``: the best valid IOB2 sequence instead of each argmax."""
    ds = task.load_dataset(split)
    itr = task.get_batch_iterator(ds, max_sentences=batch_size, ignore_invalid_inputs=False).next_epoch_itr(
        shuffle=False
    )
    head = {"tagging_head_name" if task.tagging else "classification_head_name": task.head_name}
    start, allowed = iob2_transitions(task.labels)
    out = [None] * len(ds)
    for sample in itr:
        logits, _ = model(**sample["net_input"], features_only=True, **head)  # B x T x tags or B x classes
        if not task.tagging:
            for row, i in enumerate(sample["id"].tolist()):
                out[i] = task.labels[logits[row].argmax(-1)]
            continue
        scores = logits.float().log_softmax(-1)
        if ENT in task.labels:
            scores[..., task.labels.index(ENT)] = float("-inf")
        for row, i in enumerate(sample["id"].tolist()):
            chars = scores[row, torch.from_numpy(ds.trunk_index[i])]  # n x tags
            best = viterbi(chars, start, allowed) if use_viterbi else chars.argmax(-1)
            tags = [task.labels[t] for t in best.tolist()]
            out[i] = " ".join(tags + ["O"] * (ds.n_tokens[i] - len(tags)))
    assert all(x is not None for x in out), "a row was not predicted"
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="the task folder (dict.txt, labels.txt, SPLIT.tsv)")
    p.add_argument("--split", default="valid")
    p.add_argument("--path", help="checkpoint to predict with (else --pred is scored as it is)")
    p.add_argument("--pred", required=True, help="predictions file (written with --path)")
    p.add_argument("--tagging", action="store_true", help="score tags (implied by a kbert_tagging checkpoint)")
    p.add_argument(
        "--viterbi", action="store_true", help="tagging with --path: predict the best valid IOB2 sequence (default: "
        "each character's argmax, as the paper and the authors)"
    )
    p.add_argument("--json-out", help="write the scores here")
    p.add_argument("--name", default="", help="run name stored in the JSON")
    a = p.parse_args(argv)
    tagging = a.tagging
    if a.path:
        if not os.path.isfile(a.path):
            raise DataError(a.path, 0, "checkpoint not found")
        model, task = load(a.path, a.data)
        preds, tagging = predict(model, task, a.split, use_viterbi=a.viterbi), task.tagging
        with atomic_write(a.pred) as f:
            f.writelines(x + "\n" for x in preds)
    labels, labels_path = task_labels(a.data, tagging)
    raw = score(os.path.join(a.data, f"{a.split}.tsv"), a.pred, tagging, labels, labels_path)
    scores = {k: (v if k == "sentences" else 100 * v) for k, v in raw.items()}  # percent, as scripts/evaluate.py
    if tagging:
        decoding = " (Viterbi IOB2)" if a.viterbi else " (argmax)" if a.path else ""
        print(
            f"{a.name} {a.split}{decoding}: typed F1 {scores['typed_f1']:.2f} (P {scores['typed_precision']:.2f} "
            f"R {scores['typed_recall']:.2f}); span-only F1 {scores['span_f1']:.2f}"
        )
    else:
        print(f"{a.name} {a.split}: accuracy {scores['accuracy']:.2f}")
    if a.json_out:  # {"NAME/SPLIT": {metric: value}}, the layout scripts/results_table.py reads
        with atomic_write(a.json_out) as f:
            json.dump({f"{a.name}/{a.split}": scores}, f, indent=1)
    return scores


if __name__ == "__main__":
    cli_entry(main)
