"""Bad input through the public entry points, one row per case.

Every case writes its inputs and an earlier output into a fresh folder, runs one command and asserts:

- exit status 2 (or the row's ``code``);
- the last line of stderr is ``error: ...`` and names the place at fault (``path:line`` where a
  line is at fault, else ``path``);
- no traceback anywhere in the output;
- the earlier outputs (``keep``) byte-identical, and no ``.tmp-*`` file or folder left anywhere.

A row's ``argv`` starts with the entry point: a module run as ``python -m`` (``prep.webnlg``,
``checkpoint_average``...; run in this process through its ``main`` and
:func:`fairseq_knowgen.textio.cli_entry`, as its ``__main__`` does, since a subprocess costs seconds
of imports), ``scripts/NAME.py``, or a ``fairseq-*`` command (run as a subprocess). ``{t}`` in
``argv`` and ``where`` is the case's folder (a ``where`` may also be a function of it). To add an entry
point, add rows to ``CASES`` (and, for a module, nothing else: its ``main(argv)`` is found by name).

The converters' rows damage copies of real released folders (``../shared/released``: a real BERT, GPT-2's
BPE and BART's dictionary under tiny random models), or of small stand-ins with the same layout where that
folder is absent: weights cut short, JSON files cut short, a vocabulary of another model.
"""

import atexit
import contextlib
import functools
import importlib
import io
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Union

import pytest
import torch
from conftest import run_cli

from fairseq_knowgen.textio import cli_entry

Files = Dict[str, Union[str, bytes]]


@dataclass
class Case:
    id: str
    argv: List[str]
    where: Union[str, Callable[[str], str]]  # must occur in the last stderr line, after "error: "
    files: Files = field(default_factory=dict)  # inputs and earlier outputs, relative to {t}
    keep: List[str] = field(default_factory=list)  # earlier outputs that must stay byte-identical
    setup: Optional[Callable] = None  # more set-up: setup(folder)
    code: int = 2
    error: str = ""  # must occur in an earlier stderr line (fairseq-interactive: the bad line's own error)
    decoded: List[str] = field(default_factory=list)  # must occur in stdout (the other lines were decoded)
    env: Dict[str, str] = field(default_factory=dict)  # a recipe's settings (STAGE=4 ...)


def xml(*entries, category="Airport"):
    """A WebNLG file; an entry: (triples as 'a | b | c' strings, texts)."""
    out = ["<benchmark>", "<entries>"]
    for i, (triples, texts) in enumerate(entries):
        out.append(f'<entry category="{category}" eid="Id{i}" size="{len(triples)}">')
        out += ["<modifiedtripleset>"] + [f"<mtriple>{t}</mtriple>" for t in triples] + ["</modifiedtripleset>"]
        out += [f'<lex lid="Id{j}"><text>{t}</text></lex>' for j, t in enumerate(texts)]
        out.append("</entry>")
    return "\n".join(out + ["</entries>", "</benchmark>"]) + "\n"


GOOD = xml((["Aarhus | city served | Aarhus_Airport"], ["Aarhus Airport serves Aarhus ."]))
WEBNLG = {"wn/train/1triples/Airport.xml": GOOD, "wn/dev/1triples/Airport.xml": GOOD}
PREVIOUS = {"out/train.src": "old source\n", "out/train.tgt": "old target\n", "out/eval_splits": "valid\n"}
KEEP_OUT = ["out"]
WEBNLG_ARGV = ["prep.webnlg", "--data", "{t}/wn", "--out", "{t}/out", "--heldout-categories", ""]

PAIRS = {"raw/train.src": "a b c\nd e f\n", "raw/train.tgt": "a b\nd e\n"}
PAIRS.update({"raw/valid.src": "a x\n", "raw/valid.tgt": "a\n"})
ENCODE = ["prep.placeholders", "encode", "--train-prefix", "{t}/raw/train", "--out-dir", "{t}/enc", "--splits"]
DICT = "a 5\nb 3\n<unk-0> 0\n<unk-1> 0\n"
OLD_ENC = {"enc/dict.txt": DICT, "enc/train.src": "old\n", "enc/train.tgt": "old\n"}
GEN = "S-0\tx\nH-0\t-0.1\t<unk-0> b\nH-1\t-0.2\tb\n"
LINEAR = "<S> Alan Bean <P> birth place <O> Wheeler , Texas\n"

REFS = {"hyp.txt": "a cat sits .\na dog runs .\na bird sings .\n", "ref0.txt": "a cat sits .\na dog runs .\nbird .\n"}
OLD_SCORES = {"scores.json": '{"old": 1}\n'}
EVAL = ["scripts/evaluate.py", "--hyp", "{t}/hyp.txt", "--no-cider", "--json-out", "{t}/scores.json", "--refs"]


def checkpoints(*bad: bytes):
    """A good checkpoint1.pt and a checkpoint_last.pt with the given bytes (or a good one)."""

    def setup(t):
        os.makedirs(f"{t}/ck", exist_ok=True)
        good = {"model": {"w": torch.ones(2)}, "optimizer_history": [{"num_updates": 10}]}
        torch.save(good, f"{t}/ck/checkpoint1.pt")
        torch.save({**good, "optimizer_history": [{"num_updates": 20}]}, f"{t}/ck/checkpoint_last.pt")
        if bad:
            with open(f"{t}/ck/checkpoint_last.pt", "wb") as f:
                f.write(bad[0])

    return setup


def evil(t):
    """A checkpoint whose pickle names os.system (weights-only loading refuses it)."""
    checkpoints()(t)
    torch.save({"model": {"w": torch.ones(2)}, "x": os.system}, f"{t}/ck/checkpoint_last.pt")


def truncated(t):
    checkpoints()(t)
    data = open(f"{t}/ck/checkpoint_last.pt", "rb").read()
    open(f"{t}/ck/checkpoint_last.pt", "wb").write(data[: len(data) // 2])


DICTS = {"data/dict.src.txt": "a 1\nb 1\n", "data/dict.tgt.txt": "a 1\nb 1\n"}
AVERAGE = ["checkpoint_average", "--dir", "{t}/ck", "--last", "2", "--out", "{t}/avg.pt"]
OLD_AVG = {"avg.pt": b"earlier average"}

# prep.commongen: the raw CommonGen files; an earlier raw/ with a later stage's file that must survive
CG = {"cg/commongen.train.src_alpha.txt": "dog run\ncat sit\n", "cg/commongen.train.tgt.txt": "a dog runs\na cat sits\n",
      "cg/commongen.dev.src_alpha.txt": "dog run\n", "cg/commongen.dev.tgt.txt": "a dog runs\n"}  # fmt: skip
OLD_RAW = {"raw/train.src": "old\n", "raw/train.tgt": "old\n", "raw/valid.src": "old\n", "raw/valid.proto": "p\n"}
COMMONGEN = ["prep.commongen", "--data", "{t}/cg", "--out", "{t}/raw"]
# prep.kbert: a classification and a tagging task
KB = {"kb/train.tsv": "label\ttext_a\n0\t今天很好\n1\t不好\n", "kb/dev.tsv": "label\ttext_a\n0\t很好\n"}
KBT = {"kbt/train.tsv": "text_a\tlabel\n今 天\tB-X I-X\n", "kbt/dev.tsv": "text_a\tlabel\n今 天\tB-X O\n"}
OLD_KB = {"kbo/data/train.tsv": "old\n", "kbo/data/dict.txt": "a 1\n", "kbo/mlm/train.txt": "old\n"}
KBERT = ["prep.kbert", "--out", "{t}/kbo", "--data"]
# prep.retrieval
RETR = {"q.txt": "dog run\ncat sit\n", "c.txt": "a dog runs\na cat sits\n", "k.txt": "dog run\ncat sit\n"}
RETRIEVE = ["prep.retrieval", "--queries", "{t}/q.txt", "--out", "{t}/proto.txt", "--corpus"]
OLD_PROTO = {"proto.txt": "earlier prototypes\n"}


# the converters: small damaged copies of released folders, built once per session
@functools.lru_cache(maxsize=None)
def models_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="bad-input-models-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


@functools.lru_cache(maxsize=None)
def minilm() -> str:
    """The real all-MiniLM-L6-v2 folder (model.safetensors, tokenizer.json), or its stand-in."""
    from test_convert_hf_bert_released import minilm_folder

    return minilm_folder(models_dir())


@functools.lru_cache(maxsize=None)
def chinese_vocab() -> str:
    """Google's Chinese vocab.txt (21,128 lines), or its stand-in."""
    from test_convert_hf_bert_released import chinese_vocab as vocab

    folder = models_dir() / "zh"
    folder.mkdir(exist_ok=True)
    return str(vocab(folder)[0])


def lines_of(path: str) -> int:
    return open(path, "rb").read().decode("utf-8").count("\n")


def embedding_rows(folder: str) -> int:
    return json.load(open(os.path.join(folder, "config.json")))["vocab_size"]


@functools.lru_cache(maxsize=None)
def gpt2_bpe():
    """(encoder.json, vocab.bpe, BART's dict.txt): the released files, or stand-ins."""
    from test_convert_hf_bart import released_or_stand_in

    folder = models_dir() / "bpe"
    folder.mkdir(exist_ok=True)
    return tuple(str(p) for p in released_or_stand_in(folder))


@functools.lru_cache(maxsize=None)
def tiny_bert_bin() -> str:
    """A tiny random BERT over the Chinese vocab.txt, its weights as pytorch_model.bin."""
    from transformers import BertConfig, BertModel

    folder = models_dir() / "bert_bin"
    folder.mkdir()
    shutil.copy(chinese_vocab(), folder / "vocab.txt")
    cfg = BertConfig(vocab_size=lines_of(chinese_vocab()), hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=16, max_position_embeddings=32)  # fmt: skip
    torch.manual_seed(0)
    cfg.save_pretrained(folder)
    torch.save(BertModel(cfg).state_dict(), folder / "pytorch_model.bin")
    return str(folder)


@functools.lru_cache(maxsize=None)
def tiny_bart() -> str:
    """A tiny random BART whose HF ids are BART's dict.txt rows over GPT-2's BPE (vocab.json, merges.txt)."""
    from test_convert_hf_bart import write_hf_bart

    folder = models_dir() / "bart"
    write_hf_bart(folder, *gpt2_bpe())
    return str(folder)


@functools.lru_cache(maxsize=None)
def tiny_gpt2() -> str:
    """A tiny random GPT-2 over GPT-2's BPE (vocab.json, merges.txt), its weights as pytorch_model.bin."""
    from transformers import GPT2Config, GPT2LMHeadModel

    encoder_json, vocab_bpe, _ = gpt2_bpe()
    folder = models_dir() / "gpt2"
    folder.mkdir()
    shutil.copy(encoder_json, folder / "vocab.json")
    shutil.copy(vocab_bpe, folder / "merges.txt")
    eos = json.load(open(encoder_json, encoding="utf-8"))["<|endoftext|>"]
    cfg = GPT2Config(vocab_size=len(json.load(open(encoder_json, encoding="utf-8"))), n_positions=16, n_embd=8,
                     n_layer=1, n_head=2, bos_token_id=eos, eos_token_id=eos)  # fmt: skip
    torch.manual_seed(0)
    cfg.save_pretrained(folder)
    torch.save(GPT2LMHeadModel(cfg).state_dict(), folder / "pytorch_model.bin")
    return str(folder)


WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def hf_copy(source: Callable[[], str], cut: Optional[Dict[str, int]] = None,
            put: Optional[Dict[str, Callable[[], Union[str, bytes]]]] = None, drop=()):  # fmt: skip
    """setup: ``{t}/hf``, a copy of the folder ``source()`` (weights linked), with files cut to their first N bytes
    (a negative N: all but the last -N), replaced by ``put[name]()`` or dropped."""

    def setup(t):
        src, hf = source(), os.path.join(t, "hf")
        os.makedirs(hf)
        for name in os.listdir(src):
            if name in drop:
                continue
            path = os.path.join(src, name)
            if name in (cut or {}):
                data = open(path, "rb").read()
                open(os.path.join(hf, name), "wb").write(data[: cut[name]])
            elif name in WEIGHTS:
                os.symlink(os.path.abspath(path), os.path.join(hf, name))
            else:
                shutil.copy(path, hf)
        for name, content in (put or {}).items():
            data = content()
            open(os.path.join(hf, name), "wb").write(data if isinstance(data, bytes) else data.encode())

    return setup


def read(path: Callable[[], str]) -> Callable[[], bytes]:
    return lambda: open(path(), "rb").read()


def one_of(f: Callable[[], str], name: str) -> Callable[[], bytes]:
    return lambda: open(os.path.join(f(), name), "rb").read()


def minilm_config(**changes) -> Callable[[], str]:
    """all-MiniLM-L6-v2's config.json with ``changes``."""
    return lambda: json.dumps({**json.load(open(os.path.join(minilm(), "config.json"))), **changes})


def fewer_bpe_tokens() -> str:
    """GPT-2's encoder.json without its last 1,000 tokens."""
    encoder = json.load(open(gpt2_bpe()[0], encoding="utf-8"))
    return json.dumps({k: i for k, i in encoder.items() if i < len(encoder) - 1000})


def more_wordpiece_tokens() -> str:
    """all-MiniLM-L6-v2's tokenizer.json with two added tokens beyond its embedding rows."""
    spec = json.load(open(os.path.join(minilm(), "tokenizer.json"), encoding="utf-8"))
    n = len(spec["model"]["vocab"])
    added = [{"id": n, "content": "[X1]"}, {"id": n + 1, "content": "[X2]"}]
    spec["added_tokens"] = spec.get("added_tokens", []) + added
    return json.dumps(spec)


def fairseq_checkpoint(data: Optional[bytes] = None, evil: bool = False):
    """setup: {t}/ck/model.pt (a fairseq checkpoint of an 8-row embedding, cut in half with ``data=b"half"``,
    naming os.system with ``evil``) and a dict.txt of its 4 symbols."""

    def setup(t):
        os.makedirs(f"{t}/ck")
        state = {"model": {"encoder.embed_tokens.weight": torch.ones(8, 2)}, "args": None}
        torch.save({**state, "x": os.system} if evil else state, f"{t}/ck/model.pt")
        if data == b"half":
            whole = open(f"{t}/ck/model.pt", "rb").read()
            open(f"{t}/ck/model.pt", "wb").write(whole[: len(whole) // 2])
        open(f"{t}/ck/dict.txt", "w").write("a 1\nb 1\nc 1\nd 1\n")

    return setup


OLD_CONVERTED = {"out/model.pt": b"an earlier conversion", "out/dict.txt": "a 1\n", "out/notes.txt": "mine\n"}
OLD_LM = {"out/checkpoint.pt": b"an earlier conversion", "out/dict.txt": "a 1\n", "out/notes.txt": "mine\n"}
HF_BERT, HF_BART, HF_GPT2 = (["convert." + c, "{t}/hf", "{t}/out"] for c in ("hf_bert", "hf_bart", "hf_gpt2"))
NOT_JSON = "not valid JSON"

# fairseq-interactive with EKI: an untrained tiny model (random weights) is enough to decode
EKI_WORDS = "dog cat horse runs sits park the a".split()


@functools.lru_cache(maxsize=None)
def tiny_eki() -> str:
    """A folder with data/dict.{src,tgt}.txt (EKI_WORDS and <sep>) and checkpoint.pt, a random tiny EKI model."""
    from checkpoint_helpers import save_checkpoint
    from conftest import TINY_MODEL
    from fairseq import options, tasks

    folder = models_dir() / "eki"
    (folder / "data").mkdir(parents=True)
    for side in ("src", "tgt"):
        (folder / "data" / f"dict.{side}.txt").write_text("".join(f"{w} 1\n" for w in EKI_WORDS + ["<sep>"]))
    argv = [str(folder / "data"), "--task", "eki_generation", "--arch", "eki_transformer", "--cpu", "-s", "src",
            "-t", "tgt", *TINY_MODEL, "--eki-scaling-dim", "8"]  # fmt: skip
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    torch.manual_seed(0)
    save_checkpoint(tasks.setup_task(args).build_model(args), args, folder / "checkpoint.pt")
    return str(folder)


def eki_input(*lines: Union[str, bytes]):
    """setup: {t}/eki (the tiny EKI model, linked) and {t}/in.txt, the input lines."""

    def setup(t):
        os.symlink(tiny_eki(), f"{t}/eki")
        with open(f"{t}/in.txt", "wb") as f:
            f.writelines((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines)

    return setup


INTERACTIVE = ["fairseq-interactive", "{t}/eki/data", "--path", "{t}/eki/checkpoint.pt", "--user-dir",
               "fairseq_knowgen", "--task", "eki_generation", "-s", "src", "-t", "tgt", "--cpu", "--beam", "2",
               "--max-len-a", "0", "--max-len-b", "4", "--input", "{t}/in.txt"]  # fmt: skip
GOOD_EKI = "dog cat <sep> the dog sits"
REFUSED_ONE = "{t}/in.txt: 1 of 3 line(s) refused (each named above); the others were decoded"

# the recipes: a stage whose input an earlier stage did not finish (killed: its outputs are renamed into place only
# when complete) names that stage and the command that reruns from it
RAW_CG = {f"out/raw/{s}.{x}": "dog run\n" for s in ("train", "valid") for x in ("src", "tgt", "eki.src")}
RAW_CG.update({"out/raw/eval_splits": "valid\n", "out/raw/text": "moses\n"})
BPE_CG_KILLED = {f"out/bpe/train.{x}": "dog run\n" for x in ("src", "tgt", "eki.src")}  # stage 3 killed after train
OLD_BIN = {"out/bin/dict.src.txt": "an earlier dictionary 1\n"}
COMMONGEN_RECIPE = ["examples/commongen/run.sh", "{t}/data", "{t}/out"]
RERUN = "rerun from stage {n} with the same settings: STAGE={n} bash "

CASES = [
    # prep.commongen: every split read and checked before raw/ is replaced; a later stage's files kept
    Case(
        "commongen-train-line-mismatch",
        COMMONGEN,
        "{t}/cg/commongen.train.tgt.txt:2: line-count mismatch",
        {**CG, **OLD_RAW, "cg/commongen.train.tgt.txt": "a dog runs\n"},
        ["raw"],
    ),
    Case(
        "commongen-dev-line-mismatch-leaves-train-as-it-was",
        COMMONGEN,
        "{t}/cg/commongen.dev.src_alpha.txt:2: line-count mismatch",
        {**CG, **OLD_RAW, "cg/commongen.dev.tgt.txt": "a dog runs\nx\n"},
        ["raw"],
    ),
    Case(
        "commongen-dev-missing",
        COMMONGEN,
        "{t}/cg/commongen.dev.src_alpha.txt: CommonGen valid file not found",
        {k: v for k, v in {**CG, **OLD_RAW}.items() if k != "cg/commongen.dev.src_alpha.txt"},
        ["raw"],
    ),
    Case(
        "commongen-dev-bad-utf8",
        COMMONGEN,
        "{t}/cg/commongen.dev.src_alpha.txt:2: not valid UTF-8",
        {**CG, **OLD_RAW, "cg/commongen.dev.src_alpha.txt": b"dog run\n\xff\n", "cg/commongen.dev.tgt.txt": "a\nb\n"},
        ["raw"],
    ),
    Case(
        "commongen-file-in-place-of-out",
        COMMONGEN,
        "{t}/raw: a file is in the way of the output folder",
        {**CG, "raw": "a file\n"},
        ["raw"],
    ),
    # prep.commongen: an empty concept line (an empty source in training, an extra concept set in dev)
    Case(
        "commongen-train-empty-concept-line",
        COMMONGEN,
        "{t}/cg/commongen.train.src_alpha.txt:2: empty line",
        {**CG, **OLD_RAW, "cg/commongen.train.src_alpha.txt": "dog run\n\ncat sit\n",
         "cg/commongen.train.tgt.txt": "a dog runs\na thing\na cat sits\n"},  # fmt: skip
        ["raw"],
    ),
    Case(
        "commongen-dev-empty-concept-line",
        COMMONGEN,
        "{t}/cg/commongen.dev.src_alpha.txt:2: empty line",
        {**CG, **OLD_RAW, "cg/commongen.dev.src_alpha.txt": "dog run\n \n", "cg/commongen.dev.tgt.txt": "a dog\nx\n"},
        ["raw"],
    ),
    Case(
        "commongen-dev-empty-reference-line",
        COMMONGEN,
        "{t}/cg/commongen.dev.tgt.txt:1: empty line",
        {**CG, **OLD_RAW, "cg/commongen.dev.tgt.txt": "\n"},
        ["raw"],
    ),
    # prep.kbert: the TSVs and the KG checked before data/, kg/ and mlm/ are replaced
    Case(
        "kbert-dev-row-short-of-a-column",
        KBERT + ["{t}/kb"],
        "{t}/kb/dev.tsv:3: 1 TAB-separated column(s), the header has 2",
        {**KB, **OLD_KB, "kb/dev.tsv": "label\ttext_a\n0\t很好\n1\n"},
        ["kbo"],
    ),
    Case(
        "kbert-kg-line-of-two-fields",
        KBERT + ["{t}/kb", "--kg", "{t}/kg.spo"],
        "{t}/kg.spo:2: expected subject<TAB>predicate<TAB>object, found 2 field(s)",
        {**KB, **OLD_KB, "kg.spo": "今天\t是\t好\n今天\t是\n"},
        ["kbo"],
    ),
    Case(
        "kbert-tags-shorter-than-tokens",
        KBERT + ["{t}/kbt", "--tagging"],
        "{t}/kbt/dev.tsv:2: 2 tokens but 1 tags",
        {**KBT, **OLD_KB, "kbt/dev.tsv": "text_a\tlabel\n今 天\tB-X\n"},
        ["kbo"],
    ),
    Case(
        "kbert-dev-tag-unseen-in-training",
        KBERT + ["{t}/kbt", "--tagging"],
        "{t}/kbt/dev.tsv:2: tag 'B-Y' is not among the training tags (B-X, I-X)",
        {**KBT, **OLD_KB, "kbt/dev.tsv": "text_a\tlabel\n今 天\tB-Y I-X\n"},
        ["kbo"],
    ),
    Case(
        "kbert-header-without-text-a",
        KBERT + ["{t}/kbt", "--tagging"],
        "{t}/kbt/train.tsv:1: header must name the columns 'label' and 'text_a'",
        {**KBT, **OLD_KB, "kbt/train.tsv": "text\tlabel\n今 天\tB-X I-X\n"},
        ["kbo"],
    ),
    Case(
        "kbert-kg-of-a-bom-and-blank-lines",
        KBERT + ["{t}/kb", "--kg", "{t}/kg.spo"],
        "{t}/kg.spo: no triples, only blank lines",
        {**KB, **OLD_KB, "kg.spo": b"\xef\xbb\xbf\n\n \t \n"},
        ["kbo"],
    ),
    # scripts/kbert_score.py: a prediction that is none of the task's labels is not counted as a wrong answer
    Case(
        "kbert-score-label-not-in-labels-txt",
        ["scripts/kbert_score.py", "--data", "{t}/data", "--pred", "{t}/pred", "--json-out", "{t}/scores.json"],
        "{t}/pred:2: label '2' is not among the labels of {t}/data/labels.txt (0, 1)",
        {"data/valid.tsv": "label\ttext_a\n0\t很好\n1\t不好\n", "data/labels.txt": "0\n1\n", "pred": "0\n2\n",
         **OLD_SCORES},  # fmt: skip
        ["scores.json"],
    ),
    Case(
        "kbert-score-tag-not-in-labels-txt",
        ["scripts/kbert_score.py", "--data", "{t}/data", "--pred", "{t}/pred", "--tagging"],
        "{t}/pred:1: tag 'B-Y' is not among the tags of {t}/data/labels.txt (B-X, I-X, O)",
        {"data/valid.tsv": "text_a\tlabel\n今 天\tB-X I-X\n", "data/labels.txt": "B-X\nI-X\nO\n", "pred": "B-Y O\n"},
    ),
    # prep.retrieval
    Case(
        "retrieval-corpus-missing",
        RETRIEVE + ["{t}/nope.txt"],
        "{t}/nope.txt: corpus file not found",
        {**RETR, **OLD_PROTO},
        ["proto.txt"],
    ),
    Case(
        "retrieval-corpus-keys-misaligned",
        RETRIEVE + ["{t}/c.txt", "--corpus-keys", "{t}/k.txt"],
        "{t}/k.txt:2: line-count mismatch",
        {**RETR, **OLD_PROTO, "k.txt": "dog run\n"},
        ["proto.txt"],
    ),
    # prep.webnlg: XML and triples
    Case(
        "webnlg-bad-xml-train",
        WEBNLG_ARGV,
        "{t}/wn/train/1triples/Airport.xml:4: XML parse error",
        {**WEBNLG, **PREVIOUS, "wn/train/1triples/Airport.xml": "<benchmark>\n<entries>\n<entry>\n</entries>\n"},
        KEEP_OUT,
    ),
    Case(
        "webnlg-bad-xml-in-test-leaves-no-mixed-folder",
        WEBNLG_ARGV,
        "{t}/wn/test/Airport.xml:2: XML parse error: mismatched tag",
        {**WEBNLG, **PREVIOUS, "wn/test/Airport.xml": "<benchmark>\n<entries></entry>\n"},
        KEEP_OUT,
    ),
    Case(
        "webnlg-folder-named-xml",
        WEBNLG_ARGV,
        "{t}/wn/dev/1triples/Zoo.xml: a folder, not an XML file",
        {**WEBNLG, **PREVIOUS, "wn/dev/1triples/Zoo.xml/x": "x"},
        KEEP_OUT,
    ),
    Case(
        "webnlg-two-part-triple",
        WEBNLG_ARGV,
        "{t}/wn/dev/1triples/Airport.xml:5: malformed triple",
        {**WEBNLG, **PREVIOUS, "wn/dev/1triples/Airport.xml": xml((["Aarhus | city served"], ["x"]))},
        KEEP_OUT,
    ),
    Case(
        "webnlg-empty-subject",
        WEBNLG_ARGV,
        "{t}/wn/train/1triples/Airport.xml:5: empty subject",
        {**WEBNLG, **PREVIOUS, "wn/train/1triples/Airport.xml": xml(([" _ | city served | Aarhus"], ["x"]))},
        KEEP_OUT,
    ),
    Case(
        "webnlg-entry-without-triples",
        WEBNLG_ARGV,
        "{t}/wn/dev/1triples/Airport.xml:3: entry Id0 has no <mtriple>",
        {**WEBNLG, **PREVIOUS, "wn/dev/1triples/Airport.xml": xml(([], ["x"]))},
        KEEP_OUT,
    ),
    Case(
        "webnlg-bad-utf8",
        WEBNLG_ARGV,
        "{t}/wn/train/1triples/Airport.xml:5: XML parse error",
        {**WEBNLG, **PREVIOUS, "wn/train/1triples/Airport.xml": GOOD.encode().replace(b"Aarhus |", b"Aar\xffhus |")},
        KEEP_OUT,
    ),
    Case(
        "webnlg-no-dev-files",
        WEBNLG_ARGV,
        "{t}/wn/dev: no */*triples/*.xml or *.xml files found",
        {"wn/train/1triples/Airport.xml": GOOD, "wn/dev/readme.txt": "x", **PREVIOUS},
        KEEP_OUT,
    ),
    Case(
        "webnlg-unknown-heldout-category",
        WEBNLG_ARGV[:-1] + ["Astronaut"],
        "{t}/wn/train: --heldout-categories ['Astronaut'] not among the train categories",
        {**WEBNLG, **PREVIOUS},
        KEEP_OUT,
    ),
    Case(
        "webnlg-file-in-place-of-out",
        WEBNLG_ARGV,
        "{t}/out: a file is in the way of the output folder",
        {**WEBNLG, "out": "a file\n"},
        ["out"],
    ),
    Case(
        "webnlg-file-in-place-of-out-parent",
        ["prep.webnlg", "--data", "{t}/wn", "--out", "{t}/block/out"],
        "{t}/block: cannot create the output folder",
        {**WEBNLG, "block": "a file\n"},
        ["block"],
    ),
    Case(
        "webnlg-out-where-nothing-can-be-written",
        ["prep.webnlg", "--data", "{t}/wn", "--out", "/proc/self/knowgen-out"],
        "/proc/self/knowgen-out: cannot write beside the output folder",
        WEBNLG,
    ),
    # prep.placeholders encode / encode-source / restore
    Case(
        "encode-train-line-mismatch",
        ENCODE + ["{t}/raw/train"],
        "{t}/raw/train.tgt:2: line-count mismatch",
        {**PAIRS, "raw/train.tgt": "a b\n", **OLD_ENC},
        ["enc"],
    ),
    Case(
        "encode-split-bad-utf8",
        ENCODE + ["{t}/raw/train", "{t}/raw/valid"],
        "{t}/raw/valid.src:2: not valid UTF-8",
        {**PAIRS, "raw/valid.src": b"a x\n\xff\n", "raw/valid.tgt": "a\nb\n", **OLD_ENC},
        ["enc"],
    ),
    Case(
        "encode-missing-split",
        ENCODE + ["{t}/raw/train", "{t}/raw/test"],
        "{t}/raw/test.src: input file not found",
        {**PAIRS, **OLD_ENC},
        ["enc"],
    ),
    Case(
        "encode-file-in-place-of-out-dir",
        ENCODE + ["{t}/raw/train"],
        "{t}/enc: a file is in the way of the output folder",
        {**PAIRS, "enc": "a file\n"},
        ["enc"],
    ),
    Case(
        "encode-source-dict-without-placeholders",
        ["prep.placeholders", "encode-source", "--dict", "{t}/dict.txt", "--input", "{t}/in.txt", "--out", "{t}/o"],
        "{t}/dict.txt: no <unk-N> placeholders",
        {"dict.txt": "a 5\nb 3\n", "in.txt": "a b\n", "o": "earlier\n"},
        ["o"],
    ),
    Case(
        "encode-source-dict-line-without-count",
        ["prep.placeholders", "encode-source", "--dict", "{t}/dict.txt", "--input", "{t}/in.txt", "--out", "{t}/o"],
        "{t}/dict.txt:2: expected 'WORD COUNT'",
        {"dict.txt": "a 5\nb\n<unk-0> 0\n", "in.txt": "a b\n", "o": "earlier\n"},
        ["o"],
    ),
    Case(
        "encode-source-input-bad-utf8",
        ["prep.placeholders", "encode-source", "--dict", "{t}/dict.txt", "--input", "{t}/in.txt", "--out", "{t}/o"],
        "{t}/in.txt:3: not valid UTF-8",
        {"dict.txt": DICT, "in.txt": b"a b\nb a\n\xc3\n", "o": "earlier\n"},
        ["o"],
    ),
    Case(
        "restore-id-beyond-source",
        ["prep.placeholders", "restore", "--gen", "{t}/gen", "--src", "{t}/src", "--out", "{t}/o"],
        "{t}/gen:3: hypothesis id 1 but",
        {"gen": GEN, "src": "x y\n", "o": "earlier\n"},
        ["o"],
    ),
    Case(
        "restore-id-not-a-number",
        ["prep.placeholders", "restore", "--gen", "{t}/gen", "--src", "{t}/src", "--out", "{t}/o"],
        "{t}/gen:2: expected a hypothesis id",
        {"gen": "S-0\tx\nH-a\t-0.1\tb\n", "src": "x y\n", "o": "earlier\n"},
        ["o"],
    ),
    Case(
        "restore-entmap-of-another-source",
        ["prep.placeholders", "restore", "--gen", "{t}/gen", "--src", "{t}/src", "--entmap", "{t}/m", "--out", "{t}/o"],
        "{t}/m: 1 lines but",
        {"gen": GEN, "src": "x y\nz\n", "m": '["A"]\n', "o": "earlier\n"},
        ["o"],
    ),
    Case(
        "restore-entmap-bad-json",
        ["prep.placeholders", "restore", "--gen", "{t}/gen", "--src", "{t}/src", "--entmap", "{t}/m", "--out", "{t}/o"],
        "{t}/m:2: not a JSON line",
        {"gen": GEN, "src": "x y\nz\n", "m": '["A"]\n["B"\n', "o": "earlier\n"},
        ["o"],
    ),
    Case(
        "restore-out-is-a-folder",
        ["prep.placeholders", "restore", "--gen", "{t}/gen", "--src", "{t}/src", "--out", "{t}/o"],
        "{t}/o: is a folder",
        {"gen": GEN, "src": "x y\nz\n", "o/keep": "earlier\n"},
        ["o"],
    ),
    # prep.entities delexicalize: the source and its map are written together or not at all
    Case(
        "delexicalize-line-without-markers",
        ["prep.entities", "delexicalize", "--input", "{t}/in", "--out", "{t}/o.src", "--entmap", "{t}/o.entmap"],
        "{t}/in:2: token 1 is 'Alan' where <S> was expected",
        {"in": LINEAR + "Alan Bean\n", "o.src": "earlier\n", "o.entmap": "[]\n"},
        ["o.src", "o.entmap"],
    ),
    Case(
        "delexicalize-empty-subject",
        ["prep.entities", "delexicalize", "--input", "{t}/in", "--out", "{t}/o.src", "--entmap", "{t}/o.entmap"],
        "{t}/in:1: empty subject after <S>",
        {"in": "<S> <P> birth place <O> Texas\n", "o.src": "earlier\n", "o.entmap": "[]\n"},
        ["o.src", "o.entmap"],
    ),
    Case(
        "delexicalize-unfinished-triple",
        ["prep.entities", "delexicalize", "--input", "{t}/in", "--out", "{t}/o.src", "--entmap", "{t}/o.entmap"],
        "{t}/in:3: the last triple ends before its <O> part",
        {"in": LINEAR * 2 + "<S> Alan <P> born\n", "o.src": "earlier\n", "o.entmap": "[]\n"},
        ["o.src", "o.entmap"],
    ),
    Case(
        "delexicalize-empty-line",
        ["prep.entities", "delexicalize", "--input", "{t}/in", "--out", "{t}/o.src", "--entmap", "{t}/o.entmap"],
        "{t}/in:2: empty source line",
        {"in": LINEAR + "\n", "o.src": "earlier\n", "o.entmap": "[]\n"},
        ["o.src", "o.entmap"],
    ),
    # prep.constraints
    Case(
        "constraints-entities-line-without-entity",
        ["prep.constraints", "entities", "--src", "{t}/src", "--out", "{t}/cons"],
        "{t}/src:2: no <S>/<O> entity in this line",
        {"src": LINEAR + "just words\n", "cons": "earlier\n"},
        ["cons"],
    ),
    Case(
        "constraints-prototype-without-sep",
        ["prep.constraints", "concepts", "--form", "prototype", "--src", "{t}/src", "--out", "{t}/cons"],
        "{t}/src:1: no <sep> in this line",
        {"src": "dog run\n", "cons": "earlier\n"},
        ["cons"],
    ),
    Case(
        "constraints-prototypes-misaligned",
        ["prep.constraints", "concepts", "--form", "prototype", "--src", "{t}/src", "--prototypes", "{t}/p", "--out",
         "{t}/cons"],
        "{t}/p:2: line-count mismatch",
        {"src": "dog run\ncat sit\n", "p": "dog run <sep> a dog runs\n", "cons": "earlier\n"},
        ["cons"],
    ),
    Case(
        "constraints-prototypes-of-another-split",
        ["prep.constraints", "concepts", "--form", "prototype", "--src", "{t}/src", "--prototypes", "{t}/p", "--out",
         "{t}/cons"],
        "{t}/p:1: concepts ['cat', 'sit'] differ",
        {"src": "dog run\n", "p": "cat sit <sep> a cat sits\n", "cons": "earlier\n"},
        ["cons"],
    ),
    # scripts/evaluate.py
    Case(
        "evaluate-reference-line-empty-in-every-file",
        EVAL + ["{t}/ref0.txt", "{t}/ref1.txt"],
        "{t}/ref0.txt:3: no reference for this input",
        {**REFS, "ref0.txt": "a cat sits .\na dog runs .\n\n", "ref1.txt": "a cat .\na dog .\n \n", **OLD_SCORES},
        ["scores.json"],
    ),
    Case(
        "evaluate-jsonl-all-references-blank",
        EVAL + ["{t}/refs.jsonl"],
        "{t}/refs.jsonl:2: no reference for this input",
        {**REFS, "refs.jsonl": '["a cat"]\n["", " "]\n["a bird"]\n', **OLD_SCORES},
        ["scores.json"],
    ),
    Case(
        "evaluate-jsonl-not-json",
        EVAL + ["{t}/refs.jsonl"],
        "{t}/refs.jsonl:2: not a JSON line",
        {**REFS, "refs.jsonl": '["a cat"]\n[a dog]\n["a bird"]\n', **OLD_SCORES},
        ["scores.json"],
    ),
    Case(
        "evaluate-fewer-hypotheses",
        EVAL + ["{t}/ref0.txt"],
        "{t}/hyp.txt:3: 2 inputs here but 3",
        {**REFS, "hyp.txt": "a cat .\na dog .\n", **OLD_SCORES},
        ["scores.json"],
    ),
    Case(
        "evaluate-reference-files-of-other-lengths",
        EVAL + ["{t}/ref0.txt", "{t}/ref1.txt"],
        "{t}/ref1.txt:3: line-count mismatch",
        {**REFS, "ref1.txt": "a .\nb .\n", **OLD_SCORES},
        ["scores.json"],
    ),
    Case(
        "evaluate-source-of-other-length",
        EVAL + ["{t}/ref0.txt", "--src", "{t}/src"],
        "{t}/src:2: 1 inputs here but 3",
        {**REFS, "src": "cat sit\n", **OLD_SCORES},
        ["scores.json"],
    ),
    Case(
        "evaluate-generate-output-missing-an-id",
        EVAL + ["{t}/ref0.txt"],
        "{t}/hyp.txt: fairseq-generate output lacks hypotheses for ids [1]",
        {**REFS, "hyp.txt": "H-0\t-1\ta cat\nH-2\t-1\ta bird\n", **OLD_SCORES},
        ["scores.json"],
    ),
    Case(
        "evaluate-hypotheses-bad-utf8",
        EVAL + ["{t}/ref0.txt"],
        "{t}/hyp.txt:2: not valid UTF-8",
        {**REFS, "hyp.txt": b"a cat .\n\xe9t\xe9\na bird .\n", **OLD_SCORES},
        ["scores.json"],
    ),
    Case(
        "evaluate-json-out-under-a-file",
        ["scripts/evaluate.py", "--hyp", "{t}/hyp.txt", "--no-cider", "--json-out", "{t}/block/s.json", "--refs",
         "{t}/ref0.txt"],
        "{t}/block: cannot create the output folder",
        {**REFS, "block": "a file\n"},
        ["block"],
    ),
    # checkpoint_average (and, through checkpoint_compat, the loader fairseq's commands use)
    Case(
        "average-truncated-checkpoint",
        AVERAGE,
        "{t}/ck/checkpoint_last.pt: cannot be read: truncated",
        OLD_AVG,
        ["avg.pt"],
        truncated,
    ),
    Case(
        "average-text-file-as-checkpoint",
        AVERAGE,
        "{t}/ck/checkpoint_last.pt: cannot be read: not a torch checkpoint",
        OLD_AVG,
        ["avg.pt"],
        checkpoints(b"this is no checkpoint\n"),
    ),
    Case(
        "average-refused-global",
        AVERAGE,
        "{t}/ck/checkpoint_last.pt: refused: it names the Python object posix.system",
        OLD_AVG,
        ["avg.pt"],
        evil,
    ),
    Case(
        "average-empty-checkpoint",
        AVERAGE,
        "{t}/ck/checkpoint_last.pt: empty file, not a checkpoint",
        OLD_AVG,
        ["avg.pt"],
        checkpoints(b""),
    ),
    Case("average-missing-folder", AVERAGE, "{t}/ck: no such folder", OLD_AVG, ["avg.pt"]),
    Case(
        "average-update-interval-checkpoints-too-few",
        AVERAGE,
        "{t}/ck: 2 checkpoints with distinct update counts needed, found 1: checkpoint_1_100.pt (100 updates)",
        OLD_AVG,
        ["avg.pt"],
        lambda t: os.makedirs(f"{t}/ck") or torch.save(
            {"model": {"w": torch.ones(2)}, "optimizer_history": [{"num_updates": 100}]}, f"{t}/ck/checkpoint_1_100.pt"
        ),
    ),
    # fairseq's own commands read checkpoints through checkpoint_compat's checks
    Case(
        "fairseq-generate-truncated-checkpoint",
        ["fairseq-generate", "{t}/data", "--user-dir", "fairseq_knowgen", "-s", "src", "-t", "tgt", "--cpu",
         "--path", "{t}/ck/checkpoint_last.pt"],
        "{t}/ck/checkpoint_last.pt: cannot be read: truncated",
        DICTS,
        setup=truncated,
    ),
    Case(
        "fairseq-generate-refused-global",
        ["fairseq-generate", "{t}/data", "--user-dir", "fairseq_knowgen", "-s", "src", "-t", "tgt", "--cpu",
         "--path", "{t}/ck/checkpoint_last.pt"],
        "{t}/ck/checkpoint_last.pt: refused: it names the Python object posix.system",
        DICTS,
        setup=evil,
    ),
    Case(
        "fairseq-generate-missing-checkpoint",
        ["fairseq-generate", "{t}/data", "--user-dir", "fairseq_knowgen", "-s", "src", "-t", "tgt", "--cpu",
         "--path", "{t}/none.pt"],
        "{t}/none.pt: checkpoint file not found",
        DICTS,
    ),
    # convert.hf_bert / hf_bart / hf_gpt2: a damaged download names the file and says to download it again; a
    # vocabulary of another model names both sizes; the earlier OUT stays byte-identical
    Case(
        "hf-bert-safetensors-cut-short",
        HF_BERT,
        "{t}/hf/model.safetensors: not a complete safetensors file (incomplete metadata, file not fully covered): "
        "re-download model.safetensors",
        OLD_CONVERTED,
        ["out"],
        hf_copy(minilm, cut={"model.safetensors": 1_000_000}),
    ),
    Case(
        "hf-bert-pytorch-bin-cut-short",
        HF_BERT,
        "{t}/hf/pytorch_model.bin: cannot be read: truncated, or not a torch checkpoint (a zip archive without its "
        "end): re-download pytorch_model.bin",
        OLD_CONVERTED,
        ["out"],
        hf_copy(tiny_bert_bin, cut={"pytorch_model.bin": 20_000}),
    ),
    Case(
        "hf-bert-tokenizer-json-cut-short",
        HF_BERT,
        "{t}/hf/tokenizer.json:1: not valid JSON (Unterminated string starting at: column",
        OLD_CONVERTED,
        ["out"],
        hf_copy(minilm, cut={"tokenizer.json": 1000}),
    ),
    Case(
        "hf-bert-config-json-cut-short",
        HF_BERT,
        "{t}/hf/config.json:",
        OLD_CONVERTED,
        ["out"],
        hf_copy(minilm, cut={"config.json": 100}),
    ),
    Case(
        "hf-bert-chinese-vocab-beside-an-english-model",
        HF_BERT,
        lambda t: f"{t}/hf/vocab.txt: {lines_of(chinese_vocab())} tokens for the {embedding_rows(minilm())} embedding "
        "rows of the model",
        OLD_CONVERTED,
        ["out"],
        hf_copy(minilm, drop=["tokenizer.json"], put={"vocab.txt": read(chinese_vocab)}),
    ),
    Case(
        "hf-bert-vocab-longer-than-the-embedding",
        HF_BERT,
        lambda t: f"{t}/hf/tokenizer.json: {embedding_rows(minilm()) + 2} tokens for the {embedding_rows(minilm())} "
        "embedding rows of the model",
        OLD_CONVERTED,
        ["out"],
        hf_copy(minilm, put={"tokenizer.json": more_wordpiece_tokens}),
    ),
    Case(
        "hf-bert-config-of-other-sizes-than-the-weights",
        HF_BERT,
        # each layer's intermediate.dense weight and bias and output.dense weight
        lambda t: f"{t}/hf: {3 * json.load(open(os.path.join(minilm(), 'config.json')))['num_hidden_layers']} "
        "tensor(s) of other shapes than config.json's: encoder.layer.0.intermediate.dense.bias",
        OLD_CONVERTED,
        ["out"],
        hf_copy(minilm, put={"config.json": minilm_config(intermediate_size=1000)}),
    ),
    Case(
        "hf-bert-config-with-a-size-that-is-no-number",
        HF_BERT,
        "{t}/hf/config.json: not a BERT configuration (",
        OLD_CONVERTED,
        ["out"],
        hf_copy(minilm, put={"config.json": minilm_config(vocab_size="many")}),
    ),
    Case(
        "hf-bert-no-weights",
        HF_BERT,
        "{t}/hf: no weights: neither model.safetensors nor pytorch_model.bin",
        OLD_CONVERTED,
        ["out"],
        hf_copy(minilm, drop=WEIGHTS),
    ),
    Case(
        "hf-bart-safetensors-cut-short",
        HF_BART,
        "{t}/hf/model.safetensors: not a complete safetensors file",
        OLD_CONVERTED,
        ["out"],
        hf_copy(tiny_bart, cut={"model.safetensors": -1000}),
    ),
    Case(
        "hf-bart-vocab-json-cut-short",
        HF_BART,
        "{t}/hf/vocab.json:1: " + NOT_JSON,
        OLD_CONVERTED,
        ["out"],
        hf_copy(tiny_bart, cut={"vocab.json": 5000}),
    ),
    Case(
        "hf-bart-tokenizer-json-cut-short",
        HF_BART,
        "{t}/hf/tokenizer.json:",
        OLD_CONVERTED,
        ["out"],
        hf_copy(tiny_bart, cut={"tokenizer.json": 5000}, drop=["vocab.json", "merges.txt"]),
    ),
    Case(
        "hf-bart-config-json-cut-short",
        HF_BART,
        "{t}/hf/config.json:",
        OLD_CONVERTED,
        ["out"],
        hf_copy(tiny_bart, cut={"config.json": 200}),
    ),
    Case(
        "hf-bart-gpt2-vocab-json-beside-bart",
        HF_BART,
        lambda t: f"{t}/hf/vocab.json: {len(json.load(open(gpt2_bpe()[0])))} tokens for the "
        f"{embedding_rows(tiny_bart())} embedding rows of the model",
        OLD_CONVERTED,
        ["out"],
        hf_copy(tiny_bart, put={"vocab.json": lambda: open(gpt2_bpe()[0], "rb").read()}),
    ),
    Case(
        "hf-gpt2-pytorch-bin-cut-short",
        HF_GPT2,
        "{t}/hf/pytorch_model.bin: cannot be read: truncated",
        OLD_LM,
        ["out"],
        hf_copy(tiny_gpt2, cut={"pytorch_model.bin": -100}),
    ),
    Case(
        "hf-gpt2-vocab-json-cut-short",
        HF_GPT2,
        "{t}/hf/vocab.json:1: " + NOT_JSON,
        OLD_LM,
        ["out"],
        hf_copy(tiny_gpt2, cut={"vocab.json": 5000}),
    ),
    Case(
        "hf-gpt2-tokenizer-json-cut-short",
        HF_GPT2,
        "{t}/hf/tokenizer.json:1: " + NOT_JSON,
        OLD_LM,
        ["out"],
        hf_copy(tiny_gpt2, drop=["vocab.json", "merges.txt"], put={"tokenizer.json": lambda: '{"model": {"type": '}),
    ),
    Case(
        "hf-gpt2-config-json-not-json",
        HF_GPT2,
        "{t}/hf/config.json:",
        OLD_LM,
        ["out"],
        hf_copy(tiny_gpt2, cut={"config.json": 50}),
    ),
    Case(
        "hf-gpt2-fewer-bpe-tokens-than-rows",
        HF_GPT2,
        lambda t: f"{t}/hf/vocab.json: {embedding_rows(tiny_gpt2()) - 1000} tokens for the "
        f"{embedding_rows(tiny_gpt2())} embedding rows of the model",
        OLD_LM,
        ["out"],
        hf_copy(tiny_gpt2, put={"vocab.json": fewer_bpe_tokens}),
    ),
    Case(
        "hf-gpt2-merges-not-utf8",
        HF_GPT2,
        "{t}/hf/merges.txt:3: not valid UTF-8",
        OLD_LM,
        ["out"],
        hf_copy(tiny_gpt2, put={"merges.txt": lambda: b"#version: 0.2\nG t\n\xff\xfe h\n"}),
    ),
    # the checkpoint tools: a checkpoint cut short, one that weights-only loading refuses; OUT kept
    Case(
        "fairseq-legacy-checkpoint-cut-short",
        ["convert.fairseq_legacy", "{t}/ck/model.pt", "{t}/new.pt"],
        "{t}/ck/model.pt: cannot be read: truncated, or not a torch checkpoint (a zip archive without its end): "
        "re-download model.pt",
        {"new.pt": b"an earlier conversion"},
        ["new.pt"],
        fairseq_checkpoint(b"half"),
    ),
    Case(
        "fairseq-legacy-refused-global",
        ["convert.fairseq_legacy", "{t}/ck/model.pt", "{t}/new.pt"],
        "{t}/ck/model.pt: refused: it names the Python object posix.system",
        {"new.pt": b"an earlier conversion"},
        ["new.pt"],
        fairseq_checkpoint(evil=True),
    ),
    Case(
        "extend-dictionary-checkpoint-cut-short",
        ["convert.extend_dictionary", "{t}/ck", "{t}/task/dict.txt", "--add", "<sep>"],
        "{t}/ck/model.pt: cannot be read: truncated",
        {"task/dict.txt": "a 1\n"},
        ["task"],
        fairseq_checkpoint(b"half"),
    ),
    Case(
        "extend-dictionary-refused-global",
        ["convert.extend_dictionary", "{t}/ck", "{t}/task/dict.txt", "--add", "<sep>"],
        "{t}/ck/model.pt: refused: it names the Python object posix.system",
        {"task/dict.txt": "a 1\n"},
        ["task"],
        fairseq_checkpoint(evil=True),
    ),
    # fairseq-interactive with EKI: one error per bad line, the other lines decoded, exit status 2 at the end
    Case(
        "interactive-eki-line-too-long",
        INTERACTIVE,
        REFUSED_ONE,
        setup=eki_input(GOOD_EKI, "dog <sep> " + " ".join(["the dog runs"] * 3000), GOOD_EKI),
        error="{t}/in.txt:2: 9003 tokens, more than the model's 1024 positions: left out",
        decoded=["H-0\t", "H-2\t"],
    ),
    Case(
        "interactive-eki-two-separators",
        INTERACTIVE,
        REFUSED_ONE,
        setup=eki_input(GOOD_EKI, "dog cat <sep> the dog <sep> a cat", GOOD_EKI),
        error="{t}/in.txt:2: 2 '<sep>' in the line: expected 'concepts <sep> prototype', one '<sep>'",
        decoded=["H-0\t", "H-2\t"],
    ),
    Case(
        "interactive-eki-separator-alone",
        INTERACTIVE,
        REFUSED_ONE,
        setup=eki_input(GOOD_EKI, "<sep>", GOOD_EKI),
        error="{t}/in.txt:2: no concepts before '<sep>'",
        decoded=["H-0\t", "H-2\t"],
    ),
    Case(
        "interactive-eki-not-utf8",
        INTERACTIVE,
        REFUSED_ONE,
        setup=eki_input(GOOD_EKI, b"dog \xff cat <sep> the dog", GOOD_EKI),
        error="{t}/in.txt:2: not valid UTF-8 (invalid start byte)",
        decoded=["H-0\t", "H-2\t"],
    ),
    Case(
        "interactive-eki-empty-line",
        INTERACTIVE,
        REFUSED_ONE,
        setup=eki_input(GOOD_EKI, "  ", GOOD_EKI),
        error="{t}/in.txt:2: empty line",
        decoded=["H-0\t", "H-2\t"],
    ),
    Case(
        "interactive-eki-longer-than-max-tokens",
        INTERACTIVE + ["--max-tokens", "20", "--buffer-size", "3"],
        REFUSED_ONE,
        setup=eki_input(GOOD_EKI, "dog <sep> " + " ".join(["the dog runs"] * 10), GOOD_EKI),
        error="{t}/in.txt:2: 33 tokens, more than --max-tokens 20: left out",
        decoded=["H-0\t", "H-2\t"],
    ),
    Case(
        "interactive-eki-input-not-found",
        INTERACTIVE[:-1] + ["{t}/none.txt"],
        "{t}/none.txt: cannot be read (No such file or directory)",
        setup=eki_input(GOOD_EKI),
    ),
    Case(
        "fairseq-generate-eki-without-a-test-split",
        ["fairseq-generate", "{t}/eki/data", "--path", "{t}/eki/checkpoint.pt", "--user-dir", "fairseq_knowgen",
         "--task", "eki_generation", "-s", "src", "-t", "tgt", "--cpu"],  # fmt: skip
        "{t}/eki/data: no 'test' split (binarized: none); fairseq-generate decodes --gen-subset, test unless given",
        setup=eki_input(),
    ),
    # the recipes' stages
    Case(
        "recipe-commongen-stage-4-after-a-killed-stage-3",
        COMMONGEN_RECIPE,
        "{t}/out/bpe/valid.src is missing: stage 3 (BPE) writes it and did not finish (killed, failed or not run); "
        + RERUN.format(n=3),
        {**RAW_CG, **BPE_CG_KILLED, **OLD_BIN},
        ["out/bin", "out/bpe"],
        env={"STAGE": "4", "STOP_STAGE": "4"},
    ),
    Case(
        "recipe-commongen-stage-5-eki-ood-without-out-of-domain-prototypes",
        COMMONGEN_RECIPE,
        "{t}/out/raw/train.eki-ood.src is missing: stage 2 (retrieve prototypes; out-of-domain ones only from "
        "CORPUS_OOD=",
        RAW_CG,
        env={"STAGE": "5", "STOP_STAGE": "5", "INPUT": "eki-ood"},
    ),
    Case(
        "recipe-commongen-stage-5-before-stage-4",
        COMMONGEN_RECIPE,
        "{t}/out/bin-eki/dict.src.txt is missing: stage 4 (binarize) writes it",
        RAW_CG,
        env={"STAGE": "5", "STOP_STAGE": "5", "INPUT": "eki"},
    ),
    Case(
        "recipe-commongen-stage-7-before-stage-6",
        COMMONGEN_RECIPE,
        "{t}/out/runs/transformer/valid.out is missing: stage 6 (fairseq-generate) writes it",
        {**RAW_CG, "out/raw/valid.refs.jsonl": '["a dog runs"]\n'},
        env={"STAGE": "7", "STOP_STAGE": "7"},
    ),
    Case(
        "recipe-webnlg-stage-3-after-a-killed-stage-2",
        ["examples/webnlg/run.sh", "{t}/data", "{t}/out"],
        "{t}/out/bpe/valid.src is missing: stage 2 (encode) writes it",
        {"out/raw/eval_splits": "valid\n", "out/bpe/train.src": "a\n", "out/bpe/train.tgt": "a\n",
         "out/bpe/dict.txt": "a 1\n"},  # fmt: skip
        env={"STAGE": "3", "STOP_STAGE": "3", "HELDOUT": ""},
    ),
    Case(
        "recipe-kbert-stage-4-before-stage-3",
        ["examples/kbert/run.sh", "book_review", "{t}/data", "{t}/out"],
        "{t}/out/runs/kbert/checkpoints/checkpoint_best.pt is missing: stage 3 (fine-tune) writes it",
        {"out/data/eval_splits": "valid\n"},
        env={"STAGE": "4", "STOP_STAGE": "4"},
    ),
    Case(
        "recipe-cocon-stage-3-before-stage-2",
        ["examples/cocon/run.sh", "{t}/data", "{t}/out"],
        "{t}/out/bin/lm/dict.txt is missing: stage 2 (BPE and binarize) writes it",
        env={"STAGE": "3", "STOP_STAGE": "3"},
    ),
    # demo_data
    Case(
        "demo-data-file-in-place-of-out",
        ["demo_data", "--out", "{t}/out", "--train", "3", "--valid", "2", "--test", "2"],
        "{t}/out: a file is in the way of the output folder",
        {"out": "a file\n"},
        ["out"],
    ),
]


def _write(folder: str, files: Files):
    for rel, content in files.items():
        path = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(content if isinstance(content, bytes) else content.encode())


def _snapshot(folder: str, rels: List[str]) -> Dict[str, bytes]:
    """The bytes of every file at or below each of ``rels``."""
    out = {}
    for rel in rels:
        path = os.path.join(folder, rel)
        if os.path.isfile(path):
            out[rel] = open(path, "rb").read()
        for d, _, names in os.walk(path):
            for n in names:
                p = os.path.join(d, n)
                out[os.path.relpath(p, folder)] = open(p, "rb").read()
    return out


def _run(argv: List[str], env: Optional[Dict[str, str]] = None):
    """(exit status, stdout, stderr) of one command line (a recipe with the settings ``env``)."""
    tool, args = argv[0], argv[1:]
    if tool.endswith(".sh"):
        import subprocess

        from conftest import ROOT

        proc = subprocess.run(["bash", tool, *args], cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        return proc.returncode, proc.stdout, proc.stderr
    if tool == "fairseq-interactive":  # in this process: seconds of imports saved per row
        return _run_fairseq_cli("interactive", args)
    if tool.startswith("fairseq-") or tool.startswith("scripts/") and not tool.endswith("evaluate.py"):
        proc = run_cli(tool, *args, check=False)
        return proc.returncode, proc.stdout, proc.stderr
    if tool == "scripts/evaluate.py":
        tool = "evaluation.cli"
    main = importlib.import_module(f"fairseq_knowgen.{tool}").main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_entry(lambda: main(args)) or 0
        except SystemExit as e:
            code = e.code
        except Exception:  # a traceback: the case fails below
            import traceback

            traceback.print_exc(file=err)
            code = "traceback"
    return code, out.getvalue(), err.getvalue()


def _run_fairseq_cli(name: str, args: List[str]):
    """(exit status, stdout, stderr) of ``fairseq_cli.NAME.cli_main`` run in this process with ``args``."""
    import logging
    import sys

    module = importlib.import_module(f"fairseq_cli.{name}")
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)  # fairseq logs through the root logger's handler, made at import
    saved, code = sys.argv, 0
    sys.argv = [f"fairseq-{name}", *args]
    logging.getLogger().addHandler(handler)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                module.cli_main()
            except SystemExit as e:
                code = e.code
            except Exception:  # a traceback: the case fails below
                import traceback

                traceback.print_exc(file=err)
                code = "traceback"
    finally:
        sys.argv = saved
        logging.getLogger().removeHandler(handler)
    return code or 0, out.getvalue(), err.getvalue()


def test_the_table_is_large_enough():
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, tmp_path):
    t = str(tmp_path)
    _write(t, case.files)
    if case.setup:
        case.setup(t)
    before = _snapshot(t, case.keep)
    code, out, err = _run([a.replace("{t}", t) for a in case.argv], case.env)
    assert "Traceback" not in out + err, err
    assert code == case.code, (code, err[-2000:])
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), err
    where = case.where(t) if callable(case.where) else case.where.replace("{t}", t)
    assert where in lines[-1], lines[-1]
    assert case.error.replace("{t}", t) in "\n".join(lines[:-1]), err
    assert all(x in out for x in case.decoded), out
    assert _snapshot(t, case.keep) == before
    left = [os.path.join(d, n) for d, dirs, names in os.walk(t) for n in dirs + names if n.startswith(".tmp-")]
    assert not left


def test_a_bom_and_crlf_are_read_as_plain_text(tmp_path):
    """A UTF-8 byte-order mark and CRLF line ends change nothing: ``placeholders encode`` writes the same
    bytes as from the plain files (a BOM kept made the first word '\\ufeffalan', a word of its own)."""
    plain = {"train.src": "alan bean flew\nalan shepard flew\n", "train.tgt": "alan flew\nalan flew too\n"}
    crlf = {k: ("\ufeff" + v).replace("\n", "\r\n").encode() for k, v in plain.items()}
    written = []
    for name, files in (("plain", plain), ("bom", crlf)):
        d = f"{tmp_path}/{name}"
        _write(d, files)
        argv = ["prep.placeholders", "encode", "--train-prefix", f"{d}/train", "--splits", f"{d}/train",
                "--out-dir", f"{d}/enc", "--min-count", "1", "--min-source-df", "2"]
        code, _, err = _run(argv)
        assert code == 0, err
        written.append({p: open(f"{d}/enc/{p}", "rb").read() for p in sorted(os.listdir(f"{d}/enc"))})
    assert written[0] == written[1] and b"alan" in written[0]["dict.txt"]


def test_the_harness_sees_a_traceback(tmp_path, monkeypatch):
    """The harness itself: an entry point that raises is caught as a traceback, not passed."""
    from fairseq_knowgen.prep import constraints

    def boom(argv):
        raise TypeError("a bug")

    monkeypatch.setattr(constraints, "main", boom)
    code, _, err = _run(["prep.constraints"])
    assert code == "traceback" and "Traceback" in err and re.search("TypeError: a bug", err)
