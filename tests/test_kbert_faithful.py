"""K-BERT as its authors ran it, and what a user meets through fairseq's own commands:

- entity matching by the authors' rule (pkuseg with the KG's subjects as user dictionary: forced longest
  words left to right, with pkuseg's overshoot), against hand-written cases and the longest-match flag;
- the authors' ``[ENT]`` tag of injected tokens behind ``--kg-injected-label ent`` (trained on, never scored);
- the authors' input framing behind ``--kbert-framing authors``: ``[CLS]`` + text for classification, the text
  alone for tagging, ``[CLS] a [SEP] b [SEP]`` for pairs as by default;
- the Viterbi pass: only valid IOB2, and the best valid sequence (brute force over all sequences);
- ``--optimizer kbert_adam``: BertAdam's betas / epsilon / weight decay, none on biases and LayerNorm, kept on resume;
- every dev row counts whatever ``--required-batch-size-multiple`` says;
- bad input (a TSV or KG row, an unseen dev tag, a pretrained encoder of other sizes) ends with ``path:line``
  and exit 2, from ``prep.kbert`` and from ``fairseq-train``."""

import itertools
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import BIN, ROOT
from helpers import build_task_and_model

from fairseq_knowgen.modules.knowledge_graph import KnowledgeGraph

TINY = ["--encoder-layers", "1", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32"]
TINY += ["--encoder-attention-heads", "2"]


# --- entity matching -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,pkuseg,longest",
    [
        # the walk passes 丙型肝炎 along 丙型肝炎病毒感染 and leaves the trie at 史: pkuseg forces 丙型肝炎病, no subject
        ("既往丙型肝炎病史", [], ["丙型肝炎"]),
        ("患丙型肝炎，", ["丙型肝炎"], ["丙型肝炎"]),  # the walk leaves the trie right after the subject
        ("患丙型肝炎病", ["丙型肝炎"], ["丙型肝炎"]),  # the text ends inside the longer subject: back to the subject
        ("丙型肝炎病毒感染者", ["丙型肝炎病毒感染"], ["丙型肝炎病毒感染"]),  # the longest subject wins
        ("偏头痛", ["头痛"], ["头痛"]),  # a subject inside a longer word is matched (the user dictionary is forced)
        ("头痛头痛", ["头痛", "头痛"], ["头痛", "头痛"]),
    ],
)
def test_pkuseg_matching_follows_pkusegs_user_dictionary(text, pkuseg, longest):
    triples = [("丙型肝炎", "类别", "疾病"), ("丙型肝炎病毒感染", "类别", "疾病"), ("头痛", "类别", "症状")]
    tokens = list(text)
    for matching, expected in (("pkuseg", pkuseg), ("longest", longest)):
        kg = KnowledgeGraph(triples, matching=matching)
        assert ["".join(tokens[a:b]) for a, b in kg.mentions(tokens)] == expected, matching


def test_the_tasks_match_as_the_authors_by_default(tmp_path):
    from fairseq_knowgen.tasks.kbert import KBertClassificationConfig, KBertTaggingConfig

    assert KBertClassificationConfig().kg_matching == "pkuseg" and KBertTaggingConfig().kg_matching == "pkuseg"
    assert KBertTaggingConfig().kg_injected_label == "none"
    data = tagging_folder(tmp_path)
    task, _, _ = build_task_and_model(data, "kbert_small", *TINY, "--kg", data / "kg.spo", task="kbert_tagging")
    assert task.kg.matching == "pkuseg"
    task, _, _ = build_task_and_model(
        data, "kbert_small", *TINY, "--kg", data / "kg.spo", "--kg-matching", "longest", task="kbert_tagging"
    )
    assert task.kg.matching == "longest"


# --- [ENT] on injected tokens ----------------------------------------------------------------


def tagging_folder(tmp_path, dev_rows=None):
    data = tmp_path / "data"
    data.mkdir()
    rows = ["text_a\tlabel", "头 痛 三 天\tB-Symptom I-Symptom O O", "发 热 了\tB-Symptom I-Symptom O"]
    (data / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (data / "valid.tsv").write_text("\n".join(dev_rows or rows) + "\n", encoding="utf-8")
    (data / "dict.txt").write_text("".join(f"{c} 1\n" for c in "头痛三天发热了类别症状部位"), encoding="utf-8")
    (data / "labels.txt").write_text("B-Symptom\nI-Symptom\nO\n", encoding="utf-8")
    (data / "kg.spo").write_text("头痛\t类别\t症状\n头痛\t部位\t头部\n", encoding="utf-8")
    return data


def test_ent_label_of_injected_tokens_is_trained_on_and_never_scored(tmp_path):
    import torch.nn.functional as F

    from fairseq_knowgen.criterions.kbert_tagging import KBertTaggingCriterion
    from fairseq_knowgen.data.kbert_dataset import IGNORE

    data = tagging_folder(tmp_path)
    task, model, _ = build_task_and_model(
        data, "kbert_small", *TINY, "--kg", data / "kg.spo", "--kg-injected-label", "ent", task="kbert_tagging"
    )
    assert task.labels == ["B-Symptom", "I-Symptom", "O", "[ENT]"]
    ds = task.dataset("valid")
    sample = ds.collater([ds[0]])
    # <s> 头 痛 [症 状] [头 部] 三 天 </s>: the four injected tokens carry [ENT] (3)
    assert sample["target"][0].tolist() == [IGNORE, 0, 1, 3, 3, 3, 3, 2, 2, IGNORE]
    logits = torch.randn(1, 10, 4) * 0.1
    logits[0, [2, 7, 8], [1, 2, 2]] = 40.0  # I-Symptom O O on 痛 三 天
    logits[0, 1, 3] = 50.0  # the first character's best tag is [ENT]: never a character's prediction
    logits[0, 1, 0] = 40.0  # ... so B-Symptom is

    class Model:
        training = False

        def __call__(self, **kwargs):
            return logits, {}

    crit = KBertTaggingCriterion(task)
    loss, size, log = crit(Model(), sample)
    tagged = [1, 2, 3, 4, 5, 6, 7, 8]
    by_hand = F.cross_entropy(logits[0, tagged], sample["target"][0, tagged], reduction="sum")
    assert size == 8 and torch.allclose(loss, by_hand)  # the [ENT] positions are in the loss, as the authors'
    assert log["entity_gold"] == 1 and log["span_gold"] == 1  # and never in the entity counts
    assert log["entity_pred"] == 1 and log["entity_tp"] == 1  # 头痛 predicted B-Symptom I-Symptom, not [ENT]
    # without the flag the injected tokens carry nothing
    task, _, _ = build_task_and_model(data, "kbert_small", *TINY, "--kg", data / "kg.spo", task="kbert_tagging")
    assert task.labels == ["B-Symptom", "I-Symptom", "O"]
    assert task.dataset("valid").collater([task.dataset("valid")[0]])["target"][0].tolist()[3:7] == [IGNORE] * 4


# --- the authors' framing of the input -----------------------------------------------------------


def test_authors_framing_is_cls_text_for_classification_and_the_text_alone_for_tagging(tmp_path):
    """``--kbert-framing authors`` as ``run_kbert_cls.py`` builds a single sentence (``[CLS]`` + text: soft positions
    from 0 at ``[CLS]``, no ``[SEP]``) and ``run_kbert_ner.py`` (the text alone: positions from 0 at its first
    character); ``bos-eos`` (the default) frames both ``<s> tree </s>``. Expected ids and positions by hand."""
    from fairseq_knowgen.data.kbert_dataset import IGNORE

    data = tagging_folder(tmp_path)
    tree = "头 痛 症 状 头 部 三 天"  # 头痛 with its branches [症状] [头部] (--kg-inject object)
    tree_soft = [0, 1, 2, 3, 2, 3, 2, 3]
    cases = {  # ids, soft positions, the tagged (sentence) positions
        ("bos-eos", "kbert_tagging"): ("<s> " + tree + " </s>", [0] + [p + 1 for p in tree_soft] + [5], [1, 2, 7, 8]),
        ("authors", "kbert_tagging"): (tree, tree_soft, [0, 1, 6, 7]),
    }
    for (framing, task_name), (text, soft, trunk) in cases.items():
        task, _, _ = build_task_and_model(
            data, "kbert_small", *TINY, "--kg", data / "kg.spo", "--kbert-framing", framing, task=task_name
        )
        d = task.dictionary
        ds = task.dataset("valid")
        sample = ds.collater([ds[0]])
        assert [d[i] for i in sample["net_input"]["src_tokens"][0]] == text.split()
        assert sample["net_input"]["soft_positions"][0].tolist() == soft
        tagged = [i for i, t in enumerate(sample["target"][0].tolist()) if t != IGNORE]
        assert tagged == ds.trunk_index[0].tolist() == trunk

    cls = tmp_path / "cls"
    cls.mkdir()
    (cls / "train.tsv").write_text("label\ttext_a\n1\t头痛三天\n0\t发热了\n", encoding="utf-8")
    (cls / "valid.tsv").write_text("label\ttext_a\n1\t头痛三天\n", encoding="utf-8")
    (cls / "dict.txt").write_text((data / "dict.txt").read_text(encoding="utf-8"), encoding="utf-8")
    (cls / "labels.txt").write_text("0\n1\n", encoding="utf-8")
    for framing, text, soft in (
        ("bos-eos", "<s> " + tree + " </s>", [0] + [p + 1 for p in tree_soft] + [5]),
        ("authors", "<s> " + tree, [0] + [p + 1 for p in tree_soft]),
    ):
        task, model, _ = build_task_and_model(
            cls,
            "kbert_small",
            *TINY,
            "--kg",
            data / "kg.spo",
            "--kg-inject",
            "object",
            "--kbert-framing",
            framing,
            task="kbert_classification",
        )
        ds = task.dataset("valid")
        sample = ds.collater([ds[0]])
        assert [task.dictionary[i] for i in sample["net_input"]["src_tokens"][0]] == text.split()
        assert sample["net_input"]["soft_positions"][0].tolist() == soft
        assert task.cfg.kbert_framing == framing
        model(**sample["net_input"], features_only=True, classification_head_name="sentence_classification_head")


def test_authors_framing_keeps_pairs_and_fits_max_positions(tmp_path):
    """Sentence pairs are ``<s> a </s> b </s>`` with either framing (the authors' ``[CLS] a [SEP] b [SEP]``); a
    tagging tree of exactly ``--max-positions`` tokens loses nothing without ``<s>`` and ``</s>``."""
    from fairseq.data import Dictionary

    from fairseq_knowgen.data.kbert_dataset import KBertDataset, read_tsv

    d = Dictionary()
    for c in "甲乙丙丁":
        d.add_symbol(c)
    pair = tmp_path / "pair.tsv"
    pair.write_text("label\ttext_a\ttext_b\n1\t甲乙\t丙\n", encoding="utf-8")
    for framing in ("bos-eos", "authors"):
        ds = KBertDataset(read_tsv(str(pair), False), d, {"1": 0}, None, "object", 16, False, framing=framing)
        assert [d[i] for i in ds[0]["source"]] == "<s> 甲 乙 </s> 丙 </s>".split()
        assert ds[0]["segment"].tolist() == [0, 0, 0, 0, 1, 1]
    tag = tmp_path / "tag.tsv"
    tag.write_text("text_a\tlabel\n甲 乙 丙 丁\tO O O O\n", encoding="utf-8")
    kept = {}
    for framing in ("bos-eos", "authors"):
        ds = KBertDataset(read_tsv(str(tag), True), d, {"O": 0}, None, "object", 4, True, framing=framing)
        kept[framing] = ds.dropped_trunk
    assert kept == {"bos-eos": 2, "authors": 0}


def test_criterion_span_f1_is_seqeval_untyped_strict_f1():
    import random

    from seqeval.metrics import f1_score
    from seqeval.scheme import IOB2

    from fairseq_knowgen.criterions.kbert_tagging import KBertTaggingCriterion

    labels = ["O", "B-A", "I-A", "B-B", "I-B"]
    crit = KBertTaggingCriterion(SimpleNamespace(labels=labels))
    rng = random.Random(1)
    gold = torch.tensor([[rng.randrange(5) for _ in range(9)] for _ in range(40)])
    pred = torch.tensor([[rng.randrange(5) for _ in range(9)] for _ in range(40)])
    counts = crit.entity_counts(pred, gold)

    def names(x):
        return [[labels[i][:2] + "X" if labels[i] != "O" else "O" for i in row] for row in x.tolist()]

    expected = f1_score(names(gold), names(pred), mode="strict", scheme=IOB2, zero_division=0)
    assert abs(2 * counts["span_tp"] / (counts["span_pred"] + counts["span_gold"]) - expected) < 1e-9
    assert counts["span_tp"] > counts["entity_tp"]  # types ignored: more spans right


# --- Viterbi over valid IOB2 -------------------------------------------------------------------


def valid_iob2(tags):
    """Written from the IOB2 definition: an I-X continues a B-X or an I-X."""
    prev = "O"
    for t in tags:
        if t.startswith("I-") and prev[2:] != t[2:]:
            return False
        if t not in ("O",) and not t.startswith(("B-", "I-")):
            return False
        prev = t
    return True


def test_viterbi_gives_the_best_valid_iob2_sequence():
    from fairseq_knowgen.evaluation.kbert_iob2 import iob2_transitions, viterbi

    labels = ["B-A", "I-A", "B-B", "I-B", "O", "[ENT]"]
    start, allowed = iob2_transitions(labels)
    gen = torch.Generator().manual_seed(0)
    changed = 0
    for _ in range(30):
        scores = torch.randn(5, len(labels), generator=gen).log_softmax(-1)
        best = viterbi(scores, start, allowed).tolist()
        brute = max(
            (seq for seq in itertools.product(range(len(labels)), repeat=5) if valid_iob2([labels[i] for i in seq])),
            key=lambda seq: sum(float(scores[t, i]) for t, i in enumerate(seq)),
        )
        assert best == list(brute) and valid_iob2([labels[i] for i in best])
        argmax = scores.argmax(-1).tolist()
        if valid_iob2([labels[i] for i in argmax]):
            assert best == argmax  # nothing to repair: the argmax
        else:
            changed += 1
    assert changed > 0  # the random cases include invalid argmaxes


# --- the authors' optimizer --------------------------------------------------------------------


def test_kbert_adam_decays_matrices_only_and_keeps_it_on_resume():
    from fairseq_knowgen.optim.kbert_adam import KBertAdam, KBertAdamConfig

    defaults = KBertAdamConfig()
    assert (eval(defaults.adam_betas), defaults.adam_eps, defaults.weight_decay) == ((0.9, 0.999), 1e-6, 0.01)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    with torch.no_grad():
        model[1].weight.add_(torch.randn(4))  # LayerNorm away from 1 / 0: decay would show
        model[1].bias.add_(torch.randn(4))
    before = [p.detach().clone() for p in model.parameters()]
    cfg = SimpleNamespace(
        lr=[0.1],
        adam_betas=defaults.adam_betas,
        adam_eps=1e-6,
        weight_decay=0.01,
        use_old_adam=False,
        fp16_adam_stats=False,
        tpu=False,
    )
    opt = KBertAdam(cfg, model.parameters())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # no gradient: only the decay moves a parameter
    opt.step()
    weight, bias, ln_w, ln_b = model.parameters()
    assert torch.allclose(weight, before[0] * (1 - 0.1 * 0.01))
    for p, b in zip((bias, ln_w, ln_b), before[1:]):
        assert torch.equal(p, b)
    assert {g["betas"] for g in opt.param_groups} == {(0.9, 0.999)} and {g["eps"] for g in opt.param_groups} == {1e-6}
    # fairseq's resume overrides every group with the flags: the 1-D group keeps no decay
    opt.load_state_dict(opt.state_dict(), opt.optimizer_config)
    assert sorted(g["weight_decay"] for g in opt.param_groups) == [0.0, 0.01]
    assert not opt.supports_flat_params  # fairseq --fp16 asks for --fp16-no-flatten-grads


# --- every dev row counts ---------------------------------------------------------------------


def test_every_dev_row_counts_whatever_the_batch_multiple(tmp_path):
    rows = ["label\ttext_a"] + [f"{i % 2}\t{'头痛三天发热了'[: 2 + i % 5]}" for i in range(60)]
    data = tmp_path / "cls"
    data.mkdir()
    for split in ("train", "valid"):
        (data / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (data / "dict.txt").write_text("".join(f"{c} 1\n" for c in "头痛三天发热了"), encoding="utf-8")
    task, _, _ = build_task_and_model(data, "kbert_small", *TINY, task="kbert_classification")
    ds = task.dataset("valid")
    by_keyword = task.get_batch_iterator(ds, max_sentences=16, required_batch_size_multiple=8)
    by_position = task.get_batch_iterator(ds, None, 16, None, False, 8)  # as fairseq-validate passes them
    for itr in (by_keyword, by_position):
        ids = [i for batch in itr.next_epoch_itr(shuffle=False) for i in batch["id"].tolist()]
        assert sorted(ids) == list(range(60))


# --- bad input: path:line and exit 2 -----------------------------------------------------------


def test_prep_refuses_a_dev_tag_that_training_never_has(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.tsv").write_text("text_a\tlabel\n头 痛\tB-Symptom I-Symptom\n", encoding="utf-8")
    (raw / "dev.tsv").write_text("text_a\tlabel\n头 痛\tB-Symptom I-Symptom\n发 热\tB-Disease O\n", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "fairseq_knowgen.prep.kbert", "--data", raw, "--out", tmp_path / "out", "--tagging"],
        cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"{raw}/dev.tsv:3: tag 'B-Disease' is not among the training tags" in proc.stderr
    assert not (tmp_path / "out" / "data" / "labels.txt").exists()


@pytest.mark.parametrize(
    "bad,where",
    [
        ("kg", "kg.spo:2: expected subject<TAB>predicate<TAB>object, found 2 field(s)"),
        ("tsv", "valid.tsv:3: 3 TAB-separated column(s), the header has 2"),
        ("label", "valid.tsv:2: tag 'B-Disease' not among the training tags"),
    ],
)
def test_fairseq_train_stops_on_bad_input_with_path_line_and_exit_2(tmp_path, bad, where):
    dev = None
    if bad == "tsv":
        dev = ["text_a\tlabel", "头 痛\tB-Symptom I-Symptom", "发 热\tO O\tX"]
    elif bad == "label":
        dev = ["text_a\tlabel", "头 痛\tB-Disease I-Symptom"]
    data = tagging_folder(tmp_path, dev)
    if bad == "kg":
        (data / "kg.spo").write_text("头痛\t类别\t症状\n头痛\t部位\n", encoding="utf-8")
    proc = subprocess.run(
        [os.path.join(BIN, "fairseq-train"), data, "--user-dir", os.path.join(ROOT, "fairseq_knowgen"),
         "--task", "kbert_tagging", "--kg", data / "kg.spo", "--arch", "kbert_small", *TINY,
         "--criterion", "kbert_tagging", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "2",
         "--max-update", "1", "--cpu", "--save-dir", tmp_path / "ckpt", "--data-buffer-size", "0"],
        cwd=tmp_path, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert where in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")


def test_a_pretrained_encoder_of_other_sizes_than_the_flags_is_refused(tmp_path, capsys):
    from test_convert_hf_bert import tiny_bert

    hf_dir, _ = tiny_bert(str(tmp_path / "hf"))  # 2 layers x 16
    from fairseq_knowgen.convert.hf_bert import convert

    convert(hf_dir, str(tmp_path / "bert"))
    data = tmp_path / "data"
    data.mkdir()
    (data / "dict.txt").write_bytes((tmp_path / "bert" / "dict.txt").read_bytes())
    for split in ("train", "valid"):
        (data / f"{split}.tsv").write_text("label\ttext_a\n0\t的一\n1\t是在\n", encoding="utf-8")
    ckpt = tmp_path / "bert" / "model.pt"
    pos = ["--max-positions", "40"]  # the tiny BERT has 48 positions
    _, model, args = build_task_and_model(
        data, "kbert_base", "--kbert-pretrained", ckpt, *pos, task="kbert_classification"
    )
    assert (args.encoder_layers, args.encoder_embed_dim, args.encoder_ffn_embed_dim) == (2, 16, 64)
    with pytest.raises(SystemExit) as e:
        build_task_and_model(
            data, "kbert_base", "--kbert-pretrained", ckpt, "--encoder-layers", "3", *pos, task="kbert_classification"
        )
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"error: {ckpt}: the pretrained encoder has --encoder-layers 2" in err, err
