"""EKI: distances, labels and groups (hand computations), scaling module, L_E, position
indicator, models (incremental decoding, BART fine-tuning), fairseq-train/generate."""

import math

import pytest
import torch
from conftest import TINY_BART, TINY_MODEL, TRAIN_COMMON, pretrain_tiny_bart, run_cli
from fairseq.data import Dictionary, LanguagePairDataset
from fairseq.modules import MultiheadAttention

from fairseq_knowgen.criterions.eki_label_smoothed_cross_entropy import token_classification_loss
from fairseq_knowgen.data.eki_dataset import EKIDataset
from fairseq_knowgen.modules.position_indicator import PositionIndicatorAttention, prototype_distances
from fairseq_knowgen.modules.scaling_module import ScalingModule


def test_distances_hand_computed():
    # centers at 1 and 4: D = min |v - p| + 1
    assert prototype_distances([False, True, False, False, True, False], 64) == [2, 1, 2, 2, 1, 2]
    assert prototype_distances([False, False], 9) == [9, 9]  # no concept in the prototype
    assert prototype_distances([True] + [False] * 10, 5) == [1, 2, 3, 4, 5, 5, 5, 5, 5, 5, 5]  # clipped


def make_dict(words):
    d = Dictionary()
    for w in words:
        d.add_symbol(w)
    return d


def encode(d, text):
    return torch.tensor([d.index(w) for w in text.split()] + [d.eos()])


# this package's data settings before the faithful defaults (the one-hour rows): the hand computations below
LEGACY = dict(layout="sep", center_match="lemma", label_unit="word")


def test_annotations_on_subwords_hand_computed():
    d = make_dict("dog run <sep> the dog@@ s are run@@ ning fast runs".split())
    src = encode(d, "dog run <sep> the dog@@ s are run@@ ning fast")
    tgt = encode(d, "the dog runs")
    ds = EKIDataset(
        LanguagePairDataset(src=[src], src_sizes=[len(src)], src_dict=d, tgt=[tgt], tgt_sizes=[len(tgt)], tgt_dict=d),
        d,
        **LEGACY,
    )
    a = ds.annotate(src, tgt)
    # prototype words the | dog@@ s | are | run@@ ning | fast: lemmas dog, run match the concepts,
    # so pieces 1, 2, 4, 5 of the prototype are centers; </s> is one past the last piece
    assert a["distance"].tolist() == [0, 0, 0, 2, 1, 1, 2, 1, 1, 2, 3]
    assert a["group"].tolist() == [1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2]
    # I{s_v in T} (Eq. 6): 'dog' and 'the' occur in the target, the concept 'run' does not ('runs'
    # does), 'dog@@' is not the id of 'dog'; <sep> and </s> are left out (-1)
    assert a["label"].tolist() == [1, 0, -1, 1, 0, 0, 0, 0, 0, 0, -1]


def test_distances_are_not_clipped_by_the_data():
    # the model clamps at its own --eki-max-distance; the data must not clip below it
    d = make_dict("dog cat <sep> the".split())
    src = encode(d, "dog cat <sep> dog" + " the" * 80)
    a = EKIDataset(LanguagePairDataset([src], [len(src)], d, [src], [len(src)], d), d).annotate(src, None)
    # concepts and <sep> 0, 'dog' the center (1), the k-th 'the' k + 1, </s> 82
    assert a["distance"].tolist() == [0, 0, 0, 1] + list(range(2, 82)) + [82]


def test_collater_pads_annotations_like_the_source():
    d = make_dict("a b <sep> c e f".split())
    srcs = [encode(d, "a <sep> c"), encode(d, "a b <sep> c e f")]
    tgts = [encode(d, "c"), encode(d, "e f")]
    ds = EKIDataset(LanguagePairDataset(srcs, [len(s) for s in srcs], d, tgts, [len(t) for t in tgts], d), d)
    batch = ds.collater([ds[0], ds[1]])
    toks, group = batch["net_input"]["src_tokens"], batch["net_input"]["src_group"]
    assert (toks.eq(d.pad()) == group.eq(0)).all()  # same (left) padding
    assert batch["src_label"][toks.eq(d.pad())].eq(-1).all()
    for row, i in enumerate(batch["id"].tolist()):
        real = toks[row].ne(d.pad())
        assert group[row][real].tolist() == ds[i]["group"].tolist()
        assert batch["net_input"]["src_distance"][row][real].tolist() == ds[i]["distance"].tolist()


def test_missing_separator_is_a_clear_error():
    d = make_dict("a b".split())
    src = encode(d, "a b")
    with pytest.raises(ValueError, match="no '<sep>' symbol"):
        EKIDataset(LanguagePairDataset([src], [3], d, [src], [3], d), d, path="data:train")


def test_scaling_module_starts_near_identity():
    torch.manual_seed(0)
    m = ScalingModule(32, 16, init_std=1e-3)
    h = torch.randn(5, 3, 32)
    out, lam = m(h)
    assert (2 * lam - 1).abs().max() < 1e-2
    torch.testing.assert_close(out, h, atol=2e-2 * h.abs().max().item(), rtol=0)


def test_token_loss_hand_computed():
    lam = torch.tensor([[0.8, 0.3, 0.6]])
    labels = torch.tensor([[1.0, 0.0, -1.0]])  # third is padding
    loss, correct, n = token_classification_loss(lam, labels)
    assert loss.item() == pytest.approx(-math.log(0.8) - math.log(0.7), rel=1e-5)
    assert correct.item() == 2 and n.item() == 2


def test_token_loss_is_the_bce_formula_on_a_grid():
    """L_E = -sum [y log p + (1 - y) log(1 - p)] over labelled tokens, computed here with math,
    at the clamp's edges too (p = 0 and 1 are clamped to 1e-6 and 1 - 1e-6)."""
    ps = [0.0, 1e-7, 0.05, 0.3, 0.5, 0.77, 0.999, 1.0]
    ys = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    loss, correct, n = token_classification_loss(torch.tensor([ps]), torch.tensor([ys]))
    clamped = [min(max(p, 1e-6), 1 - 1e-6) for p in ps]
    want = -sum(y * math.log(p) + (1 - y) * math.log(1 - p) for p, y in zip(clamped, ys))
    assert loss.item() == pytest.approx(want, rel=1e-3)  # float32: 1 - (1 - 1e-6) is 1.01e-6
    assert n.item() == 8 and correct.item() == sum((p > 0.5) == (y == 1) for p, y in zip(clamped, ys))


class UniformLMWithLambda(torch.nn.Module):
    """A stand-in model: uniform next-token distribution, a fixed Mean(Lambda) per source token."""

    def __init__(self, vocab, lambda_mean):
        super().__init__()
        self.vocab, self.lambda_mean = vocab, lambda_mean

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):
        logits = torch.zeros(*prev_output_tokens.shape, self.vocab)
        return logits, {"eki_lambda_mean": self.lambda_mean}

    def get_normalized_probs(self, net_output, log_probs, sample=None):
        return torch.log_softmax(net_output[0], -1)

    def get_targets(self, sample, net_output):
        return sample["target"]


@pytest.mark.parametrize("concept_label", ["target", "always"])
def test_l_e_labels_loss_and_accuracy_hand_computed(concept_label):
    from types import SimpleNamespace

    from fairseq_knowgen.criterions.eki_label_smoothed_cross_entropy import EKILabelSmoothedCrossEntropyCriterion

    d = make_dict("dog run <sep> the dog@@ s are run@@ ning fast runs".split())
    src = encode(d, "dog run <sep> the dog@@ s are run@@ ning fast")
    tgt = encode(d, "the dog runs")
    ds = EKIDataset(LanguagePairDataset([src], [len(src)], d, [tgt], [len(tgt)], d), d, layout="sep")
    sample = ds.collater([ds[0]])
    # Mean(Lambda) per source token; <sep> (0.9) and </s> (0.1) would count as errors if labelled
    #       dog  run  <sep> the  dog@@ s    are  run@@ ning fast </s>
    lam = [[0.9, 0.4, 0.9, 0.7, 0.2, 0.3, 0.6, 0.1, 0.2, 0.4, 0.1]]
    # by hand, (Mean(Lambda), label) of the 9 labelled tokens: 'dog', 'the' occur in the target;
    # the concept 'run' does not ('runs' does): label 0 by Eq. 6, 1 under 'always'
    run_label = 1 if concept_label == "always" else 0
    pairs = [(0.9, 1), (0.4, run_label), (0.7, 1), (0.2, 0), (0.3, 0), (0.6, 0), (0.1, 0), (0.2, 0), (0.4, 0)]
    bce = -sum(math.log(p) if y else math.log(1 - p) for p, y in pairs)
    correct = sum((p > 0.5) == bool(y) for p, y in pairs)  # 8 ('are' wrong), 7 under 'always' ('run' too)
    flag = {} if concept_label == "target" else {"eki_concept_label": concept_label}  # 'target' is the default
    crit = EKILabelSmoothedCrossEntropyCriterion(
        SimpleNamespace(target_dictionary=d), False, 0.0, eki_lambda=0.5, **flag
    )
    loss, _, log = crit(UniformLMWithLambda(len(d), torch.tensor(lam)), sample)
    assert log["n_e"].item() == 9 and log["correct_e"].item() == correct == (7 if run_label else 8)
    assert log["loss_e"].item() == pytest.approx(bce, rel=1e-5)
    # L_D of a uniform model without smoothing: 4 target tokens x log |V|
    assert loss.item() == pytest.approx(4 * math.log(len(d)) + 0.5 * bce, rel=1e-5)


def test_position_indicator_attention():
    torch.manual_seed(0)
    ref = MultiheadAttention(8, 2, encoder_decoder_attention=True)
    pia = PositionIndicatorAttention(8, 2, max_distance=4, distance_init_std=0)
    loaded = pia.load_state_dict(ref.state_dict(), strict=False)
    assert loaded.missing_keys == ["distance_embed.weight"] and not loaded.unexpected_keys
    q, kv = torch.randn(3, 2, 8), torch.randn(5, 2, 8)
    dist = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 1, 1, 4]])
    torch.testing.assert_close(pia(q, kv, kv, distances=dist)[0], ref(q, kv, kv, static_kv=True)[0])  # E_D = 0
    with torch.no_grad():
        pia.distance_embed.weight.normal_()
    out, w = pia(q, kv, kv, distances=dist, need_head_weights=True)
    # by hand: softmax((W_q q)(W_k k + E_D(D))^T / sqrt(d_k)) per head
    Q = pia.q_proj(q).transpose(0, 1).view(2, 3, 2, 4)  # B x T x H x dh
    K = (pia.k_proj(kv).transpose(0, 1) + pia.distance_embed(dist)).view(2, 5, 2, 4)
    logits = torch.einsum("bthd,bshd->hbts", Q, K) / math.sqrt(4)
    torch.testing.assert_close(w, torch.softmax(logits, -1), atol=1e-5, rtol=1e-5)
    V = pia.v_proj(kv).transpose(0, 1).view(2, 5, 2, 4)
    heads = torch.einsum("hbts,bshd->tbhd", torch.softmax(logits, -1), V).reshape(3, 2, 8)
    torch.testing.assert_close(out, pia.out_proj(heads), atol=1e-5, rtol=1e-5)


EKI_TINY = [*TINY_MODEL, "--eki-scaling-dim", "8"]


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--eki-group-embeddings", "0", "--eki-position-layers", "-1"],
        ["--eki-scaling", "0", "--eki-position-indicator", "0"],
    ],
)
def test_incremental_equals_full(eki_bin, flags):
    from helpers import build_task_and_model, decode_full_and_stepwise, first_batch

    task, model, _ = build_task_and_model(eki_bin, "eki_transformer", *EKI_TINY, *flags, task="eki_generation")
    model.eval()
    with torch.no_grad():  # non-zero new parameters, so that every part matters
        for name, p in model.named_parameters():
            if "group_embedding" in name or "distance_embed" in name:
                p.normal_()
    net = first_batch(task)["net_input"]
    enc = model.encoder(net["src_tokens"], net["src_lengths"], net["src_group"], net["src_distance"])
    prev = net["prev_output_tokens"]
    (full, _), steps = decode_full_and_stepwise(model, enc, prev)
    real = prev.ne(task.target_dictionary.pad())
    torch.testing.assert_close(torch.cat([s[0] for s in steps], 1)[real], full[real], atol=1e-5, rtol=1e-5)
    names = [n for n, _ in model.named_parameters()]
    assert any("group_embedding" in n for n in names) == ("--eki-group-embeddings" not in flags)
    assert any("scaling" in n for n in names) == ("--eki-scaling" not in flags)
    n_pia = sum(isinstance(m, PositionIndicatorAttention) for m in model.modules())
    assert n_pia == (0 if "--eki-position-indicator" in flags else 1 if "-1" in flags else 2)


def test_train_with_token_loss_and_generate(eki_bin, tmp_path):
    import json

    out = run_cli(
        "fairseq-train",
        eki_bin,
        *TRAIN_COMMON,
        "--task",
        "eki_generation",
        "--arch",
        "eki_transformer",
        *EKI_TINY,
        "--criterion",
        "eki_label_smoothed_cross_entropy",
        "--eki-lambda",
        "1.0",
        "--label-smoothing",
        "0.1",
        "--lr",
        "3e-3",
        "--max-update",
        "25",
        "--save-dir",
        tmp_path,
        "--log-format",
        "json",
    )
    inner = [
        json.loads(line[line.index("{") :])
        for line in (out.stdout + out.stderr).splitlines()
        if "| train_inner |" in line
    ]
    assert "loss_e" in inner[0] and float(inner[-1]["loss"]) < float(inner[0]["loss"])
    gen = run_cli(
        "fairseq-generate",
        eki_bin,
        "--user-dir",
        "fairseq_knowgen",
        "--cpu",
        "--task",
        "eki_generation",
        "--path",
        tmp_path / "checkpoint_last.pt",
        "--beam",
        "5",
        "--batch-size",
        "4",
        "--gen-subset",
        "valid",
        "--required-batch-size-multiple",
        "1",
    )  # fairseq drops a batch when the size is not a multiple
    assert gen.stdout.count("\nH-") == 16


def test_eki_bart_finetunes_from_bart_checkpoint(eki_bin, tmp_path):
    pre = tmp_path / "bart"
    bart_path, bart = pretrain_tiny_bart(eki_bin, pre, updates=2)
    ft = tmp_path / "ft"
    out = run_cli(
        "fairseq-train",
        eki_bin,
        *TRAIN_COMMON,
        "--task",
        "eki_generation",
        "--arch",
        "eki_bart_base",
        *TINY_BART,
        "--eki-scaling-dim",
        "8",
        "--criterion",
        "eki_label_smoothed_cross_entropy",
        "--restore-file",
        bart_path,
        "--reset-optimizer",
        "--reset-dataloader",
        "--reset-meters",
        "--reset-lr-scheduler",
        "--lr",
        "1e-12",
        "--max-update",
        "1",
        "--save-dir",
        ft,
    )
    assert f"Loaded checkpoint {bart_path}" in out.stdout + out.stderr
    tuned = torch.load(ft / "checkpoint_last.pt")["model"]
    for k, v in bart.items():
        torch.testing.assert_close(tuned[k], v, atol=1e-6, rtol=0)
    new = [k for k in tuned if k not in bart]
    assert any("group_embedding" in k for k in new) and any("distance_embed" in k for k in new)
    assert all(tuned[k].abs().max() < 0.1 for k in new if "group_embedding" in k or "distance_embed" in k)


@pytest.fixture(scope="module")
def far_bin(tmp_path_factory):
    """Prototypes far from (or without) a concept: 'dog cat ball <sep> dog the the ...' (the
    k-th prototype token at distance k) and 'dog cat ball <sep> the river ...' (no center)."""
    from conftest import preprocess

    raw = tmp_path_factory.mktemp("farraw")
    src = ["dog cat ball <sep> dog" + " the" * 74, "dog cat ball <sep> the river and the boat"]
    src += ["dog cat ball <sep> dog" + " the" * 40, "dog cat ball <sep> a boat on the river"]
    tgt = ["the dog and the cat play with a ball"] * 4
    for split, k in (("train", 4), ("valid", 2)):  # fairseq drops a last batch of fewer than 8
        (raw / f"{split}.src").write_text("\n".join(src * k) + "\n")
        (raw / f"{split}.tgt").write_text("\n".join(tgt * k) + "\n")
    out = tmp_path_factory.mktemp("farbin")
    preprocess(raw, out, "train", "valid")
    return out


def hand_distances(tokens, d, max_distance):
    """Eq. 7-8 for far_bin's sources as the model reads them (``<s> dog cat ball O </s>``),
    clipped at the model's bound: 0 for <s> and the three concepts; then k for the k-th
    prototype token (</s> included) when the prototype starts with the concept 'dog', else (no
    concept in it) the bound."""
    start = 4
    assert tokens[0] == d.bos() and d.index("<sep>") not in tokens
    centered = tokens[start] == d.index("dog")
    return [0] * start + [min(k, max_distance) if centered else max_distance for k in range(1, len(tokens) - start + 1)]


@pytest.mark.parametrize("max_distance", [3, 70])
def test_generation_uses_the_checkpoints_max_distance(far_bin, tmp_path, max_distance):
    """fairseq-generate's path (task from the command line, which has no --eki-max-distance;
    model from the checkpoint) decodes with the bound the model was trained with."""
    from fairseq import checkpoint_utils, options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from helpers import first_batch

    run_cli(
        "fairseq-train",
        far_bin,
        *TRAIN_COMMON,
        "--task",
        "eki_generation",
        "--arch",
        "eki_transformer",
        *EKI_TINY,
        "--eki-max-distance",
        max_distance,
        "--criterion",
        "eki_label_smoothed_cross_entropy",
        "--max-update",
        "1",
        "--save-dir",
        tmp_path,
    )
    path = tmp_path / "checkpoint_last.pt"
    state = torch.load(path)
    torch.manual_seed(0)
    for k, v in state["model"].items():  # E_D far from zero, so that every distance matters
        if "distance_embed" in k:
            assert v.size(0) == max_distance + 1
            v.normal_()
    torch.save(state, path)

    gen_args = [far_bin, "--user-dir", "fairseq_knowgen", "--task", "eki_generation", "--path", path, "--cpu"]
    gen_args += ["--beam", "2", "--max-len-a", "0", "--max-len-b", "6"]
    args = options.parse_args_and_arch(options.get_generation_parser(), list(map(str, gen_args)))
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    models, _ = checkpoint_utils.load_model_ensemble([str(path)], task=task)
    task.load_dataset("valid")
    batch = first_batch(task)
    d = task.source_dictionary
    net = batch["net_input"]
    assert net["src_distance"].max() > max_distance  # the batch holds distances the model must clamp
    hypos = task.inference_step(task.build_generator(models, cfg.generation), models, batch)

    model = models[0].eval()
    for b, nbest in enumerate(hypos):
        real = net["src_tokens"][b].ne(d.pad())
        src = net["src_tokens"][b][real].unsqueeze(0)
        dist = torch.tensor([hand_distances(src[0].tolist(), d, max_distance)])
        h = nbest[0]["tokens"].unsqueeze(0)
        prev = torch.cat([h.new_full((1, 1), d.eos()), h[:, :-1]], 1)
        with torch.no_grad():
            out = model(src, net["src_lengths"][b : b + 1], prev, net["src_group"][b][real].unsqueeze(0), dist)
            lprobs = model.get_normalized_probs(out, log_probs=True)
        scores = lprobs.gather(-1, h.unsqueeze(-1)).view(-1)
        torch.testing.assert_close(nbest[0]["positional_scores"], scores, atol=1e-4, rtol=1e-4)

    # a checkpoint of the old version saved the task's copy of the flag: it still loads
    state["cfg"]["task"]["eki_max_distance"] = 64
    torch.save(state, tmp_path / "old.pt")
    models, _, old_task = checkpoint_utils.load_model_ensemble_and_task([str(tmp_path / "old.pt")])
    assert type(old_task).__name__ == "EKIGenerationTask"
    assert {m.max_distance for m in models[0].modules() if isinstance(m, PositionIndicatorAttention)} == {max_distance}
