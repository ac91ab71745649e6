"""CommonGen (v1.0) raw files -> tokenized text for fairseq, with grouped dev references.

Input: ``commongen.{train,dev}.src_alpha.txt`` (space-separated concepts) and
``commongen.{train,dev}.tgt.txt`` (one reference a line), line-aligned. Several references
of one concept set stand on consecutive lines with the same source; each group becomes one
evaluation input.

Output (``--out``), in one of two text forms (``--text``):

- ``moses`` (default; the from-scratch models, whose BPE is learned on this text): lower-cased and
  Moses-tokenized (``a grilled pizza with chicken , broccoli and cheese .``);
- ``raw``: the text as released, cased and untokenized (whitespace runs made one space), for
  BART, which was pretrained on raw cased text through GPT-2's byte-level BPE (fairseq's own BART
  fine-tuning examples feed raw text); the concepts keep their case too.

Files:

- ``train.{src,tgt}``: every training pair;
- ``valid.{src,tgt}``: one line per dev concept set (target: its first reference, for the
  validation loss), ``valid.refs.jsonl``: all its references (lower-cased, untokenized, in both
  text forms: the metrics lower-case and tokenize themselves, so scores stay comparable),
  ``valid.concepts``: the concepts, ``|``-separated, for the coverage metric;
- ``test.*`` the same for ``commongen.test.*`` when the data folder has them (references
  optional: the official test set ships without them);
- ``eval_splits``: the evaluation splits written; ``text``: the text form.

Every split is read and checked before ``OUT`` is replaced; files of other lengths, an empty
concept or reference line, or bytes that are not UTF-8 stop with ``error: FILE:LINE: ...`` and
exit status 2.

    python -m fairseq_knowgen.prep.commongen --data ../shared/data/commongen --out OUT [--text raw]

GPT-2 BPE for BART (``examples/commongen/run.sh`` with ``PRETRAINED=DIR``): the text as it is
(raw text above), ``<sep>`` and the package's other symbols (``<ent-K>``, ``<unk-N>``) kept whole
between the encoded runs::

    python -m fairseq_knowgen.prep.commongen gpt2-bpe --encoder-json DIR/encoder.json \
        --vocab-bpe DIR/vocab.bpe --in-dir OUT/raw --out-dir OUT/bpe train.src train.eki.src ...
"""

import argparse
import os
from typing import List, Optional, Tuple

from ..text import moses_tokenize
from ..textio import check_same_length, cli_entry, output_folder, read_lines
from .common import ensure_dir, write_jsonl, write_lines


def group_consecutive(src: List[str], tgt: List[str]) -> List[Tuple[str, List[str]]]:
    """[(source, [references...])] for runs of consecutive identical source lines."""
    groups: List[Tuple[str, List[str]]] = []
    for s, t in zip(src, tgt):
        if groups and groups[-1][0] == s:
            groups[-1][1].append(t)
        else:
            groups.append((s, [t]))
    return groups


TEXT_FORMS = ("moses", "raw")


def prepare(data: str, out: str, dev_name: str = "dev", text: str = "moses") -> List[str]:
    """Write the splits in the text form ``text`` (``moses`` or ``raw``, see the module docstring);
    returns the evaluation splits written (also in ``OUT/eval_splits``): ``valid``, and ``test``
    when ``commongen.test.src_alpha.txt`` exists (its references ``commongen.test.tgt.txt`` are
    optional: without them the recipe generates but cannot score)."""
    if text not in TEXT_FORMS:
        raise ValueError(f"text must be one of {TEXT_FORMS}, got {text!r}")
    # every output into a temporary folder that replaces OUT's own files only once all are written; the files of
    # later stages in OUT (prototypes, EKI sources) are kept
    with output_folder(out, owned=OWNED) as tmp:
        src, tgt = read_split(*split_paths(data, "train"), what="CommonGen train")
        write_lines(f"{tmp}/train.src", (normalize_concepts(s, text) for s in src))
        write_lines(f"{tmp}/train.tgt", (normalize_sentence(t, text) for t in tgt))
        splits = ["valid"]
        write_eval_split(tmp, "valid", *split_paths(data, dev_name), text=text)
        test_src, test_tgt = split_paths(data, "test")
        if os.path.isfile(test_src):
            write_eval_split(tmp, "test", test_src, test_tgt if os.path.isfile(test_tgt) else None, text=text)
            splits.append("test")
        write_lines(f"{tmp}/eval_splits", splits)
        write_lines(f"{tmp}/text", [text])
    return splits


# the files prepare() writes (an earlier run's test files go when the data has no test split any more)
OWNED = ["eval_splits", "text"] + [
    f"{split}.{ext}" for split in ("train", "valid", "test") for ext in ("src", "tgt", "refs.jsonl", "concepts")
]


def split_paths(data: str, name: str) -> Tuple[str, str]:
    return os.path.join(data, f"commongen.{name}.src_alpha.txt"), os.path.join(data, f"commongen.{name}.tgt.txt")


def read_split(src_path: str, tgt_path: str, what: str) -> Tuple[List[str], List[str]]:
    """The line-aligned concepts and references of a split; an empty line in either (an empty
    source in training, an extra empty concept set in dev) raises :class:`DataError` naming it."""
    src = read_lines(src_path, what, allow_empty_lines=False)
    tgt = read_lines(tgt_path, what, allow_empty_lines=False)
    check_same_length([src_path, tgt_path], [src, tgt])
    return src, tgt


def normalize_concepts(line: str, text: str = "moses") -> str:
    """The concepts one space apart; lower-cased for ``moses``, as given for ``raw``."""
    return " ".join((line.lower() if text == "moses" else line).split())


def normalize_sentence(line: str, text: str = "moses") -> str:
    """A sentence lower-cased and Moses-tokenized (``moses``) or as released (``raw``: cased,
    untokenized, whitespace runs made one space)."""
    return moses_tokenize(line) if text == "moses" else " ".join(line.split())


def write_eval_split(out: str, split: str, src_path: str, tgt_path: Optional[str], text: str = "moses"):
    """One line per concept set (consecutive lines with the same source are one set)."""
    if tgt_path is None:
        src = read_lines(src_path, f"CommonGen {split} concepts", allow_empty_lines=False)
        tgt = [""] * len(src)
    else:
        src, tgt = read_split(src_path, tgt_path, what=f"CommonGen {split}")
    groups = group_consecutive([normalize_concepts(s, text) for s in src], tgt)
    write_lines(f"{out}/{split}.src", (g[0] for g in groups))
    write_lines(f"{out}/{split}.tgt", (normalize_sentence(g[1][0], text) for g in groups))
    if tgt_path is not None:
        write_jsonl(f"{out}/{split}.refs.jsonl", ([" ".join(r.lower().split()) for r in g[1]] for g in groups))
    write_lines(f"{out}/{split}.concepts", ("|".join(g[0].split()) for g in groups))
    refs = "" if tgt_path is None else f", {len(src)} references"
    print(f"{split}: {len(groups)} concept sets{refs}")


def gpt2_bpe(encoder_json: str, vocab_bpe: str, in_dir: str, out_dir: str, names: List[str]) -> None:
    """``in_dir/NAME`` -> ``out_dir/NAME`` through fairseq's GPT-2 BPE (``--bpe gpt2``: GPT-2 ids,
    BART's dictionaries), the text as it is (no tokenization, no lower-casing), each run between
    ``<sep>`` (or ``<ent-K>``, ``<unk-N>``) encoded apart, the symbol kept whole between them
    (:func:`~fairseq_knowgen.data.eki_dataset.encode_source`): GPT-2's decoder gives the text back."""
    from fairseq.data.encoders.gpt2_bpe import GPT2BPE, GPT2BPEConfig

    from ..data.eki_dataset import encode_source  # here: the other stages need neither torch nor fairseq

    bpe = GPT2BPE(GPT2BPEConfig(gpt2_encoder_json=encoder_json, gpt2_vocab_bpe=vocab_bpe))
    ensure_dir(out_dir)
    for name in names:
        lines = read_lines(os.path.join(in_dir, name), "text to encode")
        write_lines(os.path.join(out_dir, name), (encode_source(line, bpe.encode) for line in lines))


def main(argv=None):
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["gpt2-bpe"]:
        p = argparse.ArgumentParser(
            prog="python -m fairseq_knowgen.prep.commongen gpt2-bpe", description=gpt2_bpe.__doc__
        )
        p.add_argument("--encoder-json", required=True, help="GPT-2's encoder.json")
        p.add_argument("--vocab-bpe", required=True, help="GPT-2's vocab.bpe")
        p.add_argument("--in-dir", required=True)
        p.add_argument("--out-dir", required=True)
        p.add_argument("names", nargs="+", help="file names in IN_DIR (train.src, valid.eki.src...)")
        a = p.parse_args(argv[1:])
        return gpt2_bpe(a.encoder_json, a.vocab_bpe, a.in_dir, a.out_dir, a.names)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="folder with the raw CommonGen files")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--text",
        choices=TEXT_FORMS,
        default="moses",
        help="moses: lower-cased, Moses-tokenized (the from-scratch recipe); raw: cased, untokenized (BART)",
    )
    a = p.parse_args(argv)
    prepare(a.data, a.out, text=a.text)


if __name__ == "__main__":
    cli_entry(main)
