"""K-BERT from released checkpoints: a tiny RoBERTa written in the released layout (decoder.sentence_encoder.*,
emb_layer_norm, fused in_proj) starts K-BERT through --kbert-pretrained and --restore-file with its weights
intact; partial loads are refused naming the tensors; a fine-tuned checkpoint loads without its pretrained file;
sentence pairs get segment ids and a visible matrix over both sentences; the recipe runs from a converted BERT."""

import json
import os
import re
import shutil
import subprocess

import pytest
import torch
from conftest import ROOT, TRAIN_COMMON, run_cli
from helpers import build_task_and_model, first_batch
from test_convert_hf_bert import TINY as BERT_TINY
from test_convert_hf_bert import converted, task_folder  # noqa: F401  (fixtures)
from test_kbert_model import TINY, tagging_dir, tiny_roberta  # noqa: F401  (fixtures)

from fairseq_knowgen.modules.sentence_tree import visible_matrix


def released_layout(state: dict) -> dict:
    """A current-layout RoBERTa model state as the released roberta.base/model.pt has it, written
    out independently of the package: decoder.* names, emb_layer_norm, q/k/v fused into in_proj."""
    legacy = {}
    for k, v in state.items():
        k = "decoder" + k[len("encoder") :] if k.startswith("encoder.") else k
        legacy[k.replace(".layernorm_embedding.", ".emb_layer_norm.")] = v
    out = {}
    for k, v in legacy.items():
        if ".self_attn.q_proj." in k:
            base, kind = k.split(".self_attn.")[0] + ".self_attn.", k.rsplit(".", 1)[1]
            out[base + "in_proj_" + kind] = torch.cat([legacy[base + f"{p}_proj.{kind}"] for p in "qkv"])
        elif ".self_attn.k_proj." not in k and ".self_attn.v_proj." not in k:
            out[k] = v
    return out


@pytest.fixture(scope="module")
def released_roberta(tiny_roberta, tmp_path_factory):  # noqa: F811
    ckpt = torch.load(tiny_roberta)
    ckpt["model"] = released_layout(ckpt["model"])
    keys = list(ckpt["model"])
    assert any(".in_proj_weight" in k for k in keys) and not any(k.startswith("encoder.") for k in keys)
    path = tmp_path_factory.mktemp("released") / "model.pt"
    torch.save(ckpt, path)
    return path


def features(model, batch):
    with torch.no_grad():
        return model.eval()(**batch["net_input"], features_only=True)[0]


def test_legacy_converter_restores_the_current_layout(tiny_roberta, released_roberta, tmp_path):  # noqa: F811
    """python -m fairseq_knowgen.convert.fairseq_legacy IN OUT: the released layout back to the
    current one, every tensor equal to the checkpoint fairseq wrote."""
    run_cli("-m", "fairseq_knowgen.convert.fairseq_legacy", released_roberta, tmp_path / "current.pt")
    got = torch.load(tmp_path / "current.pt")["model"]
    want = {k: v for k, v in torch.load(tiny_roberta)["model"].items()}
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_kbert_from_released_roberta_gives_roberta_outputs(tagging_dir, tiny_roberta, released_roberta):  # noqa: F811
    """--kbert-pretrained with the released layout: without a KG, K-BERT computes what fairseq's own
    RoBERTa computes from the checkpoint it came from."""
    from fairseq import checkpoint_utils

    [roberta], _ = checkpoint_utils.load_model_ensemble([str(tiny_roberta)])
    task, model, _ = build_task_and_model(
        tagging_dir, "kbert_small", *TINY, "--kbert-pretrained", released_roberta, "--max-positions", "128",
        task="kbert_tagging",
    )
    batch = first_batch(task)
    tokens = batch["net_input"]["src_tokens"]
    with torch.no_grad():
        expected, _ = roberta.eval()(tokens, features_only=True)
    got = features(model, batch)
    pad = tokens.eq(task.source_dictionary.pad())
    assert torch.allclose(got[~pad], expected[~pad], atol=1e-5), (got[~pad] - expected[~pad]).abs().max()


def edited(path, tmp_path, edit):
    ckpt = torch.load(path)
    edit(ckpt["model"])
    out = tmp_path / "edited.pt"
    torch.save(ckpt, out)
    return out


def exits_with(capsys, pattern, build, *args, **kwargs):
    """``build(*args)`` ends with ``error: ...`` matching ``pattern`` and exit status 2 (the K-BERT
    tasks' way with bad input, as in fairseq-train), no traceback."""
    with pytest.raises(SystemExit) as e:
        build(*args, **kwargs)
    err = capsys.readouterr().err
    assert e.value.code == 2 and re.search(pattern, err), err[-2000:]


@pytest.mark.parametrize(
    "edit,named",
    [
        (lambda m: m.pop("decoder.sentence_encoder.layers.1.fc2.bias"), "layers.1.fc2.bias"),
        (lambda m: m.update({"decoder.sentence_encoder.layers.0.adapter.weight": torch.zeros(2)}), "layers.0.adapter"),
        (lambda m: m.update({"decoder.sentence_encoder.embed_tokens.weight": torch.zeros(7, 16)}), "embed_tokens"),
    ],
    ids=["missing", "no-place", "shape"],
)
def test_partial_loads_are_refused_naming_the_tensors(
    tagging_dir, released_roberta, tmp_path, capsys, edit, named  # noqa: F811
):
    bad = edited(released_roberta, tmp_path, edit)
    exits_with(
        capsys, rf"error: {bad}: refusing a partial load.*{named}", build_task_and_model,
        tagging_dir, "kbert_small", *TINY, "--kbert-pretrained", bad, "--max-positions", "128", task="kbert_tagging",
    )


def test_position_tables_take_the_first_rows_or_refuse_a_longer_model(
    tagging_dir, released_roberta, capsys  # noqa: F811
):
    ckpt = torch.load(released_roberta)["model"]
    _, model, _ = build_task_and_model(
        tagging_dir, "kbert_small", *TINY, "--kbert-pretrained", released_roberta, "--max-positions", "64",
        task="kbert_tagging",
    )
    table = ckpt["decoder.sentence_encoder.embed_positions.weight"]
    assert torch.equal(model.encoder.embed_positions.weight, table[: 64 + 2])
    exits_with(
        capsys, "embed_positions.weight", build_task_and_model,
        tagging_dir, "kbert_small", *TINY, "--kbert-pretrained", released_roberta, "--max-positions", "256",
        task="kbert_tagging",
    )


def test_restore_file_with_the_released_layout(tagging_dir, released_roberta, tmp_path):  # noqa: F811
    """fairseq-train --restore-file roberta(released).pt --reset-*: one update at lr 1e-12 keeps the
    encoder's weights (q from the fused in_proj, the embedding LayerNorm)."""
    run_cli(
        "fairseq-train", tagging_dir, *TRAIN_COMMON, "--task", "kbert_tagging", "--arch", "kbert_small", *TINY,
        "--max-positions", "128", "--criterion", "kbert_tagging", "--restore-file", released_roberta,
        "--reset-optimizer", "--reset-dataloader", "--reset-meters", "--reset-lr-scheduler", "--lr", "1e-12",
        "--max-update", "1", "--save-dir", tmp_path / "ckpt",
    )  # fmt: skip
    src = torch.load(released_roberta)["model"]
    got = torch.load(tmp_path / "ckpt" / "checkpoint_last.pt")["model"]
    q = src["decoder.sentence_encoder.layers.1.self_attn.in_proj_weight"][:16]
    assert torch.allclose(got["encoder.layers.1.self_attn.q_proj.weight"], q, atol=1e-6)
    ln = src["decoder.sentence_encoder.emb_layer_norm.weight"]
    assert torch.allclose(got["encoder.layernorm_embedding.weight"], ln, atol=1e-6)


def pair_folder(path, with_kg=False):
    """Sentence pairs whose label says whether b shares a character with a."""
    os.makedirs(path, exist_ok=True)
    chars = "甲乙丙丁戊己庚辛壬癸是"
    with open(os.path.join(path, "dict.txt"), "w", encoding="utf-8") as f:
        f.writelines(f"{c} 1\n" for c in chars)
    rows = ["label\ttext_a\ttext_b", "1\t甲乙丙\t丁乙", "0\t甲丙\t丁戊"]
    for split in ("train", "valid"):
        with open(os.path.join(path, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("\n".join(rows) + "\n")
    with open(os.path.join(path, "kg.spo"), "w", encoding="utf-8") as f:
        f.write("乙\t是\t戊\n")
    return path


def test_pair_segments_soft_positions_and_visible_matrix_by_hand(tmp_path):
    """<s> 甲 乙 [是 戊] 丙 </s> 丁 乙 [是 戊] </s> (KG: 乙 -> 是 戊): segment ids 0 through the first
    </s>; soft positions run on through it; sentence tokens of both sentences see each other, a
    branch only itself and its own mention (a's branch is invisible to b and vice versa)."""
    data = pair_folder(str(tmp_path / "pairs"))
    task, model, args = build_task_and_model(
        data, "kbert_small", *TINY, "--kg", f"{data}/kg.spo", task="kbert_classification"
    )
    assert args.num_segments == 2 and model.encoder.segment_embeddings.num_embeddings == 2
    ds = task.dataset("valid")
    sample = ds.collater([ds[0]])["net_input"]
    d = task.source_dictionary
    assert [d[t] for t in sample["src_tokens"][0]] == ["<s>", *"甲乙是戊丙", "</s>", *"丁乙是戊", "</s>"]
    assert sample["segment_ids"][0].tolist() == [0] * 7 + [1] * 5
    assert sample["soft_positions"][0].tolist() == [0, 1, 2, 3, 4, 3, 4, 5, 6, 7, 8, 7]
    trunk = {0, 1, 2, 5, 6, 7, 8, 11}
    expected = torch.zeros(12, 12, dtype=torch.bool)
    for i in trunk:
        for j in trunk:
            expected[i, j] = True
    for branch, mention in (({3, 4}, 2), ({9, 10}, 8)):
        for i in branch:
            for j in branch | {mention}:
                expected[i, j] = expected[j, i] = True
    got = visible_matrix(sample["branch_ids"], sample["mention_ids"])[0]
    assert torch.equal(got, expected), (got.int() - expected.int()).nonzero().tolist()


@pytest.mark.parametrize(
    "row,where,what",
    [
        ("1\t甲乙", "dev.tsv:3", "2 TAB-separated column"),
        ("1\t甲乙\t ", "dev.tsv:3", "empty text_b"),
        ("1\t\t甲", "dev.tsv:3", "empty text_a"),
    ],
)
def test_bad_pair_rows_are_refused_with_file_and_line(tmp_path, row, where, what):
    data = pair_folder(str(tmp_path / "raw"))
    with open(f"{data}/dev.tsv", "w", encoding="utf-8") as f:
        f.write(f"label\ttext_a\ttext_b\n1\t甲乙\t乙\n{row}\n0\t甲\t乙\n")  # the bad row on line 3
    proc = run_cli("-m", "fairseq_knowgen.prep.kbert", "--data", data, "--out", tmp_path / "out", check=False)
    assert proc.returncode == 2 and where in proc.stderr and what in proc.stderr, proc.stderr[-2000:]


def test_unknown_label_is_refused_with_file_and_line(tmp_path, capsys):
    data = pair_folder(str(tmp_path / "pairs"))
    with open(f"{data}/valid.tsv", "a", encoding="utf-8") as f:
        f.write("7\t甲\t乙\n")
    exits_with(capsys, r"valid.tsv:4: label '7'", build_task_and_model, data, "kbert_small", *TINY,
               task="kbert_classification")


def test_finetuned_checkpoint_loads_without_the_pretrained_file(converted, tmp_path):  # noqa: F811
    """Fine-tune 1 update from a converted BERT (sentence pairs), move the pretrained file away: the
    checkpoint loads (load_model_ensemble_and_task, kbert_score) with the weights it holds."""
    from fairseq import checkpoint_utils

    _, _, out = converted
    pretrained = tmp_path / "bert" / "model.pt"
    shutil.copytree(out, tmp_path / "bert")
    data = task_folder(str(tmp_path / "data"), out, pairs=True)
    run_cli(
        "fairseq-train", data, *TRAIN_COMMON, "--task", "kbert_classification", "--arch", "kbert_base", *BERT_TINY,
        "--kbert-pretrained", pretrained, "--criterion", "sentence_prediction", "--max-update", "1",
        "--save-dir", tmp_path / "ckpt",
    )  # fmt: skip
    os.remove(pretrained)
    ckpt = str(tmp_path / "ckpt" / "checkpoint_last.pt")
    [model], _, task = checkpoint_utils.load_model_ensemble_and_task([ckpt])
    saved = torch.load(ckpt)["model"]
    assert model.encoder.segment_embeddings.num_embeddings == 2 and model.encoder.layernorm_embedding.eps == 1e-12
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k]), k
    proc = run_cli(
        "scripts/kbert_score.py", "--data", data, "--split", "valid", "--path", ckpt,
        "--pred", tmp_path / "valid.pred",
    )  # fmt: skip
    assert "accuracy" in proc.stdout and len((tmp_path / "valid.pred").read_text().splitlines()) == 10


def test_recipe_from_a_converted_bert_with_sentence_pairs(converted, tmp_path):  # noqa: F811
    """examples/kbert/run.sh with PRETRAINED=DIR (the converter's model.pt + dict.txt), TASK_TYPE and KG=PATH
    on a TSV folder of sentence pairs: prepare on BERT's dictionary, no masked-LM stage, fine-tune from
    BERT with its sizes, predict and score."""
    _, _, out = converted
    data = task_folder(str(tmp_path / "tsv"), out, pairs=True, n=16)
    shutil.copy(f"{data}/valid.tsv", f"{data}/dev.tsv")
    os.remove(f"{data}/valid.tsv")
    os.remove(f"{data}/dict.txt")  # the recipe takes the dictionary from PRETRAINED
    with open(tmp_path / "kg.spo", "w", encoding="utf-8") as f:
        f.write("的\t是\t人\n中\t在\t大\n")
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PRETRAINED=str(out), TASK_TYPE="classification", KG=str(tmp_path / "kg.spo"),
        MAX_UPDATE="3", VALID_EVERY="3", MINUTES="5", MAX_POSITIONS="40", BATCH="8",
    )  # fmt: skip
    proc = subprocess.run(
        ["bash", "examples/kbert/run.sh", "pairs", data, tmp_path / "run"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    run = tmp_path / "run"
    assert (run / "data" / "dict.txt").read_text(encoding="utf-8") == (out / "dict.txt").read_text(encoding="utf-8")
    assert "stage 2: skipped" in proc.stdout and not (run / "mlm" / "checkpoints").exists()
    log = (run / "runs" / "kbert" / "train.log").read_text()
    assert "K-BERT encoder from" in log and "lr=[2e-05]" in log
    assert re.search(r"embed_tokens\): Embedding\(\d+, 16, padding_idx=1\)", log)  # BERT's sizes, from its checkpoint
    assert "kbert_adam" in log and "--optimizer kbert_adam" in proc.stdout  # the authors' optimizer settings
    assert "injected tokens kept" in log and " 0 injected tokens" not in log
    scores = json.loads((run / "runs" / "kbert" / "valid.scores.json").read_text())["kbert/valid"]
    assert 0 <= scores["accuracy"] <= 100 and scores["sentences"] == 16
