"""examples/commongen/run.sh with PRETRAINED=DIR, end to end on CPU: a tiny checkpoint in the
layout of fairseq's released BART over the released GPT-2 BPE and BART ``dict.txt`` (where
``../shared/released`` exists; stand-ins where it does not); EKI-BART on the prototype input with
the authors' settings, then BART+DimAttn on the concepts, each fine-tuned a few updates, decoded
with --bpe gpt2 and scored. The text BART reads is CommonGen's raw cased text. The checkpoints
decoded are the fine-tuned BART: every pretrained tensor within a few Adam steps of the released
one (a random start is ~0.05 away)."""

import json
import os
import random
import shutil
import subprocess

import torch
from conftest import ROOT
from fairseq.data import Dictionary
from test_convert_hf_bart import released_or_stand_in
from test_eki_bart_released import write_released_bart
from test_recipes import RECIPE_ENV
from test_recipes_commongen import commongen_split

TINY = (
    "--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 16 --decoder-embed-dim 16 "
    "--encoder-ffn-embed-dim 32 --decoder-ffn-embed-dim 32 --encoder-attention-heads 2 --decoder-attention-heads 2"
)
ENV = dict(UPDATE_FREQ="1")  # with test_recipes.RECIPE_ENV: 3 updates, warm-up 1, beam 2, no prefetch thread


def run_recipe(script, *args, **env):
    """test_recipes.run_recipe with a longer limit: over the released 50,265-row dictionary every stage's process
    loads a real-size vocabulary (a recipe run took 14 minutes on a loaded 2-core machine)."""
    env = dict(os.environ, **RECIPE_ENV, **env)
    cmd = ["bash", script, *map(str, args)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=2700, env=env)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def cased_split(rng, data, name, n_sets):
    """CommonGen files whose references are cased, untokenized sentences (as released)."""
    return commongen_split(
        rng, data, name, n_sets,
        reference=lambda a, b, c, r: f"The {a.capitalize()} and the {b} {c} {'here' if r else 'in Central Park'}.",
    )  # fmt: skip


def assert_fine_tuned_from(ckpt, released, sep_row=None, tol=2e-3):
    tuned = torch.load(ckpt)["model"]
    n = released["encoder.embed_tokens.weight"].size(0)
    for k, v in released.items():
        t = tuned[k][:n] if "embed_tokens" in k else tuned[k]
        assert (t.float() - v.float()).abs().max() < tol, k
    emb = tuned["encoder.embed_tokens.weight"]
    assert emb.size(0) == n + (sep_row is not None)
    if sep_row is not None:  # '<sep>': a new row that started at the mean of bart's
        assert (emb[sep_row] - released["encoder.embed_tokens.weight"].mean(0)).abs().max() < tol
    return tuned


def test_commongen_recipe_from_a_released_bart(tmp_path):
    from fairseq.data.encoders.gpt2_bpe import GPT2BPE, GPT2BPEConfig

    rng = random.Random(1)
    data = tmp_path / "data"
    data.mkdir()
    cased_split(rng, data, "train", 15)
    dev_refs = cased_split(rng, data, "dev", 4)
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("= Dogs =\n The dog runs in the park with a ball . A kid swims in the river near a tree .\n")
    encoder_json, vocab_bpe, dict_txt = released_or_stand_in(tmp_path / "bpe-files")
    bart = tmp_path / "bart.base"
    bart.mkdir()
    shutil.copy(encoder_json, bart / "encoder.json")
    shutil.copy(vocab_bpe, bart / "vocab.bpe")
    released = write_released_bart(bart, dict_txt=dict_txt)
    env = dict(ENV, PRETRAINED=str(bart), ARCH="eki_bart_base", ARCH_ARGS=f"{TINY} --eki-scaling-dim 8")
    run_recipe("examples/commongen/run.sh", data, tmp_path / "out", corpus, **env)
    out = tmp_path / "out" / "bart"  # the BART path's own raw/, bpe/, bin*/ and runs/ under OUT

    # BART's own text: the raw cased references, and their GPT-2 BPE decodes back to them
    assert (out / "raw" / "text").read_text().split() == ["raw"]
    valid_tgt = (out / "raw" / "valid.tgt").read_text().splitlines()
    assert valid_tgt == dev_refs[::2]  # the first reference of each concept set, as released
    bpe = GPT2BPE(GPT2BPEConfig(gpt2_encoder_json=str(encoder_json), gpt2_vocab_bpe=str(vocab_bpe)))
    assert [bpe.decode(x) for x in (out / "bpe" / "valid.tgt").read_text().splitlines()] == valid_tgt
    assert "The" in (out / "raw" / "train.proto").read_text()  # in-domain prototypes keep their case
    assert "The dog runs" in (out / "raw" / "valid.proto-ood").read_text()  # WikiText detokenized, cased

    # bart's dictionary: its rows in its order, <mask> on its row, <sep> after it (EKI data only)
    n = released["encoder.embed_tokens.weight"].size(0)
    eki_dict = Dictionary.load(str(out / "bin-eki" / "dict.src.txt"))
    assert eki_dict.index("<mask>") == n - 1 and eki_dict.index("<sep>") == n and len(eki_dict) == n + 1
    assert eki_dict.symbols[: n - 1] == Dictionary.load(str(dict_txt)).symbols
    assert Dictionary.load(str(out / "bin" / "dict.src.txt")).symbols == eki_dict.symbols[:n]
    # the GPT-2 ids of the data, '<sep>' whole between the two encoded sides
    line = (out / "bpe" / "valid.eki.src").read_text().splitlines()[0]
    assert line.split().count("<sep>") == 1 and all(t.isdigit() for t in line.split() if t != "<sep>")

    run = out / "runs" / "eki_bart_base"
    log = (run / "train.log").read_text()
    # the authors' fine-tuning settings reach fairseq-train (lr, epochs, lambda; RECIPE_ENV sets updates/tokens)
    settings = ("'lr': [0.005]", "'lr_scheduler': {'_name': 'polynomial_decay'", "'clip_norm': 0.1", "'max_epoch': 10")
    settings += ("'adam_betas': '(0.9, 0.999)'", "'eki_gpt2_encoder_json'", "layernorm_embedding=True")
    settings += ("'eki_lambda': 0.5", "eki_input_layout='concat'", "share_all_embeddings=True")
    for setting in settings:
        assert setting in log, setting
    gen_log = (run / "valid.out.log").read_text()  # and their decoding settings fairseq-generate
    for setting in ("'lenpen': 0.0", "'min_len': 3", "'max_len_b': 24", "'no_repeat_ngram_size': 3"):
        assert setting in gen_log, setting
    # lr 5e-3 for 3 updates: the pretrained tensors move by a few 1e-3, far less than a random start
    tuned = assert_fine_tuned_from(run / "checkpoints" / "checkpoint_best.pt", released, sep_row=n, tol=2e-2)
    assert any("scaling" in k for k in tuned) and any("distance_embed" in k for k in tuned)
    hyps = [x for x in (run / "valid.out").read_text().splitlines() if x.startswith("D-")]
    assert len(hyps) == 4  # one decoded (GPT-2 text) hypothesis per dev concept set
    assert json.loads((run / "valid.scores.json").read_text())

    # BART+DimAttn on the concepts, from the same stages 1-4, with fairseq's BART example settings
    env = dict(ENV, PRETRAINED=str(bart), ARCH="bart_dimattn_base", ARCH_ARGS=TINY, STAGE="5")
    run_recipe("examples/commongen/run.sh", data, tmp_path / "out", corpus, **env)
    run = out / "runs" / "bart_dimattn_base"
    assert "'lr': [3e-05]" in (run / "train.log").read_text()
    assert_fine_tuned_from(run / "checkpoints" / "checkpoint_best.pt", released)
    assert len([x for x in (run / "valid.out").read_text().splitlines() if x.startswith("D-")]) == 4
    assert json.loads((run / "valid.scores.json").read_text())


def test_a_moses_raw_folder_is_refused_for_bart(tmp_path):
    """A from-scratch run and a BART run in one OUT keep their own folders: BART's stage 1 writes OUT/bart/raw
    (cased text) and leaves the from-scratch OUT/raw (lower-cased Moses text) as it was. A Moses raw/ where the
    BART path reads (an OUT laid out before OUT/bart) must not reach BART: stage 3 stops."""
    rng = random.Random(2)
    data = tmp_path / "data"
    data.mkdir()
    cased_split(rng, data, "train", 3)
    cased_split(rng, data, "dev", 2)
    out = tmp_path / "out"
    run_recipe("examples/commongen/run.sh", data, out, tmp_path / "none.txt", STOP_STAGE="1")
    scratch = {p.name: p.read_bytes() for p in (out / "raw").iterdir()}
    encoder_json, vocab_bpe, dict_txt = released_or_stand_in(tmp_path / "bpe-files")
    bart = tmp_path / "bart"
    bart.mkdir()
    for f in (encoder_json, vocab_bpe, dict_txt):
        shutil.copy(f, bart)
    (bart / "model.pt").write_bytes(b"")
    env = dict(os.environ, **RECIPE_ENV, PRETRAINED=str(bart))

    def recipe(**stages):
        return subprocess.run(["bash", "examples/commongen/run.sh", str(data), str(out), str(tmp_path / "none.txt")],
                              cwd=ROOT, capture_output=True, text=True, env=dict(env, **stages), timeout=600)  # fmt: skip

    proc = recipe(STOP_STAGE="1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "bart" / "raw" / "text").read_text().split() == ["raw"]
    assert {p.name: p.read_bytes() for p in (out / "raw").iterdir()} == scratch
    shutil.rmtree(out / "bart" / "raw")
    shutil.copytree(out / "raw", out / "bart" / "raw")
    proc = recipe(STAGE="3", STOP_STAGE="3")
    assert proc.returncode == 2 and "holds moses text, this run needs raw" in proc.stdout
