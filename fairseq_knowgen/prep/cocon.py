"""Text for CoCon (``examples/cocon/run.sh``): the LM corpus, the contents and prompts to decode
from, and a tiny data set for the benchmark.

``corpus``: running text for the base LM, the judge LM and CoCon, lower-cased and Moses-tokenized
as the rest of the package (:func:`fairseq_knowgen.text.moses_tokenize`), one paragraph or text a
line, in documents:

- WikiText-2 (``--wikitext``, e.g. its ``valid.txt``): each article a document, its paragraphs in
  order (:func:`wikitext_articles`: headings and empty lines dropped, the ``@-@``/``@,@``/``@.@``
  joins undone, sentences with ``<unk>`` left out of their paragraph);
- WebNLG (``--webnlg``, its ``train/``, read by :func:`.webnlg.read_entries`): each entry a
  document, its texts one a line;
- CommonGen (``--commongen``, through :mod:`.commongen`, which also writes the dev concept sets
  into ``OUT/commongen/``): each training reference a document of one line.

Whole WikiText and WebNLG documents are held back until ``--heldout`` sentences of
``--min-len``..``--max-len`` tokens are collected (``heldout.txt``, one sentence a line, only the
first text of a WebNLG entry: the contents and prompts of the paper's own set-up, never trained
on); whole documents go to ``valid.txt`` until it has ``--valid`` lines; ``train.txt`` holds the
rest in a shuffled document order (``train.judge.txt``: another order, for the judge LM), and
``{train,valid}.sent.txt`` the same text one sentence a line (CoCon's sentence-line ablation).
``prompts.txt``: the fixed prompts of the CommonGen inputs (:data:`PROMPTS`).

``inputs``: the decoding inputs of the ``cocon_generation`` task from BPE'd files (``--bpe-dir``;
:func:`make_inputs`): ``cg.src`` (CommonGen dev concepts as contents: one content per concept,
``<sep>``-separated, with ``--content-mode separate``; all concepts as one content with
``joined``; then ``<prompt>`` and prompt i mod 10), ``ht{K}.src`` for K in ``--content-lengths`` (a
held-back sentence's first ``--prompt-words`` words as the prompt, K consecutive BPE tokens from a
random place after them as the content, as the paper's 5/10/20-token contents), ``SET.prompt.src``
(``<prompt>``, the content and the prompt: the prompted LM) and ``ht{K}.content`` (the content
with BPE joins undone: the reference of content coverage and BLEU).

    python -m fairseq_knowgen.prep.cocon corpus --wikitext W --commongen C --webnlg N --out RAW
    python -m fairseq_knowgen.prep.cocon inputs --bpe-dir BPE --out GEN [--gpt2-bpe LM_DIR]
    python -m fairseq_knowgen.prep.cocon gpt2-bpe --gpt2-dir LM_DIR --raw RAW --out BPE FILE...

With a pretrained LM that reads GPT-2's BPE (``examples/cocon/run.sh`` with ``LM_PATH``),
``gpt2-bpe`` encodes the corpus into BPE ids and ``inputs --gpt2-bpe`` finds word boundaries and
the contents' text through the same encoder.
"""

import argparse
import os
import random
import re
import subprocess
import sys
from typing import List, Tuple

from ..text import moses_tokenize
from ..textio import DataError, cli_entry, output_folder, read_lines
from .common import ensure_dir, write_lines

_WIKI_JOINS = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))
_SENT_END = re.compile(r"(?<= [.?!]) (?=\S)")


def split_sentences(text: str) -> List[str]:
    """Sentences of tokenized text, split after `` . `` / ``?`` / ``!``."""
    return [s.strip() for s in _SENT_END.split(text.strip()) if s.strip()]


def wikitext_articles(path: str) -> List[List[str]]:
    """WikiText's articles as lists of paragraphs (running text), in file order: an article starts at
    a `` = Title = `` line; sub-headings (`` = = ... = = ``) and empty lines are dropped, the
    ``@-@``/``@,@``/``@.@`` joins undone, and the sentences holding ``<unk>`` left out of their
    paragraph (the rest of the paragraph keeps its order)."""
    articles: List[List[str]] = []
    for line in read_lines(path, "wikitext"):
        s = line.strip()
        if not s:
            continue
        if s.startswith("="):
            if not s.startswith("= ="):  # a new article
                articles.append([])
            continue
        for a, b in _WIKI_JOINS:
            s = s.replace(a, b)
        kept = [x for x in split_sentences(s) if "<unk>" not in x]
        if kept:
            if not articles:
                articles.append([])
            articles[-1].append(" ".join(kept))
    return [a for a in articles if a]


def wikitext_sentences(path: str) -> List[str]:
    """Every sentence of :func:`wikitext_articles` (no ``<unk>``), in file order."""
    return [x for article in wikitext_articles(path) for p in article for x in split_sentences(p)]


# the files and folders prepare_corpus writes in OUT
CORPUS_FILES = ["commongen", "heldout.txt", "valid.txt", "train.txt", "train.judge.txt", "train.sent.txt",
                "valid.sent.txt", "cg.concepts.txt", "cg.ref.txt", "prompts.txt"]  # fmt: skip


def prepare_corpus(
    wikitext: str,
    commongen: str,
    webnlg: str,
    out: str,
    n_heldout: int = 600,
    n_valid: int = 1000,
    min_len: int = 4,
    max_len: int = 60,
    seed: int = 1,
):
    """The LM and CoCon corpus as running text (see the module docstring).

    Documents: a WikiText article (its paragraphs, one a line, in order), a WebNLG entry (its
    texts, one a line) and a CommonGen training reference. Held-back documents (WikiText articles
    and WebNLG entries, drawn until they hold ``n_heldout`` sentences of ``min_len``..``max_len``
    tokens) are never trained on; validation documents are drawn until they hold ``n_valid`` lines.
    ``train.txt`` holds the other documents in a shuffled order, ``train.judge.txt`` the same in
    another; ``{train,valid}.sent.txt`` the same text one sentence a line (CoCon's sentence-line
    ablation)."""
    from . import commongen as cg
    from . import webnlg as wn

    # every output into a temporary folder that replaces OUT's own files only once all are written (the later
    # stages' files in OUT are kept)
    with output_folder(out, owned=CORPUS_FILES) as tmp:
        cg.prepare(commongen, os.path.join(tmp, "commongen"))
        docs: List[List[str]] = []  # documents that may be held back (WikiText, WebNLG)
        if wikitext:
            docs += [[moses_tokenize(p) for p in article] for article in wikitext_articles(wikitext)]
        n_wiki = len(docs)
        if webnlg:
            docs += [[moses_tokenize(t) for t in e["texts"]] for e in wn.read_entries(os.path.join(webnlg, "train"))]
        is_webnlg = [i >= n_wiki for i in range(len(docs))]
        common = read_lines(os.path.join(tmp, "commongen", "train.tgt"), "CommonGen references")

        def ok(s):
            return min_len <= len(s.split()) <= max_len

        rng = random.Random(seed)
        order = list(range(len(docs)))
        rng.shuffle(order)
        heldout: List[str] = []
        while order and len(heldout) < n_heldout:
            i = order.pop()
            # a WebNLG entry's texts say the same thing: its first one only
            heldout += [x for line in docs[i][: 1 if is_webnlg[i] else None] for x in split_sentences(line) if ok(x)]
        docs = [docs[i] for i in order]
        if len(heldout) < n_heldout:
            raise DataError(out, 0, f"only {len(heldout)} wikitext/WebNLG sentences for --heldout {n_heldout}")
        heldout = heldout[:n_heldout]
        rest = docs + [[s] for s in sorted(set(common)) if ok(s)]
        rng.shuffle(rest)
        valid_docs: List[List[str]] = []
        while rest and sum(map(len, valid_docs)) < n_valid:
            valid_docs.append(rest.pop())
        if not rest:
            raise DataError(out, 0, f"no training text left after --valid {n_valid}")
        lines = [line for doc in rest for line in doc if len(line.split()) >= min_len]
        valid = [line for doc in valid_docs for line in doc if len(line.split()) >= min_len]
        write_lines(f"{tmp}/heldout.txt", heldout)
        write_lines(f"{tmp}/valid.txt", valid)
        write_lines(f"{tmp}/train.txt", lines)
        judge = list(rest)
        random.Random(seed + 1).shuffle(judge)
        write_lines(f"{tmp}/train.judge.txt", (line for doc in judge for line in doc if len(line.split()) >= min_len))
        write_lines(f"{tmp}/train.sent.txt", (x for line in lines for x in split_sentences(line) if ok(x)))
        write_lines(f"{tmp}/valid.sent.txt", (x for line in valid for x in split_sentences(line) if ok(x)))
        # what the BPE stage encodes for decoding: concepts (space-separated) and the first references
        write_lines(f"{tmp}/cg.concepts.txt", read_lines(f"{tmp}/commongen/valid.src", "CommonGen concepts"))
        write_lines(f"{tmp}/cg.ref.txt", read_lines(f"{tmp}/commongen/valid.tgt", "CommonGen references"))
        write_prompts(f"{tmp}/prompts.txt")
    n_tok = sum(len(x.split()) for x in lines)
    print(f"train {len(lines)} lines ({len(rest)} documents, {n_tok} tokens), valid {len(valid)} lines, "
          f"heldout {len(heldout)} sentences -> {out}")


class SubwordNmtPieces:
    """Word boundaries and text of subword-nmt BPE (``piece@@ piece``)."""

    def continues(self, toks: List[str], i: int) -> bool:
        """Whether token ``i`` continues the word of token ``i - 1``."""
        return i > 0 and toks[i - 1].endswith("@@")

    def text(self, toks: List[str]) -> str:
        return re.sub(r"@@( |$)", "", " ".join(toks)).strip()


class Gpt2Pieces:
    """Word boundaries and text of GPT-2 BPE as fairseq writes it (the BPE ids, ``"1212 318"``):
    a word starts at a token whose bytes start with a space. ``gpt2_dir``: ``encoder.json`` and
    ``vocab.bpe`` (fairseq's :func:`~fairseq.data.encoders.gpt2_bpe_utils.get_encoder`)."""

    def __init__(self, gpt2_dir: str):
        from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

        files = [os.path.join(gpt2_dir, f) for f in ("encoder.json", "vocab.bpe")]
        for f in files:
            if not os.path.isfile(f):
                raise DataError(f, 0, "GPT-2 BPE file not found")
        self.bpe = get_encoder(*files)

    def continues(self, toks: List[str], i: int) -> bool:
        return i > 0 and toks[i].isdigit() and not self.bpe.decode([int(toks[i])]).startswith(" ")

    def text(self, toks: List[str]) -> str:
        # symbols that are no BPE id (<unk>, which a sampled output may hold) are kept as written, as
        # fairseq's GPT2BPE.decode keeps <unk> and <mask>
        return self.bpe.decode([int(t) if t.isdigit() else t for t in toks]).strip()

    def encode(self, line: str) -> str:
        return " ".join(map(str, self.bpe.encode(line)))


def gpt2_encode(gpt2_dir: str, raw: str, out: str, names: List[str]):
    """``raw/NAME`` (lower-cased, Moses-tokenized: :func:`prepare_corpus`) -> ``out/NAME`` in
    GPT-2 BPE ids (fairseq's ``--bpe gpt2`` form, as ``examples/roberta/multiprocessing_bpe_encoder.py``
    writes it), Moses-detokenized first: GPT-2 was trained on untokenized text."""
    from sacremoses import MosesDetokenizer

    pieces, detok = Gpt2Pieces(gpt2_dir), MosesDetokenizer(lang="en")
    ensure_dir(out)
    for name in names:
        lines = read_lines(os.path.join(raw, name), "text")
        write_lines(os.path.join(out, name), (pieces.encode(detok.detokenize(x.split())) for x in lines))


# Short neutral openings to decode CommonGen concept sets from (this package's own list, in the manner of the
# authors' prompt files; lower-cased and Moses-tokenized as the corpus): every system decodes input i from prompt
# i mod 10, so the plain LM, the prompted LM and CoCon continue the same text.
PROMPTS = (
    "the",
    "in the morning ,",
    "yesterday ,",
    "there is",
    "in this picture ,",
    "last weekend ,",
    "it was",
    "my friend",
    "at the park ,",
    "when we arrived ,",
)


def write_prompts(path: str):
    write_lines(path, PROMPTS)


def word_spans(toks: List[str], pieces) -> List[Tuple[int, int]]:
    """``(start, end)`` token indices of each word of a BPE'd sentence."""
    spans: List[Tuple[int, int]] = []
    for i in range(len(toks)):
        if spans and pieces.continues(toks, i):
            spans[-1] = (spans[-1][0], i + 1)
        else:
            spans.append((i, i + 1))
    return spans


def make_inputs(
    bpe_dir: str,
    out: str,
    content_mode: str = "separate",
    lengths=(5, 10, 20),
    seed: int = 1,
    pieces=None,
    prompt_words: int = 3,
):
    """The decoding inputs (module docstring) from ``bpe_dir``'s BPE'd files; ``pieces``: the BPE's
    word boundaries (:class:`SubwordNmtPieces`, the default, or :class:`Gpt2Pieces`).

    Every input has a prompt (``<prompt>`` and what follows): CommonGen concept set i the BPE'd
    ``bpe_dir/prompts.txt`` line i mod n (when that file exists; else no prompt), a held-back
    sentence its first ``prompt_words`` words (0: no prompt), its content K tokens from a random place
    after them. ``SET.prompt.src`` (the prompted LM) holds the content before the prompt, as the
    authors' "prompted GPT-2"."""
    pieces = pieces or SubwordNmtPieces()
    ensure_dir(out)
    concepts_path = f"{bpe_dir}/cg.concepts.txt"
    concepts = read_lines(concepts_path, "BPE'd concepts", allow_empty_lines=False)
    words = [c.split() for c in concepts]
    prompts_path = f"{bpe_dir}/prompts.txt"
    prompts = read_lines(prompts_path, "BPE'd prompts", allow_empty_lines=False) if os.path.isfile(prompts_path) else []

    def group(ws: List[str]) -> List[str]:
        # concept words as BPE'd: a concept is a word and the pieces that continue it
        return [" ".join(ws[i:j]) for i, j in word_spans(ws, pieces)]

    def inputs(content_parts: List[str], prompt: str):
        sep = " <sep> " if content_mode == "separate" else " "
        tail = f" <prompt> {prompt}" if prompt else ""
        joined = " ".join(content_parts)
        return sep.join(content_parts) + tail, "<prompt> " + (f"{joined} {prompt}" if prompt else joined)

    rows = [inputs(group(ws), prompts[i % len(prompts)] if prompts else "") for i, ws in enumerate(words)]
    write_lines(f"{out}/cg.src", (r[0] for r in rows))
    write_lines(f"{out}/cg.prompt.src", (r[1] for r in rows))
    held = [x.split() for x in read_lines(f"{bpe_dir}/heldout.txt", "BPE'd held-back text")]
    rng = random.Random(seed)
    for k in lengths:
        rows, contents = [], []
        for toks in held:
            spans = word_spans(toks, pieces)
            if len(spans) <= prompt_words:
                continue
            start = spans[prompt_words][0] if prompt_words else 0  # the content starts after the prompt
            if len(toks) - start < k:
                continue
            i = rng.randint(start, len(toks) - k)
            # do not start or end inside a word
            while i > start and pieces.continues(toks, i):
                i -= 1
            j = i + k
            while j > i and j < len(toks) and pieces.continues(toks, j):
                j -= 1
            if j > i:
                rows.append(inputs([" ".join(toks[i:j])], " ".join(toks[:start])))
                contents.append(pieces.text(toks[i:j]))
        if not rows:
            raise DataError(f"{bpe_dir}/heldout.txt", 0, f"no held-back sentence has {prompt_words} words and {k} tokens")
        write_lines(f"{out}/ht{k}.src", (r[0] for r in rows))
        write_lines(f"{out}/ht{k}.prompt.src", (r[1] for r in rows))
        write_lines(f"{out}/ht{k}.content", contents)
        print(f"ht{k}: {len(rows)} contents of up to {k} BPE tokens after a {prompt_words}-word prompt")


def make_benchmark_data(workdir: str, n_train: int, n_valid: int, sizes=None):
    """A tiny binarized CoCon data set and a frozen ``transformer_lm`` for ``scripts/benchmark.py``.

    Writes ``workdir/bin`` (sentences from :mod:`fairseq_knowgen.demo_data`'s targets, binarized
    with ``fairseq-preprocess --only-source``) and ``workdir/bin/lm.pt``: an untrained
    ``transformer_lm`` (4 layers, 128 wide, 4 heads, FFN 512; ``sizes`` = (layers, width, heads) instead, as
    ``scripts/benchmark.py --size base`` passes them, the block after layer layers // 2), saved in fairseq's checkpoint format
    with its ``dict.txt`` beside it. Returns ``(data_dir, {"arch": [...], "baseline": [...]})`` as
    :func:`benchmarks.profiles.make_data` takes it: both sides get ``--cocon-lm-path`` and
    ``--cocon-layer`` (layers // 2) and ``--cocon-sample-mode lines``. Four layers, not the benchmark's default two: CoCon adds one layer to
    its LM, so its decoding speed relative to the LM falls with the LM's depth (beam 5, 20 tokens,
    measured on a loaded 2-core machine: 0.78-0.83 at four layers, about 0.7 at two; GPT-2 small
    has twelve).
    """
    from ..demo_data import make_dataset

    raw, out = os.path.join(workdir, "raw"), os.path.join(workdir, "bin")
    make_dataset(raw, train=n_train, valid=n_valid, test=n_valid, seed=7)
    binary = os.path.dirname(sys.executable)
    subprocess.run(
        [
            os.path.join(binary, "fairseq-preprocess"),
            "--only-source",
            "--trainpref",
            f"{raw}/train.tgt",
            "--validpref",
            f"{raw}/valid.tgt",
            "--destdir",
            out,
            "--workers",
            "1",
        ],
        check=True,
        capture_output=True,
    )
    layers, dim, heads = sizes or (4, 128, 4)
    lm = save_untrained_lm(out, os.path.join(out, "lm.pt"), layers=layers, dim=dim, heads=heads)
    # the demo's targets are short sentences, too short for 30-token windows: one sample per line
    lm_args = ["--cocon-lm-path", lm, "--cocon-layer", str(layers // 2), "--cocon-sample-mode", "lines"]
    return out, {"arch": lm_args, "baseline": lm_args}


def save_untrained_lm(data: str, path: str, layers: int, dim: int, heads: int, seed: int = 1):
    """An untrained fairseq ``transformer_lm`` on ``data``'s dictionary, saved as a checkpoint
    that ``--cocon-lm-path`` reads (``dict.txt`` copied beside it)."""
    import shutil

    import torch
    from fairseq import tasks

    from ..convert.hf_gpt2 import lm_config, save_lm_checkpoint

    # fmt: off
    cfg = lm_config(data, [
        "--decoder-layers", str(layers), "--decoder-embed-dim", str(dim), "--decoder-ffn-embed-dim", str(4 * dim),
        "--decoder-attention-heads", str(heads), "--share-decoder-input-output-embed", "--tokens-per-sample", "256",
        "--seed", str(seed),
    ])
    # fmt: on
    torch.manual_seed(seed)
    model = tasks.setup_task(cfg.task).build_model(cfg.model)
    save_lm_checkpoint(cfg, model, path)
    src, dst = os.path.join(data, "dict.txt"), os.path.join(os.path.dirname(os.path.abspath(path)), "dict.txt")
    if not os.path.exists(dst) or not os.path.samefile(src, dst):
        shutil.copy(src, dst)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus", help="LM sentences, held-back text, CommonGen dev concept sets")
    c.add_argument("--wikitext", help="wikitext-2 file (e.g. valid.txt)")
    c.add_argument("--commongen", required=True, help="folder with the raw CommonGen files")
    c.add_argument("--webnlg", help="WebNLG folder (train/ is read)")
    c.add_argument("--out", required=True)
    c.add_argument("--heldout", type=int, default=600, help="held-back sentences (never trained on)")
    c.add_argument("--valid", type=int, default=1000, help="validation sentences")
    c.add_argument("--min-len", type=int, default=4)
    c.add_argument("--max-len", type=int, default=60)
    c.add_argument("--seed", type=int, default=1)
    i = sub.add_parser("inputs", help="decoding inputs (cg.src, ht{K}.src, ...) from BPE'd files")
    i.add_argument("--bpe-dir", required=True, help="folder with BPE'd cg.concepts.txt and heldout.txt")
    i.add_argument("--out", required=True)
    i.add_argument("--content-mode", choices=["separate", "joined"], default="separate")
    i.add_argument("--content-lengths", default="5,10,20")
    i.add_argument("--seed", type=int, default=1)
    i.add_argument("--prompt-words", type=int, default=3, help="held-back inputs: the sentence's first N words are "
                   "the prompt (0: none)")
    i.add_argument("--gpt2-bpe", metavar="DIR", help="the BPE is GPT-2's (DIR: encoder.json, vocab.bpe)")
    g = sub.add_parser("gpt2-bpe", help="encode RAW/FILE... into OUT/FILE... with GPT-2's BPE (fairseq's)")
    g.add_argument("--gpt2-dir", required=True, help="folder with encoder.json and vocab.bpe")
    g.add_argument("--raw", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("files", nargs="+")
    a = p.parse_args(argv)
    if a.cmd == "corpus":
        prepare_corpus(a.wikitext, a.commongen, a.webnlg, a.out, a.heldout, a.valid, a.min_len, a.max_len, a.seed)
    elif a.cmd == "gpt2-bpe":
        gpt2_encode(a.gpt2_dir, a.raw, a.out, a.files)
    else:
        lengths = [int(x) for x in a.content_lengths.split(",")]
        pieces = Gpt2Pieces(a.gpt2_bpe) if a.gpt2_bpe else None
        make_inputs(a.bpe_dir, a.out, a.content_mode, lengths, a.seed, pieces, a.prompt_words)


if __name__ == "__main__":
    cli_entry(main)
