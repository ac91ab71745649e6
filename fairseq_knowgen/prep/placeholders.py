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

Raw text with ``fairseq-interactive`` is the same three steps as a pipe, as in fairseq's
``examples/pointer_generator``: ``encode-source`` replaces the out-of-vocabulary words of each
raw source line by placeholders, with the vocabulary and the number of placeholders K read
from the model's dictionary (``DATA/dict.src.txt`` of the binarized data, or ``dict.txt`` of
``encode``); ``restore`` then reads fairseq-interactive's output, whose ids are the input line
numbers as in fairseq-generate's, and puts back source word N of line ``id`` for ``<unk-N>``::

    python -m fairseq_knowgen.prep.placeholders encode-source --dict DATA/dict.src.txt < raw.src \\
      | fairseq-interactive DATA --user-dir fairseq_knowgen --path checkpoint_best.pt --beam 5 \\
          --buffer-size 64 --batch-size 16 \\
      | python -m fairseq_knowgen.prep.placeholders restore --src raw.src > out.txt

``encode`` writes ``dict.txt`` and the encoded splits into a temporary folder that replaces
``--out-dir`` only once all are written (other files there are kept; see
:func:`fairseq_knowgen.textio.output_folder`); the other commands replace their ``--out`` file
only when it is complete.

``-`` (the default of ``--input``, ``--gen`` and ``--out``) is standard input or output, read
and written line by line. The restore step needs the raw source lines as a file because
fairseq-interactive prints the *encoded* source (``S-`` lines show ``<unk-N>``, not the word).
Only ``H-`` and ``D-`` lines change; log, ``S-`` and ``P-`` lines pass through.

Whole-entity placeholders ``<ent-K>`` (:mod:`.entities`, ``prep.webnlg --entity-placeholders``)
compose with these: ``encode`` keeps them as vocabulary words (``<ent-0..M-1>`` are always in
``dict.txt``, M at least ``--entity-slots`` and one more than the largest K of the encoded
splits, so that no split maps an entity to ``<unk>``), other rare words still become
``<unk-N>``, and ``restore --entmap SPLIT.entmap`` puts back source word N for ``<unk-N>``
(``--src`` is then the source with ``<ent-K>``, as the model read it) and then the surface
form of entity K for ``<ent-K>``. For raw text, ``entities delexicalize`` writes that source
and its map first (see :mod:`.entities`).
"""

import argparse
import contextlib
import os
import re
import sys
from collections import Counter
from typing import Dict, Iterator, List, Set, Tuple

from ..text import ENTITY_TOKEN, entity_token
from ..textio import DataError, atomic_write, cli_entry, read_lines, read_parallel, stream_lines
from . import entities
from .common import output_folder, replace_numbered

_PLACEHOLDER = re.compile(r"^<unk-(\d+)>$")


MARKER = re.compile(r"^<(?!unk>)[A-Za-z]+>$")  # <S> <P> <O> <sep>: always in the vocabulary


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
    Markers such as ``<S>``, ``<P>``, ``<O>``, ``<sep>`` (letters in angle brackets) are always
    kept: they are structure, not words (with entity placeholders, many sources differ only
    in their predicates, and a rare predicate set must not turn the markers into placeholders).

    Words of equal count are ranked by the word itself (:func:`ranked`), never by the order of a
    set, so the vocabulary and ``dict.txt`` do not depend on Python's hash seed.
    """
    generated, source_df = Counter(), Counter()
    for s in dict.fromkeys(src):  # distinct source lines, in file order
        source_df.update(list(dict.fromkeys(s.split())))  # each word once per line
    for s, t in zip(src, tgt):
        in_src = set(s.split())
        generated.update(w for w in t.split() if w not in in_src)
    score = Counter({w: c for w, c in generated.items() if c >= min_count})
    for w, df in source_df.items():
        if df >= min_source_df:
            score[w] = max(score[w], df)
    kept = ranked(score)[: max_size if max_size > 0 else None]
    markers = {w: source_df[w] for w in source_df if MARKER.match(w)}
    return Counter({**markers, **dict(kept)})


def ranked(vocab: Counter) -> List[Tuple[str, int]]:
    """``(word, count)`` by decreasing count, ties by the word: the order of ``dict.txt``."""
    return sorted(vocab.items(), key=lambda wc: (-wc[1], wc[0]))


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
    return replace_numbered(hyp, _PLACEHOLDER, src_words)


def encode_source(src: List[str], vocab, max_positions: int) -> List[str]:
    """A source line alone (decoding raw text) encoded exactly as :func:`encode_pair` does."""
    return encode_pair(src, [], vocab, max_positions)[0]


def read_dict(path: str) -> Tuple[Set[str], int]:
    """The fixed vocabulary and the number K of placeholders of a dictionary written by
    ``encode`` (or the ``dict.src.txt`` fairseq-preprocess copied from it)."""
    vocab, positions = set(), {}
    for n, line in enumerate(read_lines(path, "dictionary"), start=1):
        fields = line.split()
        if len(fields) < 2:
            raise DataError(path, n, f"expected 'WORD COUNT', got {line!r}")
        m = _PLACEHOLDER.match(fields[0])
        if m:
            positions[int(m.group(1))] = n
        else:
            vocab.add(fields[0])
    k = len(positions)
    if k == 0:
        raise DataError(path, 0, "no <unk-N> placeholders: not a dictionary written by `placeholders encode`")
    missing = [i for i in range(k) if i not in positions]
    if missing:
        raise DataError(
            path, 0, f"placeholders must be <unk-0>..<unk-{k - 1}>, but {placeholder(missing[0])} is missing"
        )
    return vocab, k


@contextlib.contextmanager
def _output(path: str):
    """A file written atomically, or standard output (``-``) flushed line by line."""
    if path != "-":
        with atomic_write(path) as f:
            yield f.write
        return

    def write(text):
        sys.stdout.write(text)
        sys.stdout.flush()

    yield write


def write_dict(path: str, vocab: Counter, max_positions: int):
    with atomic_write(path) as f:
        for w, c in ranked(vocab):
            f.write(f"{w} {c}\n")
        for i in range(max_positions):
            f.write(f"{placeholder(i)} 0\n")


def add_entity_slots(vocab: Counter, lines: List[str], slots: int = 0) -> int:
    """Put ``<ent-0>`` .. ``<ent-{M-1}>`` into ``vocab`` (count 0 where not already in it), M the
    larger of ``slots`` and one more than the largest K in ``lines``; returns M."""
    m = slots
    for line in lines:
        for w in line.split():
            e = ENTITY_TOKEN.match(w)
            if e:
                m = max(m, int(e.group(1)) + 1)
    for k in range(m):
        vocab.setdefault(entity_token(k), 0)
    return m


# what `encode` writes into --out-dir: replaced as a whole (textio.output_folder); other files there are kept
ENCODE_OUTPUTS = ("dict.txt", "*.src", "*.tgt")


def cmd_encode(a):
    with output_folder(a.out_dir, owned=ENCODE_OUTPUTS) as tmp:
        train_src, train_tgt = read_parallel(a.train_prefix + ".src", a.train_prefix + ".tgt", what="training")
        vocab = build_vocab(train_src, train_tgt, a.min_count, a.min_source_df, a.max_size)
        data = {prefix: read_parallel(prefix + ".src", prefix + ".tgt") for prefix in a.splits}
        n_ent = add_entity_slots(vocab, [x for src, tgt in data.values() for x in src + tgt], a.entity_slots)
        if n_ent:
            print(f"dictionary: <ent-0> .. <ent-{n_ent - 1}>")
        write_dict(os.path.join(tmp, "dict.txt"), vocab, a.max_positions)
        for prefix in a.splits:
            src, tgt = data[prefix]
            name = os.path.basename(prefix)
            enc = [encode_pair(s.split(), t.split(), vocab, a.max_positions) for s, t in zip(src, tgt)]
            for side, k in (("src", 0), ("tgt", 1)):
                with atomic_write(os.path.join(tmp, f"{name}.{side}")) as f:
                    f.writelines(" ".join(e[k]) + "\n" for e in enc)
            n_ph = sum(w.startswith("<unk-") for e in enc for w in e[1])
            print(f"{name}: {len(enc)} lines, {n_ph} target placeholders")


def cmd_encode_source(a):
    vocab, k = read_dict(a.dict)
    with _output(a.out) as write:
        for line in stream_lines(a.input, "raw source"):
            write(" ".join(encode_source(line.split(), vocab, k)) + "\n")


def cmd_restore(a):
    src = read_lines(a.src, "source")
    entmap = entities.read_entmap(a.entmap) if a.entmap else None
    if entmap is not None and len(entmap) != len(src):
        raise DataError(
            a.entmap, 0, f"{len(entmap)} lines but {a.src} has {len(src)}: not the entity map of this source"
        )
    gen = "<stdin>" if a.gen == "-" else a.gen
    with _output(a.out) as write:
        for n, line in enumerate(stream_lines(a.gen, "fairseq-generate output"), start=1):
            parts = line.split("\t")
            if parts[0][:2] in ("H-", "D-") and len(parts) == 3:
                if not parts[0][2:].isdecimal():
                    raise DataError(gen, n, f"expected a hypothesis id after {parts[0][:2]!r}, got {parts[0]!r}")
                i = int(parts[0][2:])
                if i >= len(src):
                    raise DataError(gen, n, f"hypothesis id {i} but {a.src} has {len(src)} lines")
                parts[2] = restore(parts[2], src[i].split())
                if entmap is not None:
                    parts[2] = entities.restore(parts[2], entmap[i])
            write("\t".join(parts) + "\n")


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
    e.add_argument(
        "--entity-slots",
        type=int,
        default=0,
        help="at least this many whole-entity tokens <ent-0..M-1> in the dictionary (they are always kept as "
        "words; M is also at least one more than the largest K in the encoded splits)",
    )
    es = sub.add_parser(
        "encode-source",
        help="encode raw source lines for fairseq-interactive (vocabulary and K from a dictionary of `encode`)",
    )
    es.add_argument("--dict", required=True, help="DATA/dict.src.txt of the model's data (or dict.txt of `encode`)")
    es.add_argument("--input", default="-", help="raw source lines (default -: standard input)")
    es.add_argument("--out", default="-", help="encoded lines (default -: standard output)")
    r = sub.add_parser(
        "restore", help="replace <unk-N> in fairseq-generate or fairseq-interactive output by source words"
    )
    r.add_argument("--gen", default="-", help="fairseq-generate/-interactive output (default -: standard input)")
    r.add_argument(
        "--src",
        required=True,
        help="the source lines before `encode`/`encode-source` (with <ent-K> if entities were delexicalized), "
        "line i for id i",
    )
    r.add_argument(
        "--entmap",
        help="SPLIT.entmap of prep.webnlg --entity-placeholders (or of `entities delexicalize`): "
        "<ent-K> of line i becomes its surface form K",
    )
    r.add_argument("--out", default="-", help="restored output (default -: standard output)")
    a = p.parse_args(argv)
    {"encode": cmd_encode, "encode-source": cmd_encode_source, "restore": cmd_restore}[a.cmd](a)


if __name__ == "__main__":
    cli_entry(main)
