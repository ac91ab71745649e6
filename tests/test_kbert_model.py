"""The K-BERT encoder and its training: the visible matrix and soft positions in a one-layer
encoder on the task's data (multi-layer: test_kbert_visible_matrix.py), loading a tiny RoBERTa
checkpoint, loss going down, checkpoint round trip, 2-rank DDP."""

import numpy as np
import pytest
import torch
from conftest import TRAIN_COMMON, run_cli
from helpers import build_task_and_model, first_batch

from fairseq_knowgen.prep.kbert import make_synthetic_task

TINY = ["--encoder-layers", "2", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32"]
TINY += ["--encoder-attention-heads", "2"]


@pytest.fixture(scope="module")
def tagging_dir(tmp_path_factory):
    return make_synthetic_task(str(tmp_path_factory.mktemp("kbert_tag")), 120, 24, tagging=True)


@pytest.fixture(scope="module")
def classification_dir(tmp_path_factory):
    return make_synthetic_task(str(tmp_path_factory.mktemp("kbert_cls")), 120, 24, tagging=False)


def build(data, *extra, task="kbert_tagging", kg=True):
    kg_args = ["--kg", f"{data}/kg.spo"] if kg else []
    task_, model, _ = build_task_and_model(data, "kbert_small", *TINY, *kg_args, *extra, task=task)
    return task_, model.eval()


def features(model, batch):
    with torch.no_grad():
        return model(**batch["net_input"], features_only=True)[0]


def test_one_layer_trunk_tokens_away_from_mentions_do_not_see_the_knowledge(tagging_dir):
    """With one layer, a sentence token that is no mention sees only the sentence (visible
    matrix) at its own position (soft positions): its output is that of the sentence without
    the KG. Without the visible matrix, or without soft positions, it changes."""
    task, model = build(tagging_dir, "--encoder-layers", "1")
    _, plain_model = build(tagging_dir, "--encoder-layers", "1", kg=False)
    plain_model.load_state_dict(model.state_dict())
    batch = first_batch(task)
    ds_kg, ds_plain = task.dataset("valid"), build(tagging_dir, kg=False)[0].dataset("valid")
    idx = batch["id"].tolist()
    plain_batch = ds_plain.collater([ds_plain[i] for i in idx])
    net = batch["net_input"]
    assert net["branch_ids"].gt(0).any()  # knowledge was injected
    checked = 0
    out_kg, out_plain = features(model, batch), features(plain_model, plain_batch)
    outs_ablated = {}
    for flag in ("use_visible_matrix", "use_soft_positions"):
        setattr(model.encoder, flag, False)
        outs_ablated[flag] = features(model, batch)
        setattr(model.encoder, flag, True)
    differs = {flag: False for flag in outs_ablated}
    for row, i in enumerate(idx):
        trunk = torch.from_numpy(ds_kg.trunk_index[i])
        plain_pos = torch.from_numpy(ds_plain.trunk_index[i])
        away = net["mention_ids"][row, trunk].eq(0)
        if not net["branch_ids"][row].gt(0).any():
            continue
        a, b = out_kg[row, trunk[away]], out_plain[row, plain_pos[away]]
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
        for flag, out in outs_ablated.items():
            differs[flag] |= not torch.allclose(out[row, trunk[away]], b, atol=1e-3)
        checked += 1
    assert checked > 0 and all(differs.values()), differs


@pytest.fixture(scope="module")
def tiny_roberta(tagging_dir, tmp_path_factory):
    """A tiny fairseq RoBERTa (masked_lm) checkpoint on the task's dictionary, 2 updates."""
    data, mlm = tagging_dir, tmp_path_factory.mktemp("mlm")
    lines = [x.split("\t")[0] for x in open(f"{data}/train.tsv", encoding="utf-8").read().splitlines()[1:]]
    (mlm / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_cli(
        "fairseq-preprocess",
        "--only-source",
        "--srcdict",
        f"{data}/dict.txt",
        "--trainpref",
        mlm / "train.txt",
        "--validpref",
        mlm / "train.txt",
        "--destdir",
        mlm / "bin",
        "--workers",
        "1",
    )
    run_cli(
        "fairseq-train",
        mlm / "bin",
        *TRAIN_COMMON,
        "--task",
        "masked_lm",
        "--criterion",
        "masked_lm",
        "--arch",
        "roberta",
        *TINY,
        "--max-positions",
        "128",
        "--tokens-per-sample",
        "128",
        "--max-update",
        "2",
        "--save-dir",
        mlm / "ckpt",
    )
    return mlm / "ckpt" / "checkpoint_last.pt"


def test_encoder_from_tiny_roberta_gives_roberta_outputs_without_kg(tagging_dir, tiny_roberta):
    from fairseq import checkpoint_utils

    path = tiny_roberta
    [roberta], _ = checkpoint_utils.load_model_ensemble([str(path)])
    roberta.eval()
    task, model = build(tagging_dir, "--kbert-pretrained", path, "--max-positions", "128", kg=False)
    batch = first_batch(task)
    tokens = batch["net_input"]["src_tokens"]
    with torch.no_grad():
        expected, _ = roberta(tokens, features_only=True)
    got = features(model, batch)
    pad = tokens.eq(task.source_dictionary.pad())
    assert torch.allclose(got[~pad], expected[~pad], atol=1e-5), (got[~pad] - expected[~pad]).abs().max()
    # and the weights were really loaded (a fresh model differs)
    _, fresh = build(tagging_dir, "--max-positions", "128", kg=False)
    assert not torch.allclose(features(fresh, batch)[~pad], expected[~pad], atol=1e-3)


def train_with_worker(data, tmp_path, task, criterion, updates=40, extra=()):
    out = tmp_path / "worker.pt"
    run_cli(
        "tests/ddp_worker.py",
        out,
        data,
        *TRAIN_COMMON,
        "--task",
        task,
        "--kg",
        f"{data}/kg.spo",
        "--arch",
        "kbert_small",
        *TINY,
        "--criterion",
        criterion,
        "--batch-size",
        "16",
        "--max-update",
        str(updates),
        "--save-dir",
        tmp_path / "ckpt",
        *extra,
    )
    return torch.load(out)


@pytest.mark.parametrize(
    "task,criterion", [("kbert_tagging", "kbert_tagging"), ("kbert_classification", "sentence_prediction")]
)
def test_loss_goes_down_and_checkpoint_round_trip(request, tmp_path, task, criterion):
    from fairseq import checkpoint_utils

    data = request.getfixturevalue("tagging_dir" if task == "kbert_tagging" else "classification_dir")
    # one full batch of the 24 validation examples per update: the model can memorize them (no validation: fairseq
    # would reuse the training iterator for the same split, and its data-loader worker would be shut down)
    extra = ("--train-subset", "valid", "--disable-validation", "--batch-size", "24", "--dropout", "0", "--lr", "3e-3")
    rec = train_with_worker(data, tmp_path, task, criterion, extra=extra)
    losses = rec["losses"]
    assert len(losses) == 40 and sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
    models, _, loaded_task = checkpoint_utils.load_model_ensemble_and_task(
        [str(tmp_path / "ckpt" / "checkpoint_last.pt")]
    )
    state = models[0].state_dict()
    assert set(state) == set(rec["params"])
    for k, v in rec["params"].items():
        assert torch.equal(state[k], v), k
    assert loaded_task.cfg.kg.endswith("kg.spo") and type(loaded_task).__name__.startswith("KBert")


def test_two_ranks_end_identical(classification_dir, tmp_path):
    from test_ddp import TwoRanks

    args = [
        classification_dir,
        *TRAIN_COMMON,
        "--task",
        "kbert_classification",
        "--kg",
        f"{classification_dir}/kg.spo",
        "--arch",
        "kbert_small",
        *TINY,
        "--criterion",
        "sentence_prediction",
        "--batch-size",
        "8",
        "--max-update",
        "4",
        "--save-dir",
        tmp_path / "ckpt",
    ]
    with TwoRanks(tmp_path, args) as ranks:
        ranks.wait()
    for r in range(2):
        assert ranks.returncode(r) == 0, ranks.log(r)[-4000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert r0["num_updates"] == r1["num_updates"] == 4
    assert r0["losses"] == r1["losses"]
    for k in r0["params"]:
        assert torch.equal(r0["params"][k], r1["params"][k]), k
    assert "distributed init (rank 1)" in ranks.log(1)
    assert not ranks.leftovers()


def test_dataset_keeps_small_ints_per_token_and_no_matrix(tagging_dir):
    """The original code kept a dense visible matrix per example for the whole data set; here
    each example holds four 1-D arrays of its length, and the mask exists per batch only."""
    task, _ = build(tagging_dir)
    ds = task.dataset("valid")
    for ids, soft, branch, mention in ds.items:
        assert ids.ndim == soft.ndim == branch.ndim == mention.ndim == 1
        assert len(ids) == len(soft) == len(branch) == len(mention)
        assert soft.dtype == branch.dtype == mention.dtype == np.int16
    assert sum(a.nbytes for item in ds.items for a in item[1:]) == 6 * int(ds.sizes.sum())


def test_restore_file_with_reset_flags_starts_from_a_roberta_checkpoint(tagging_dir, tiny_roberta, tmp_path):
    """fairseq-train --restore-file ROBERTA.pt --reset-*: the encoder starts from RoBERTa's weights
    (one update at lr 1e-12 leaves them as they were), the heads from their initialization."""
    save = tmp_path / "ckpt"
    run_cli(
        "fairseq-train",
        tagging_dir,
        *TRAIN_COMMON,
        "--task",
        "kbert_tagging",
        "--kg",
        f"{tagging_dir}/kg.spo",
        "--arch",
        "kbert_small",
        *TINY,
        "--max-positions",
        "128",
        "--criterion",
        "kbert_tagging",
        "--restore-file",
        tiny_roberta,
        "--reset-optimizer",
        "--reset-dataloader",
        "--reset-meters",
        "--reset-lr-scheduler",
        "--lr",
        "1e-12",
        "--max-update",
        "1",
        "--save-dir",
        save,
    )
    roberta = torch.load(tiny_roberta)["model"]
    kbert = torch.load(save / "checkpoint_last.pt")["model"]
    for name in ("layers.0.fc1.weight", "layers.1.self_attn.q_proj.weight", "embed_tokens.weight"):
        assert torch.allclose(kbert["encoder." + name], roberta["encoder.sentence_encoder." + name], atol=1e-6), name
    assert "encoder.tagging_heads" not in kbert and "tagging_heads.tagging_head.out_proj.weight" in kbert
