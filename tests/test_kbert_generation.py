"""kbert_transformer: K-BERT's encoder under fairseq's decoder, on linearized triples with a KG
built from the training triples; incremental decoding, beam search, training and generation."""

import pytest
import torch
from conftest import TRAIN_COMMON, run_cli
from fairseq.data import Dictionary, LanguagePairDataset
from fairseq.data.data_utils import collate_tokens
from helpers import build_task_and_model, decode_full_and_stepwise

from fairseq_knowgen.data.constraints import pack_example
from fairseq_knowgen.data.kbert_dataset import KBertPairDataset, source_facts
from fairseq_knowgen.modules.knowledge_graph import KnowledgeGraph, word_tokenize
from fairseq_knowgen.modules.sentence_tree import build_sentence_tree
from fairseq_knowgen.prep.kbert import webnlg_triples

SIZES = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16"]
SIZES += ["--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32"]
SIZES += ["--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings"]


def test_webnlg_kg_is_the_training_triples_once_in_order():
    src = [
        "<S> Ann Lee <P> birth place <O> Kyoto <S> Ann Lee <P> club <O> Red FC",
        "<S> Ann Lee <P> birth place <O> Kyoto",
    ]
    assert webnlg_triples(src) == [("Ann Lee", "birth place", "Kyoto"), ("Ann Lee", "club", "Red FC")]


def test_facts_the_source_states_are_not_injected_again():
    kg = KnowledgeGraph(
        [("Ann Lee", "birth place", "Kyoto"), ("Ann Lee", "club", "Red FC"), ("Ann Lee", "team", "Blue")],
        tokenize=word_tokenize,
    )
    words = "<S> Ann Lee <P> birth place <O> Kyoto".split()
    facts = source_facts(words)
    assert facts == {(("Ann", "Lee"), ("birth", "place"), ("Kyoto",))}
    tree = build_sentence_tree(words, kg, "predicate-object", exclude=facts)
    # the two other facts, in file order; "birth place Kyoto" is already in the source
    assert " ".join(tree.tokens) == "<S> Ann Lee club Red FC team Blue <P> birth place <O> Kyoto"


@pytest.fixture(scope="module")
def webnlg_like(tiny_raw, tiny_bin, tmp_path_factory):
    kg = tmp_path_factory.mktemp("kbertkg") / "kg.spo"
    run_cli("-m", "fairseq_knowgen.prep.kbert", "webnlg-kg", "--src", tiny_raw / "train.src", "--out", kg)
    return tiny_bin, kg


def test_incremental_decoding_equals_full_decoding_over_a_tree_source(webnlg_like):
    data, kg = webnlg_like
    task, model, _ = build_task_and_model(
        data,
        "kbert_transformer",
        *SIZES,
        "--task",
        "kbert_translation",
        "--kg",
        kg,
        "--train-subset",
        "valid",
        task="kbert_translation",
    )
    model.eval()
    task.load_dataset("train")
    batches = task.get_batch_iterator(task.dataset("train"), max_sentences=8).next_epoch_itr(shuffle=False)
    batch = next(b for b in batches if b["net_input"]["branch_ids"].gt(0).any())  # with injected knowledge
    net = batch["net_input"]
    enc = model.encoder(net["src_tokens"], net["soft_positions"], net["branch_ids"], net["mention_ids"])
    prev = net["prev_output_tokens"]
    (full, _), steps = decode_full_and_stepwise(model, enc, prev)
    real = prev.ne(task.target_dictionary.pad())  # padding after EOS differs in fairseq's transformer too
    torch.testing.assert_close(torch.cat([s[0] for s in steps], 1)[real], full[real], atol=1e-5, rtol=1e-5)
    # beam search reorders the encoder output with every extra tensor
    order = torch.tensor([1, 0] + list(range(2, net["src_tokens"].size(0))))
    reordered = model.encoder.reorder_encoder_out(enc, order)
    assert torch.equal(reordered["encoder_out"][0], enc["encoder_out"][0][:, order])
    assert torch.equal(reordered["encoder_padding_mask"][0], enc["encoder_padding_mask"][0][order])


def test_trains_with_fairseq_train_and_decodes_with_fairseq_generate(webnlg_like, tmp_path):
    data, kg = webnlg_like
    task = ["--task", "kbert_translation", "--kg", kg]
    run_cli(
        "fairseq-train",
        data,
        *TRAIN_COMMON,
        *task,
        "--arch",
        "kbert_transformer",
        *SIZES,
        "--criterion",
        "label_smoothed_cross_entropy",
        "--max-update",
        "3",
        "--save-dir",
        tmp_path,
    )
    proc = run_cli(
        "fairseq-generate",
        data,
        "--user-dir",
        "fairseq_knowgen",
        *task,
        "--path",
        tmp_path / "checkpoint_last.pt",
        "--beam",
        "3",
        "--batch-size",
        "8",
        "--max-len-b",
        "10",
        "--cpu",
        "--gen-subset",
        "valid",
    )
    hyps = [line for line in proc.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) == 24
    assert "injected tokens kept" in proc.stderr


def test_facts_hang_on_the_first_mention_only_when_asked():
    kg = KnowledgeGraph([("Ann", "club", "Red")], tokenize=word_tokenize)
    words = "<S> Ann <P> a <O> b <S> Ann <P> c <O> d".split()
    assert (
        " ".join(build_sentence_tree(words, kg, "object", once=True).tokens)
        == "<S> Ann Red <P> a <O> b <S> Ann <P> c <O> d"
    )
    assert " ".join(build_sentence_tree(words, kg, "object").tokens).count("Red") == 2


def test_webnlg_recipe_trains_decodes_and_scores_kbert_transformer(tmp_path):
    """examples/webnlg/run.sh with ARCH=kbert_transformer and the KG of its raw/train.src, through
    training, fairseq-generate and scoring, on tiny WebNLG XML."""
    import json
    import os
    import random
    import subprocess

    from conftest import ROOT
    from test_recipes import RECIPE_ENV, webnlg_entries, webnlg_xml

    rng, data, out = random.Random(0), tmp_path / "webnlg", tmp_path / "out"
    for split, cats, n in (("train", ("Artist", "City"), 30), ("dev", ("Artist",), 6)):
        folder = data / split / "1triples"
        folder.mkdir(parents=True)
        for cat in cats:
            (folder / f"{cat}.xml").write_text(webnlg_xml(webnlg_entries(rng, cat, n)))
    env = dict(os.environ, **RECIPE_ENV, HELDOUT="", ENTITIES="0")  # the KG is looked up on the source's words

    def recipe(**extra):
        proc = subprocess.run(
            ["bash", "examples/webnlg/run.sh", data, out],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
            env=dict(env, **extra),
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    recipe(STOP_STAGE="3")
    kg = out / "raw" / "kg.spo"
    run_cli("-m", "fairseq_knowgen.prep.kbert", "webnlg-kg", "--src", out / "raw" / "train.src", "--out", kg)
    task_args = f"--task kbert_translation --kg {kg}"
    recipe(STAGE="4", NAME="kbert", ARCH="kbert_transformer", TASK_ARGS=task_args)
    assert "injected tokens kept" in (out / "runs" / "kbert" / "train.log").read_text()
    scores = json.loads((out / "runs" / "kbert" / "valid.scores.json").read_text())
    assert "bleu4" in next(iter(scores.values()))


def test_tree_sources_keep_the_lexical_constraints_of_their_inputs():
    # kbert_translation with --constraints-from: the tree dataset replaced the binarized pair and
    # dropped its constraints, so fairseq-generate --constraints stopped inside fairseq's search
    # (TypeError: 'NoneType' object is not iterable)
    d = Dictionary()
    for w in "Ann Lee club Red FC Kyoto born in".split():
        d.add_symbol(w)
    kg = KnowledgeGraph([("Ann Lee", "club", "Red FC")], tokenize=word_tokenize)
    src = [d.encode_line(s, add_if_not_exist=False) for s in ("Ann Lee born in Kyoto", "Kyoto")]
    sizes = [len(s) for s in src]
    pair = LanguagePairDataset(src, sizes, d, src, sizes, d, shuffle=False)  # targets: the sources
    wanted = [[d.encode_line("Kyoto", append_eos=False)], []]
    pair.constraints = [pack_example(c) for c in wanted]
    trees = KBertPairDataset(pair, kg, "predicate-object", 64)
    assert trees.src[0].numel() > src[0].numel()  # the fact was injected
    batch = trees.collater([trees[0], trees[1]])
    assert torch.equal(batch["constraints"], collate_tokens(pair.constraints, 0))
