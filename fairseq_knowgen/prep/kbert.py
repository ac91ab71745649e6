"""Prepare a K-BERT task folder from the raw TSVs and a knowledge graph.

    python -m fairseq_knowgen.prep.kbert --data DATA/book_review --kg DATA/kgs/HowNet.spo \\
        --out OUT [--tagging] [--control-seed 1] [--srcdict PRETRAINED/dict.txt]

reads ``DATA/train.tsv``, ``DATA/dev.tsv`` and (when present) ``DATA/test.tsv`` (header row naming
``label`` and ``text_a``, and ``text_b`` for sentence pairs; ``--tagging``: space-separated
characters and BIO tags) and writes into ``OUT``:

* ``data/{train,valid[,test]}.tsv``: the checked rows (dev becomes ``valid``), read by the
  ``kbert_*`` tasks; ``data/dict.txt``: the pretrained model's dictionary given with
  ``--srcdict`` (e.g. ``convert.hf_bert``'s, BERT's vocabulary in its id order), else the
  characters of the training text and of the KG's predicates and objects; ``data/labels.txt``;
  ``data/eval_splits`` (valid [test]);
* with ``--kg``: ``kg/full.spo``, the KG; ``kg/control.spo``: the control KG (objects shuffled
  among all triples with ``--control-seed``: same subjects, predicates and token budget, no
  knowledge);
* ``mlm/{train,valid}.txt``: the sentences as space-separated characters, for the masked-LM
  pretraining stage (``fairseq-preprocess --only-source --srcdict data/dict.txt``).

``python -m fairseq_knowgen.prep.kbert webnlg-kg --src raw/train.src --out raw/kg.spo`` writes the
KG of ``kbert_transformer`` on WebNLG instead (the training triples, each subject -> its facts).

Every input is read and checked before anything is written; bad input (missing file, KG line
without three fields, a KG without any triple, TSV row with a wrong column count, tokens and tags
of different lengths, a dev or test label or tag that ``train.tsv`` never has) stops with
``error: file:line: ...`` and exit status 2.
"""

import argparse
import contextlib
import os
import random
import shutil

from fairseq.data import Dictionary

from ..data.kbert_dataset import read_tsv
from ..modules.knowledge_graph import char_tokenize, control_triples, read_triples, write_triples
from ..textio import DataError, atomic_write, cli_entry, output_folder
from .common import ensure_dir, write_lines


def build_dictionary(examples, triples) -> Dictionary:
    """Characters of the training sentences and of the KG's predicates and objects (subjects only
    match characters that are already in sentences), most frequent first."""
    d = Dictionary()
    for ex in examples:
        for tok in ex.tokens + (ex.tokens_b or []):
            d.add_symbol(tok)
    for _, p, o in triples:
        for tok in char_tokenize(p) + char_tokenize(o):
            d.add_symbol(tok)
    d.finalize(padding_factor=1)
    return d


def check_labels_seen(examples, labels, path: str, tagging: bool):
    """Every label (tag) of ``examples`` is one of the training ``labels``: a model has no output
    for another, so a dev or test row with one is refused here, naming ``path:line``, before any
    training starts."""
    known = set(labels)
    for ex in examples:
        unseen = [t for t in (ex.label if tagging else [ex.label]) if t not in known]
        if unseen:
            what = "tag" if tagging else "label"
            shown = ", ".join(labels[:12]) + (f", ... ({len(labels)} in all)" if len(labels) > 12 else "")
            raise DataError(path, ex.line, f"{what} {unseen[0]!r} is not among the training {what}s ({shown})")


# the files prepare() writes in each folder of OUT (other files there, e.g. a user's notes, are kept)
OWNED = {
    "data": ["train.tsv", "valid.tsv", "test.tsv", "dict.txt", "labels.txt", "eval_splits"],
    "kg": ["full.spo", "control.spo"],
    "mlm": ["train.txt", "valid.txt"],
}


def prepare(data: str, kg: str, out: str, tagging: bool, control_seed: int = 1, srcdict: str = None):
    splits = {"train": "train.tsv", "valid": "dev.tsv"}
    if os.path.isfile(os.path.join(data, "test.tsv")):
        splits["test"] = "test.tsv"
    examples = {s: read_tsv(os.path.join(data, f), tagging) for s, f in splits.items()}  # checks first
    triples = read_triples(kg) if kg else []
    if kg and not triples:  # blank lines (and a byte-order mark) only: as empty as a 0-byte file
        raise DataError(kg, 0, "no triples, only blank lines: expected subject<TAB>predicate<TAB>object lines")
    if srcdict:
        if not os.path.isfile(srcdict):
            raise DataError(srcdict, 0, "dictionary not found")
        try:
            d = Dictionary.load(srcdict)  # fairseq's own check of the format
        except (ValueError, RuntimeError) as e:
            raise DataError(srcdict, 0, f"not a fairseq dict.txt ({e})") from None
    else:
        d = build_dictionary(examples["train"], triples)
    labels = sorted(
        {t for ex in examples["train"] for t in ex.label} if tagging else {ex.label for ex in examples["train"]}
    )
    for split, name in splits.items():
        check_labels_seen(examples[split], labels, os.path.join(data, name), tagging)

    # OUT/data, OUT/kg and OUT/mlm are written into temporary folders beside them and swapped in together at the
    # end (nothing of a failed or killed run replaces them); the later stages' folders in OUT are not touched
    with contextlib.ExitStack() as stack:
        data_out, kg_out, mlm_out = (
            stack.enter_context(output_folder(os.path.join(out, x), owned=OWNED[x])) for x in ("data", "kg", "mlm")
        )
        for split, name in splits.items():
            with atomic_write(os.path.join(data_out, f"{split}.tsv")) as f, open(
                os.path.join(data, name), encoding="utf-8"
            ) as src:
                shutil.copyfileobj(src, f)
        with atomic_write(os.path.join(data_out, "dict.txt")) as f:
            if srcdict:  # as given: its order is the pretrained model's rows
                with open(srcdict, encoding="utf-8") as src:
                    shutil.copyfileobj(src, f)
            else:
                d.save(f)
        write_lines(os.path.join(data_out, "labels.txt"), labels)
        write_lines(os.path.join(data_out, "eval_splits"), [s for s in splits if s != "train"])
        if kg:
            write_triples(os.path.join(kg_out, "full.spo"), triples)
            write_triples(os.path.join(kg_out, "control.spo"), control_triples(triples, control_seed))
        for split in ("train", "valid"):
            sentences = (ex_tokens for ex in examples[split] for ex_tokens in (ex.tokens, ex.tokens_b) if ex_tokens)
            write_lines(os.path.join(mlm_out, f"{split}.txt"), (" ".join(x) for x in sentences))
    print(
        f"{out}: {', '.join(f'{s} {len(x)}' for s, x in examples.items())} examples; {len(d)} dictionary types"
        f"{' (--srcdict)' if srcdict else ''}; {len(labels)} labels; "
        + (f"KG {len(triples)} triples (control: objects shuffled, seed {control_seed})" if kg else "no KG")
    )


def make_synthetic_task(workdir: str, n_train: int, n_valid: int, tagging: bool = False, seed: int = 1) -> str:
    """A tiny synthetic K-BERT task folder (``train.tsv``, ``valid.tsv``, ``dict.txt``,
    ``labels.txt``) and its KG ``workdir/kg.spo``, for tests and the benchmark.

    Sentences of 20-80 characters from a 200-character alphabet in which 40 two- or
    three-character subjects occur often; each subject has two triples (``类别`` and one of two
    categories, then a random predicate and object), so about a third of the input tokens are
    injected. Classification: the label is the category of the sentence's first subject (0 when
    it has none). Tagging: each subject is tagged ``B-``/``I-`` with its category. Returns ``workdir``."""
    rng = random.Random(seed)
    alphabet = [chr(0x4E00 + i) for i in range(200)]
    subjects = ["".join(rng.choice(alphabet) for _ in range(rng.choice((2, 3)))) for _ in range(40)]
    kinds = {s: rng.choice(("甲", "乙")) for s in subjects}
    triples = []
    for s in subjects:
        triples += [(s, "类别", kinds[s]), (s, "".join(rng.sample(alphabet, 2)), "".join(rng.sample(alphabet, 3)))]
    ensure_dir(workdir)
    write_triples(os.path.join(workdir, "kg.spo"), triples)

    def example():
        parts, n = [], rng.randint(20, 80)
        while sum(len(p) for p, _ in parts) < n:
            s = rng.choice(subjects) if rng.random() < 0.15 else rng.choice(alphabet)
            parts.append((s, kinds.get(s)))
        chars = [c for p, _ in parts for c in p]
        if not tagging:
            first = next((k for _, k in parts if k), None)
            return f"{int(first == '甲')}\t{''.join(chars)}"
        tags = []
        for p, k in parts:
            tags += [f"B-{k}"] + [f"I-{k}"] * (len(p) - 1) if k else ["O"] * len(p)
        return f"{' '.join(chars)}\t{' '.join(tags)}"

    header = "text_a\tlabel" if tagging else "label\ttext_a"
    for split, n in (("train", n_train), ("valid", n_valid)):
        write_lines(os.path.join(workdir, f"{split}.tsv"), [header] + [example() for _ in range(n)])
    train = read_tsv(os.path.join(workdir, "train.tsv"), tagging)
    with atomic_write(os.path.join(workdir, "dict.txt")) as f:
        build_dictionary(train, triples).save(f)
    labels = ["B-甲", "B-乙", "I-甲", "I-乙", "O"] if tagging else ["0", "1"]
    write_lines(os.path.join(workdir, "labels.txt"), sorted(labels))
    return workdir


def make_benchmark_data(workdir: str, n_train: int, n_valid: int):
    """The ``kbert_classification`` data of ``scripts/benchmark.py --arch kbert_small``
    (:func:`make_synthetic_task`): ``(data_dir, extra arguments of each side)``, both sides reading
    the same KG, so that the baseline (``--no-visible-matrix``) sees the same injected input."""
    data = make_synthetic_task(workdir, n_train, n_valid, tagging=False)
    kg = ["--kg", os.path.join(data, "kg.spo")]
    return data, {"arch": kg, "baseline": kg}


def webnlg_triples(src_lines) -> list:
    """The triples of linearized WebNLG sources (``<S> subject <P> predicate <O> object ...``, as
    ``prep.webnlg`` writes ``raw/SPLIT.src``), each once, in order of first appearance: the KG of
    ``kbert_transformer`` (every entity that is a subject -> its facts)."""
    import re

    seen, out = set(), []
    for line in src_lines:
        for m in re.finditer(r"<S> (.+?) <P> (.+?) <O> (.+?)(?= <S> |$)", line.strip()):
            t = tuple(x.strip() for x in m.groups())
            if t not in seen:
                seen.add(t)
                out.append(t)
    return out


def webnlg_kg_main(argv):
    from ..textio import read_lines

    p = argparse.ArgumentParser(description="K-BERT KG from linearized WebNLG training sources")
    p.add_argument("--src", required=True, help="raw/train.src of the WebNLG recipe")
    p.add_argument("--out", required=True, help="the KG file to write")
    a = p.parse_args(argv)
    triples = webnlg_triples(read_lines(a.src, "source"))
    write_triples(a.out, triples)
    print(f"{a.out}: {len(triples)} triples, {len({t[0] for t in triples})} subjects")


def main(argv=None):
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["webnlg-kg"]:
        return webnlg_kg_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="folder with train.tsv, dev.tsv [test.tsv]")
    p.add_argument("--kg", help="subject<TAB>predicate<TAB>object file (none: no KG folder)")
    p.add_argument("--out", required=True)
    p.add_argument("--tagging", action="store_true", help="text_a and label are space-separated characters and tags")
    p.add_argument("--control-seed", type=int, default=1, help="seed of the control KG's object shuffle")
    p.add_argument("--srcdict", help="the pretrained model's dict.txt, used as data/dict.txt (default: build one)")
    a = p.parse_args(argv)
    prepare(a.data, a.kg, a.out, a.tagging, a.control_seed, a.srcdict)


if __name__ == "__main__":
    cli_entry(main)
