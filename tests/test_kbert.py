"""K-BERT's knowledge layer: sentence tree, soft positions, visible matrix, entity choice,
truncation, labels of injected tokens, bad input. Expected values are computed by hand from the
paper's definitions (K-BERT, section 02), not taken from the code."""

import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

from fairseq_knowgen.modules.knowledge_graph import KnowledgeGraph, control_triples, word_tokenize
from fairseq_knowgen.modules.sentence_tree import build_sentence_tree, visible_matrix

# the paper's Figure 1: "Tim Cook is visiting Beijing now"; the CEO branch hangs on Cook
PAPER_TRIPLES = [("Cook", "CEO", "Apple"), ("Beijing", "capital", "China"), ("Beijing", "is_a", "City")]
PAPER_TREE = "Tim Cook CEO Apple is visiting Beijing capital China is_a City now".split()
# soft positions as printed in the paper (1-based: [CLS] is 0)
PAPER_SOFT = [1, 2, 3, 4, 3, 4, 5, 6, 7, 6, 7, 6]
# the 12 x 12 visible matrix by hand: trunk sees trunk; Cook also sees CEO Apple; CEO/Apple see
# their branch and Cook; Beijing sees both of its branches, which see Beijing and themselves only
PAPER_VISIBLE = [
    "110011100001",  # Tim
    "111111100001",  # Cook
    "011100000000",  # CEO
    "011100000000",  # Apple
    "110011100001",  # is
    "110011100001",  # visiting
    "110011111111",  # Beijing
    "000000111000",  # capital
    "000000111000",  # China
    "000000100110",  # is_a
    "000000100110",  # City
    "110011100001",  # now
]


def paper_tree():
    kg = KnowledgeGraph(PAPER_TRIPLES, tokenize=word_tokenize)
    return build_sentence_tree("Tim Cook is visiting Beijing now".split(), kg, "predicate-object", start_position=1)


def as_matrix(rows):
    return torch.tensor([[c == "1" for c in r] for r in rows])


def test_paper_sentence_tree_soft_positions_and_visible_matrix():
    tree = paper_tree()
    assert tree.tokens == PAPER_TREE
    assert tree.soft_positions == PAPER_SOFT
    vm = visible_matrix(torch.tensor([tree.branch_ids]), torch.tensor([tree.mention_ids]))[0]
    assert torch.equal(vm, as_matrix(PAPER_VISIBLE))
    assert tree.trunk_index == [0, 1, 4, 5, 6, 11]


def test_every_token_of_a_multi_token_mention_sees_its_branches():
    """At character level a mention is several tokens (北京): each of them sees the branch (as the
    original code's per-word visibility does), the other trunk tokens do not."""
    kg = KnowledgeGraph([("北京", "首都", "中国")])
    tree = build_sentence_tree(list("去北京了"), kg, "object")
    assert tree.tokens == list("去北京中国了")
    assert tree.soft_positions == [0, 1, 2, 3, 4, 3]
    vm = visible_matrix(torch.tensor([tree.branch_ids]), torch.tensor([tree.mention_ids]))[0]
    assert torch.equal(vm, as_matrix(["111001", "111111", "111111", "011110", "011110", "111001"]))


def test_padding_keys_are_invisible_and_padded_rows_see_themselves():
    tree = paper_tree()
    n = len(tree)
    branch = torch.tensor([tree.branch_ids + [0, 0]])
    mention = torch.tensor([tree.mention_ids + [0, 0]])
    pad = torch.tensor([[False] * n + [True, True]])
    vm = visible_matrix(branch, mention, pad)[0]
    assert torch.equal(vm[:n, :n], as_matrix(PAPER_VISIBLE))
    assert not vm[:n, n:].any()
    assert torch.equal(vm[n:], torch.tensor([[False] * n + [True, False], [False] * n + [False, True]]))


def test_entities_in_file_order_up_to_max_entities():
    triples = [("苹果", "类别", f"对象{i}") for i in range(5)]
    kg = KnowledgeGraph(triples, max_entities=2)
    assert build_sentence_tree(list("吃苹果"), kg, "object").tokens == list("吃苹果对象0对象1")
    kg3 = KnowledgeGraph(triples, max_entities=3)
    assert build_sentence_tree(list("吃苹果"), kg3, "predicate-object").tokens == list(
        "吃苹果类别对象0类别对象1类别对象2"
    )


SEED_SCRIPT = """
from fairseq_knowgen.modules.knowledge_graph import KnowledgeGraph
from fairseq_knowgen.modules.sentence_tree import build_sentence_tree
kg = KnowledgeGraph([("ab", "p", o) for o in ["x", "y", "z", "u", "v", "w", "q", "r"]], max_entities=2)
print(" ".join(build_sentence_tree(list("cab"), kg, "object").tokens))
"""


def test_entity_choice_does_not_depend_on_the_hash_seed():
    """The original code's list(set(...))[:2] picks different triples under different
    PYTHONHASHSEEDs; here the first two in file order, whatever the seed."""
    outs = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed, OMP_NUM_THREADS="1")
        proc = subprocess.run([sys.executable, "-c", SEED_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        outs.add(proc.stdout.strip())
    assert outs == {"c a b x y"}


def test_longest_match_without_overlap():
    kg = KnowledgeGraph([("ab", "p", "X"), ("abc", "p", "Y"), ("cd", "p", "Z"), ("d", "p", "W")])
    assert kg.mentions(list("abcde")) == [(0, 3), (3, 4)]  # abc (longest) then d; cd overlaps abc
    assert kg.mentions(list("xabx")) == [(1, 3)]


def truncation_kg():
    # b: two branches of 2 tokens; e: one branch of 3 tokens; sentence abcdef -> 6 + 4 + 3 = 13 tokens
    return KnowledgeGraph([("b", "p", "xy"), ("b", "q", "zw"), ("e", "p", "uvt")], max_entities=2)


@pytest.mark.parametrize(
    "max_len,tokens,dropped_branches,dropped_trunk",
    [
        (13, "abxyzwcdeuvtf", 0, 0),
        (12, "abxyzwcdef", 1, 0),  # e's branch (the last mention's) goes first
        (8, "abxycdef", 2, 0),  # then b's second branch
        (6, "abcdef", 3, 0),  # all branches before any sentence token
        (4, "abcd", 3, 2),  # only a sentence longer than max_len loses its tail
    ],
)
def test_truncation_drops_branches_before_sentence_tokens(max_len, tokens, dropped_branches, dropped_trunk):
    tree = build_sentence_tree(list("abcdef"), truncation_kg(), "object", max_len=max_len)
    assert "".join(tree.tokens) == tokens
    assert (tree.dropped_branches, tree.dropped_trunk) == (dropped_branches, dropped_trunk)
    assert len(tree) <= max_len
    assert [tree.tokens[i] for i in tree.trunk_index] == list("abcdef")[: len(tree.trunk_index)]


def test_control_kg_keeps_subjects_predicates_and_the_multiset_of_objects():
    triples = [(f"s{i}", f"p{i % 3}", f"o{i}") for i in range(50)]
    control = control_triples(triples, seed=1)
    assert [(s, p) for s, p, _ in control] == [(s, p) for s, p, _ in triples]
    assert sorted(o for _, _, o in control) == sorted(o for _, _, o in triples)
    assert sum(a[2] != b[2] for a, b in zip(control, triples)) > 40
    assert control == control_triples(triples, seed=1)


def write(path, text):
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_injected_tokens_are_never_labelled(tmp_path):
    from fairseq.data import Dictionary

    from fairseq_knowgen.data.kbert_dataset import IGNORE, KBertDataset, read_tsv

    tsv = write(tmp_path / "t.tsv", "text_a\tlabel\n头 痛 三 天\tB-Symptom I-Symptom O O\n")
    kg = KnowledgeGraph([("头痛", "类别", "症状"), ("头痛", "部位", "头部")], max_entities=2)
    d = Dictionary()
    for c in "头痛三天类别症状部位头部":
        d.add_symbol(c)
    tags = ["B-Symptom", "I-Symptom", "O"]
    ds = KBertDataset(read_tsv(str(tsv), True), d, {t: i for i, t in enumerate(tags)}, kg, "object", 64, True)
    sample = ds.collater([ds[0]])
    # <s> 头 痛 [症 状] [头 部] 三 天 </s>
    assert d.string(sample["net_input"]["src_tokens"][0, 1:-1]) == "头 痛 症 状 头 部 三 天"
    expected = [IGNORE, 0, 1, IGNORE, IGNORE, IGNORE, IGNORE, 2, 2, IGNORE]
    assert sample["target"][0].tolist() == expected
    assert sample["net_input"]["soft_positions"][0].tolist() == [0, 1, 2, 3, 4, 3, 4, 3, 4, 5]
    assert sample["net_input"]["branch_ids"][0].tolist() == [0, 0, 0, 1, 1, 2, 2, 0, 0, 0]
    assert ds.trunk_index[0].tolist() == [1, 2, 7, 8]


def test_tagging_loss_counts_only_sentence_characters(tmp_path):
    """The criterion's loss is the cross-entropy over the tagged (sentence) positions only: any
    logits at injected positions leave it unchanged."""
    import torch.nn.functional as F

    from fairseq_knowgen.criterions.kbert_tagging import KBertTaggingCriterion
    from fairseq_knowgen.data.kbert_dataset import IGNORE

    target = torch.tensor([[IGNORE, 0, 1, IGNORE, IGNORE, 2, IGNORE]])
    logits = torch.randn(1, 7, 3)

    class Model:
        def __call__(self, **kwargs):
            return logits, {}

    crit = KBertTaggingCriterion(task=None)
    sample = {"net_input": {}, "target": target, "ntokens": 7, "nsentences": 1}
    loss, size, _ = crit(Model(), sample)
    keep = [1, 2, 5]
    by_hand = F.cross_entropy(logits[0, keep], torch.tensor([0, 1, 2]), reduction="sum")
    assert size == 3 and torch.allclose(loss, by_hand)
    logits[0, [0, 3, 4, 6]] = torch.randn(4, 3) * 100
    assert torch.allclose(crit(Model(), sample)[0], by_hand)


# --- bad input: file:line, exit 2, nothing written ------------------------------------------


def prep_inputs(tmp_path, train_ner="text_a\tlabel\n头 痛\tB-Symptom I-Symptom\n", kg="头痛\t类别\t症状\n"):
    data = tmp_path / "data"
    data.mkdir()
    write(data / "train.tsv", train_ner)
    write(data / "dev.tsv", "text_a\tlabel\n头 痛\tB-Symptom I-Symptom\n")
    kg_path = write(tmp_path / "kg.spo", kg) if kg is not None else tmp_path / "missing.spo"
    return data, kg_path


@pytest.mark.parametrize(
    "case,message",
    [
        ("missing_kg", "missing.spo: knowledge graph file not found"),
        ("kg_two_fields", "kg.spo:2: expected subject<TAB>predicate<TAB>object, found 2 field(s)"),
        ("kg_four_fields", "kg.spo:3: expected subject<TAB>predicate<TAB>object, found 4 field(s)"),
        ("kg_empty_object", "kg.spo:2: empty object in subject<TAB>predicate<TAB>object"),
        ("kg_empty_subject", "kg.spo:1: empty subject in subject<TAB>predicate<TAB>object"),
        ("kg_bad_utf8", "kg.spo:2: not valid UTF-8"),
        ("tsv_columns", "train.tsv:3: 3 TAB-separated column(s), the header has 2"),
        ("tag_mismatch", "train.tsv:2: 2 tokens but 3 tags"),
    ],
)
def test_bad_input_names_file_and_line_and_writes_nothing(tmp_path, case, message):
    kwargs = {
        "missing_kg": {"kg": None},
        "kg_two_fields": {"kg": "头痛\t类别\t症状\n发热\t症状\n"},
        "kg_four_fields": {"kg": "头痛\t类别\t症状\n\n发热\t类别\t症状\t疾病\n"},  # the empty line 2 is skipped
        "kg_empty_object": {"kg": "头痛\t类别\t症状\n发热\t类别\t \n"},
        "kg_empty_subject": {"kg": "\t类别\t症状\n"},
        "kg_bad_utf8": {"kg": "头痛\t类别\t症状\n".encode() + b"\xff\t\xe7\xb1\t\xe7\x97\x87\n"},
        "tsv_columns": {"train_ner": "text_a\tlabel\n头 痛\tB-Symptom I-Symptom\n发 热\tO O\tX\n"},
        "tag_mismatch": {"train_ner": "text_a\tlabel\n头 痛\tB-Symptom I-Symptom O\n"},
    }[case]
    data, kg = prep_inputs(tmp_path, **kwargs)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "fairseq_knowgen.prep.kbert", "--data", data, "--kg", kg, "--out", out, "--tagging"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and proc.stderr.startswith("error: ")
    assert "Traceback" not in proc.stderr
    assert not out.exists() or not any(p.is_file() for p in out.rglob("*"))


def test_prepare_writes_the_task_folder(tmp_path):
    data, kg = prep_inputs(tmp_path, kg="头痛\t类别\t症状\n发热\t类别\t症状\n")
    from fairseq_knowgen.prep.kbert import prepare

    prepare(str(data), str(kg), str(tmp_path / "out"), tagging=True)
    out = tmp_path / "out"
    assert (out / "data" / "labels.txt").read_text().split() == ["B-Symptom", "I-Symptom"]
    dict_symbols = [x.split()[0] for x in (out / "data" / "dict.txt").read_text().splitlines()]
    assert set(dict_symbols) == set("头痛类别症状")  # sentence characters + predicates + objects
    assert (out / "mlm" / "train.txt").read_text() == "头 痛\n"
    assert (out / "data" / "eval_splits").read_text().split() == ["valid"]
    assert len((out / "kg" / "control.spo").read_text().splitlines()) == 2


def test_validation_entity_f1_is_seqeval_strict_typed_f1():
    """The criterion's dev F1 (checkpoint choice) equals seqeval's strict IOB2 F1 on random tags."""
    import random

    from seqeval.metrics import f1_score
    from seqeval.scheme import IOB2

    from fairseq_knowgen.criterions.kbert_tagging import strict_entities

    rng = random.Random(0)
    tags = ["O", "B-A", "I-A", "B-B", "I-B"]
    for _ in range(50):
        gold = [[rng.choice(tags) for _ in range(rng.randint(1, 12))] for _ in range(6)]
        pred = [[rng.choice(tags) for _ in g] for g in gold]
        tp = sum(len(strict_entities(g) & strict_entities(p)) for g, p in zip(gold, pred))
        n = sum(len(strict_entities(g)) + len(strict_entities(p)) for g, p in zip(gold, pred))
        expected = f1_score(gold, pred, mode="strict", scheme=IOB2, zero_division=0)
        assert abs((2 * tp / n if n else 0) - expected) < 1e-9


def test_scores_typed_and_span_only_f1_by_hand(tmp_path):
    """Gold: Disease(0-2), Symptom(3); predicted: Symptom(0-2), Symptom(3). Typed: 1 of 2 right
    (P = R = F1 = 50); span-only (the original code's F1): both spans right (100)."""
    import json

    data = tmp_path / "data"
    data.mkdir()
    write(data / "valid.tsv", "text_a\tlabel\n头 痛 ， 咳\tB-Disease I-Disease O B-Symptom\n")
    pred = write(tmp_path / "p", "B-Symptom I-Symptom O B-Symptom\n")
    out = tmp_path / "s.json"
    args = ["--data", data, "--pred", pred, "--tagging", "--name", "x", "--json-out", out]
    proc = subprocess.run(
        [sys.executable, "scripts/kbert_score.py", *map(str, args)], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    scores = json.loads(out.read_text())["x/valid"]
    assert (scores["typed_precision"], scores["typed_recall"], scores["typed_f1"], scores["span_f1"]) == (
        50,
        50,
        50,
        100,
    )
