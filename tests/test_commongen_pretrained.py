"""examples/commongen/run.sh with PRETRAINED=DIR, end to end on CPU: a tiny checkpoint in the
layout of fairseq's released BART with tiny GPT-2 BPE files beside it; EKI-BART on the
prototype input, then BART+DimAttn on the concepts, each fine-tuned a few updates, decoded
with --bpe gpt2 and scored. The checkpoints decoded are the fine-tuned BART: every pretrained
tensor within a few Adam steps of the released one (a random start is ~0.05 away)."""

import json
import random

import torch
from fairseq.data import Dictionary
from test_eki_bart_released import write_released_bart, write_tiny_gpt2_bpe
from test_recipes import commongen_split, run_recipe

TINY = (
    "--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 16 --decoder-embed-dim 16 "
    "--encoder-ffn-embed-dim 32 --decoder-ffn-embed-dim 32 --encoder-attention-heads 2 --decoder-attention-heads 2"
)
ENV = dict(UPDATE_FREQ="1")  # with test_recipes.RECIPE_ENV: 3 updates, warm-up 1, beam 2, no prefetch thread
WORDS = "dog frisbee catch ball throw kid park run field jump river boat swim sit tree the and here there".split()


def assert_fine_tuned_from(ckpt, released, sep_row=None):
    tuned = torch.load(ckpt)["model"]
    n = released["encoder.embed_tokens.weight"].size(0)
    for k, v in released.items():
        t = tuned[k][:n] if "embed_tokens" in k else tuned[k]
        assert (t.float() - v.float()).abs().max() < 2e-3, k  # 3 updates at lr 3e-05
    emb = tuned["encoder.embed_tokens.weight"]
    assert emb.size(0) == n + (sep_row is not None)
    if sep_row is not None:  # '<sep>': a new row that started at the mean of bart's
        assert (emb[sep_row] - released["encoder.embed_tokens.weight"].mean(0)).abs().max() < 2e-3
    return tuned


def test_commongen_recipe_from_a_released_bart(tmp_path):
    rng = random.Random(1)
    data = tmp_path / "data"
    data.mkdir()
    commongen_split(rng, data, "train", 30)
    commongen_split(rng, data, "dev", 4)
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("= Dogs =\n the dog runs in the park with a ball . a kid swims in the river near a tree .\n")
    bart = tmp_path / "bart.base"
    write_tiny_gpt2_bpe(bart, WORDS)
    released = write_released_bart(bart)
    out = tmp_path / "out"
    env = dict(ENV, PRETRAINED=str(bart), ARCH="eki_bart_base", ARCH_ARGS=f"{TINY} --eki-scaling-dim 8")
    run_recipe("examples/commongen/run.sh", data, out, corpus, **env)

    # bart's dictionary: its rows in its order, <mask> on its row, <sep> after it (EKI data only)
    n = released["encoder.embed_tokens.weight"].size(0)
    eki_dict = Dictionary.load(str(out / "bin-eki" / "dict.src.txt"))
    assert eki_dict.index("<mask>") == n - 1 and eki_dict.index("<sep>") == n and len(eki_dict) == n + 1
    assert Dictionary.load(str(out / "bin" / "dict.src.txt")).symbols == eki_dict.symbols[:n]
    # the GPT-2 ids of the data, '<sep>' whole between the two encoded sides
    line = (out / "bpe" / "valid.eki.src").read_text().splitlines()[0]
    assert line.split().count("<sep>") == 1 and all(t.isdigit() for t in line.split() if t != "<sep>")

    run = out / "runs" / "eki_bart_base"
    log = (run / "train.log").read_text()
    # fairseq's BART fine-tuning settings reach fairseq-train
    settings = ("'lr': [3e-05]", "'lr_scheduler': {'_name': 'polynomial_decay'", "'clip_norm': 0.1")
    settings += ("'adam_betas': '(0.9, 0.999)'", "'eki_gpt2_encoder_json'", "layernorm_embedding=True")
    for setting in settings + ("share_all_embeddings=True",):
        assert setting in log, setting
    tuned = assert_fine_tuned_from(run / "checkpoints" / "checkpoint_best.pt", released, sep_row=n)
    assert any("scaling" in k for k in tuned) and any("distance_embed" in k for k in tuned)
    hyps = [x for x in (run / "valid.out").read_text().splitlines() if x.startswith("D-")]
    assert len(hyps) == 4  # one decoded (GPT-2 text) hypothesis per dev concept set
    assert json.loads((run / "valid.scores.json").read_text())

    # BART+DimAttn on the concepts, from the same stages 1-4
    env = dict(ENV, PRETRAINED=str(bart), ARCH="bart_dimattn_base", ARCH_ARGS=TINY, STAGE="5")
    run_recipe("examples/commongen/run.sh", data, out, corpus, **env)
    run = out / "runs" / "bart_dimattn_base"
    assert_fine_tuned_from(run / "checkpoints" / "checkpoint_best.pt", released)
    assert len([x for x in (run / "valid.out").read_text().splitlines() if x.startswith("D-")]) == 4
    assert json.loads((run / "valid.scores.json").read_text())
