"""fairseq's own pointer-generator (``transformer_pointer_generator``), the copy model's peer: registered by
``--user-dir fairseq_knowgen``, trained by the WebNLG recipe with the ``--source-position-markers`` its
dictionary needs, its ``<unk-N>`` / ``<ent-K>`` outputs restored by stage 5, and measurable by
``scripts/benchmark.py --against``."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, preprocess, run_cli
from test_recipes import run_recipe, webnlg_data  # noqa: F401  (webnlg_data: the recipes' tiny WebNLG fixture)

from fairseq_knowgen.prep import position_markers
from fairseq_knowgen.textio import DataError

PG_SRC = os.path.join(os.path.dirname(__import__("fairseq").__file__), "examples", "pointer_generator")


# --- registration ---------------------------------------------------------------------------------------


def test_user_dir_registers_fairseqs_unchanged_model():
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

    import fairseq_knowgen  # noqa: F401

    model = MODEL_REGISTRY["transformer_pointer_generator"]
    assert model.__module__ == "fairseq.examples.pointer_generator.pointer_generator_src.transformer_pg"
    assert model.__name__ == "TransformerPointerGeneratorModel"
    assert ARCH_MODEL_REGISTRY["transformer_pointer_generator"] is model


def test_fairseqs_own_user_dir_first_is_no_duplicate_registration():
    # a process that imported fairseq's pointer_generator_src (its --user-dir) before ours must not fail
    code = (
        "import argparse, sys; from fairseq.utils import import_user_module; "
        f"import_user_module(argparse.Namespace(user_dir={os.path.join(PG_SRC, 'pointer_generator_src')!r})); "
        "import fairseq_knowgen; from fairseq.models import MODEL_REGISTRY; "
        "print(MODEL_REGISTRY['transformer_pointer_generator'].__module__)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "pointer_generator_src.transformer_pg"


# --- the markers that end the dictionary ----------------------------------------------------------------


def write_dict(path, words):
    path.write_text("".join(f"{w} 1\n" for w in words))
    return path


@pytest.mark.parametrize(
    "words,k",
    [
        (["the", "<S>", "<ent-0>", "<unk-0>", "<unk-1>", "<unk-2>"], 3),
        (["the", "<S>", "<unk>", "<ent-0>"], 0),  # BPE: no markers; <unk> itself is no marker
        (["<unk-1>", "<unk-0>"], 2),  # only markers, in any order
    ],
)
def test_count_is_the_markers_that_end_the_dictionary(tmp_path, words, k):
    assert position_markers.count(str(write_dict(tmp_path / "dict.src.txt", words))) == k


def test_a_marker_before_a_word_names_its_line(tmp_path):
    # fairseq-preprocess pads a dictionary it builds with madeupword0000..: those would be taken for markers
    path = write_dict(tmp_path / "dict.src.txt", ["the", "<unk-0>", "<unk-1>", "madeupword0000"])
    with pytest.raises(DataError, match=r"dict.src.txt:2: <unk-0> comes before the word 'madeupword0000'"):
        position_markers.count(str(path))
    proc = run_cli("-m", "fairseq_knowgen.prep.position_markers", tmp_path, check=False)
    assert proc.returncode == 2 and "dict.src.txt:2:" in proc.stderr


# --- the WebNLG recipe ----------------------------------------------------------------------------------


# every placeholder of the source once per hypothesis, whatever the model's weights (see peer_run)
ONCE = r"<(ent|unk)-\d+>|<[SPO]>"


@pytest.fixture(scope="module")
def peer_run(webnlg_data, tmp_path_factory):  # noqa: F811
    """Stages 1-5 of the WebNLG recipe (word level, entity placeholders; train and dev only) with the peer.

    Its switch is forced to copying (``--force-generation 0``: P(w) is the attention on w), and stage 5
    decodes with at least 7 tokens (``--min-len 7``) each at most once (``--at-most-once``): every source
    here is ``<S> <ent-0> <P> birth place <O> <ent-1>``, 7 distinct tokens (``birth place``: ``<unk-3>
    <unk-4>``, words of one distinct delexicalized source only), so any beam of a 3-update model writes
    them all, in some order, before the EOS it can copy (any other token has probability 1e-10)."""
    data = tmp_path_factory.mktemp("pgdata")
    for split in ("train", "dev"):  # no test/: valid is the one split decoded
        os.symlink(webnlg_data / split, data / split)
    out = tmp_path_factory.mktemp("pg") / "out"
    env = dict(HELDOUT="", NAME="fairseq-pg", ARCH="transformer_pointer_generator", ARCH_ARGS="--force-generation 0")
    env.update(DECODE_ARGS=f"--min-len 7 --at-most-once {ONCE}", DECODE_NAME="all")
    run_recipe("examples/webnlg/run.sh", data, out, STOP_STAGE="5", **env)
    return out


def test_recipe_trains_the_peer_with_the_markers_of_its_dictionary(peer_run):
    lines = (peer_run / "bin" / "dict.src.txt").read_text().splitlines()
    markers = [n for n, line in enumerate(lines) if line.startswith("<unk-")]
    k = len(markers)
    assert k == 200 and markers == list(range(len(lines) - k, len(lines)))  # stage 2's --max-positions, at the end
    state = torch.load(peer_run / "runs" / "fairseq-pg" / "checkpoints" / "checkpoint_best.pt", weights_only=False)
    assert state["cfg"]["model"].source_position_markers == k
    assert state["cfg"]["model"].force_generation == 0  # the user's ARCH_ARGS kept beside the recipe's flag
    # fairseq's Dictionary: 4 specials, then the file's entries; the markers are the rows the model lacks
    assert state["model"]["encoder.embed_tokens.weight"].size(0) == 4 + len(lines) - k


def hypotheses(path):
    out = {}
    for line in path.read_text().splitlines():
        if line.startswith("H-"):
            i, _, text = line[2:].split("\t", 2)
            out[int(i)] = text
    return out


def test_stage5_restores_the_peers_placeholders(peer_run):
    run = peer_run / "runs" / "fairseq-pg"
    gen, restored = hypotheses(run / "valid.all.gen"), hypotheses(run / "valid.all.out")
    raw_src = (peer_run / "raw" / "valid.src").read_text().splitlines()
    encoded_src = (peer_run / "bpe" / "valid.src").read_text().splitlines()
    entmaps = [json.loads(x) for x in (peer_run / "raw" / "valid.entmap").read_text().splitlines()]
    assert sorted(gen) == sorted(restored) == list(range(len(raw_src))) and len(raw_src) == 6
    for i, hyp in gen.items():
        # the copies of the peer: the encoded source in some order, <unk-3> <unk-4> <ent-0> <ent-1> included
        assert sorted(hyp.split()) == sorted(encoded_src[i].split()), (i, hyp)
        assert {"<unk-3>", "<unk-4>", "<ent-0>", "<ent-1>"} <= set(hyp.split())
        expected = []
        for w in hyp.split():
            if w.startswith("<unk-"):
                w = raw_src[i].split()[int(w[5:-1])]  # source word N, in the source with <ent-K>
            if w.startswith("<ent-"):
                w = entmaps[i][int(w[5:-1])]
            expected.append(w)
        assert restored[i] == " ".join(expected)
        assert "birth" in restored[i] and all(e in restored[i] for e in entmaps[i])


# --- benchmark ------------------------------------------------------------------------------------------


def test_benchmark_measures_the_copy_model_against_the_peer(tmp_path):
    # a dictionary of `placeholders encode` (markers at the end): the peer reads its K from the data
    raw = tmp_path / "raw"
    raw.mkdir()
    src = [f"<S> name{i} <P> born <O> city{i % 3}" for i in range(12)]
    tgt = [f"name{i} was born in city{i % 3} ." for i in range(12)]
    for split in ("train", "valid"):
        (raw / f"{split}.src").write_text("\n".join(src) + "\n")
        (raw / f"{split}.tgt").write_text("\n".join(tgt) + "\n")
    run_cli(
        "-m",
        "fairseq_knowgen.prep.placeholders",
        "encode",
        "--train-prefix",
        raw / "train",
        "--splits",
        raw / "train",
        raw / "valid",
        "--out-dir",
        tmp_path / "text",
        "--max-positions",
        "12",
    )
    preprocess(tmp_path / "text", tmp_path / "bin", "train", "valid", dictionary=tmp_path / "text" / "dict.txt")
    args = ["--updates", "1", "--gen-sents", "1", "--beam", "2", "--gen-len", "3", "--max-tokens", "200"]
    args += ["--layers", "1", "--embed-dim", "16", "--heads", "2", "--data", tmp_path / "bin"]
    proc = run_cli(
        "scripts/benchmark.py",
        "--worker",
        "--baseline",
        "--arch",
        "copy_transformer_small",
        "--against",
        "transformer_pointer_generator",
        *args,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["arch"] == "transformer_pointer_generator" and result["gen_sents"] >= 1
