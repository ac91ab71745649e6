"""Copying words outside the vocabulary through position placeholders ``<unk-N>``.

The scheme of fairseq's ``examples/pointer_generator``, which ``copy_transformer`` uses for
word-level data:

- the vocabulary is fixed from the training data (``--min-count`` / ``--max-size``) and
  extended with ``<unk-0> .. <unk-{K-1}>``;
- in a source line, a word outside the vocabulary first seen at position N becomes
  ``<unk-N>`` at each of its occurrences (first positions >= K become ``<unk>``), so that the
  copy probability of a repeated word collects on one id;
- in a target line, a word outside the vocabulary becomes ``<unk-N>`` if it occurs in the
  source (its first position N < K), else ``<unk>``;
- after decoding, ``restore`` replaces each ``<unk-N>`` in a hypothesis by the original
  source word N.

A placeholder in the source and the same placeholder in the target share one vocabulary id,
so the copy head copies it like any other word, and ``force-unk`` knows which targets are
out of vocabulary (the placeholders). With BPE no placeholders are needed: every piece is
in the vocabulary and the head copies pieces.

    python -m fairseq_knowgen.prep.placeholders encode --train-prefix RAW/train \\
        --splits RAW/train RAW/valid --out-dir OUT [--min-count 2 --max-positions 100]
    python -m fairseq_knowgen.prep.placeholders restore --gen gen.out --src RAW/valid.src --out gen.restored
"""

import argparse
import os
import re
from collections import Counter
from typing import Dict, List

from ..textio import DataError, atomic_write, cli_entry, read_lines, read_parallel

_PLACEHOLDER = re.compile(r"^<unk-(\d+)>$")


def placeholder(i: int) -> str:
    return f"<unk-{i}>"


def build_vocab(
    src: List[str], tgt: List[str], min_count: int = 2, min_source_df: int = 5, max_size: int = 0
) -> Counter:
    """The fixed vocabulary: words that must often be *generated*, plus frequent input words.

    A word is kept if it occurs at least ``min_count`` times in a target line whose source
    does not contain it (so it cannot be copied there), or in at least ``min_source_df``
    distinct source lines. Names seen with one or two inputs only are thus left out and
    become placeholders in training too, which is where a copy model learns to copy them.
    """
    generated, source_df = Counter(), Counter()
    for s in set(src):
        source_df.update(set(s.split()))
    for s, t in zip(src, tgt):
        in_src = set(s.split())
        generated.update(w for w in t.split() if w not in in_src)
    score = Counter({w: c for w, c in generated.items() if c >= min_count})
    for w, df in source_df.items():
        if df >= min_source_df:
            score[w] = max(score[w], df)
    kept = score.most_common(max_size if max_size > 0 else None)
    return Counter(dict(kept))


def encode_pair(src: List[str], tgt: List[str], vocab, max_positions: int):
    """Source and target tokens with out-of-vocabulary words replaced by placeholders."""
    first_pos: Dict[str, int] = {}
    out_src = []
    for i, w in enumerate(src):
        if w in vocab:
            out_src.append(w)
        elif w in first_pos:  # a repeated word keeps the placeholder of its first occurrence
            out_src.append(placeholder(first_pos[w]))
        elif i < max_positions:
            out_src.append(placeholder(i))
            first_pos[w] = i
        else:
            out_src.append("<unk>")
    out_tgt = [w if w in vocab else placeholder(first_pos[w]) if w in first_pos else "<unk>" for w in tgt]
    return out_src, out_tgt


def restore(hyp: str, src_words: List[str]) -> str:
    """Replace ``<unk-N>`` by source word N (left as is if the source is shorter)."""
    out = []
    for w in hyp.split():
        m = _PLACEHOLDER.match(w)
        out.append(src_words[int(m.group(1))] if m and int(m.group(1)) < len(src_words) else w)
    return " ".join(out)


def write_dict(path: str, vocab: Counter, max_positions: int):
    with atomic_write(path) as f:
        for w, c in vocab.most_common():
            f.write(f"{w} {c}\n")
        for i in range(max_positions):
            f.write(f"{placeholder(i)} 0\n")


def cmd_encode(a):
    train_src, train_tgt = read_parallel(a.train_prefix + ".src", a.train_prefix + ".tgt", what="training")
    vocab = build_vocab(train_src, train_tgt, a.min_count, a.min_source_df, a.max_size)
    os.makedirs(a.out_dir, exist_ok=True)
    write_dict(os.path.join(a.out_dir, "dict.txt"), vocab, a.max_positions)
    for prefix in a.splits:
        src, tgt = read_parallel(prefix + ".src", prefix + ".tgt")
        name = os.path.basename(prefix)
        enc = [encode_pair(s.split(), t.split(), vocab, a.max_positions) for s, t in zip(src, tgt)]
        for side, k in (("src", 0), ("tgt", 1)):
            with atomic_write(os.path.join(a.out_dir, f"{name}.{side}")) as f:
                f.writelines(" ".join(e[k]) + "\n" for e in enc)
        n_ph = sum(w.startswith("<unk-") for e in enc for w in e[1])
        print(f"{name}: {len(enc)} lines, {n_ph} target placeholders")


def cmd_restore(a):
    src = read_lines(a.src, "source")
    with atomic_write(a.out) as out:
        for n, line in enumerate(read_lines(a.gen, "fairseq-generate output"), start=1):
            parts = line.split("\t")
            if parts[0][:2] in ("H-", "D-") and len(parts) == 3:
                i = int(parts[0][2:])
                if i >= len(src):
                    raise DataError(a.gen, n, f"hypothesis id {i} but {a.src} has {len(src)} lines")
                parts[2] = restore(parts[2], src[i].split())
            out.write("\t".join(parts) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("encode", help="fix the vocabulary from training data and write placeholder text + dict.txt")
    e.add_argument("--train-prefix", required=True, help="PREFIX.src / PREFIX.tgt of the training data")
    e.add_argument("--splits", nargs="+", required=True, help="prefixes to encode (PREFIX.src, PREFIX.tgt)")
    e.add_argument("--out-dir", required=True)
    e.add_argument(
        "--min-count",
        type=int,
        default=2,
        help="keep words generated (target, not in its source) at least this often in train",
    )
    e.add_argument("--min-source-df", type=int, default=5, help="keep words of at least this many distinct sources")
    e.add_argument("--max-size", type=int, default=0, help="keep at most this many words (0: no limit)")
    e.add_argument("--max-positions", type=int, default=100, help="number of placeholders <unk-0..K-1>")
    r = sub.add_parser("restore", help="replace <unk-N> in fairseq-generate output by source words")
    r.add_argument("--gen", required=True)
    r.add_argument("--src", required=True, help="the original (not encoded) source lines of that split")
    r.add_argument("--out", required=True)
    a = p.parse_args(argv)
    (cmd_encode if a.cmd == "encode" else cmd_restore)(a)


if __name__ == "__main__":
    cli_entry(main)
