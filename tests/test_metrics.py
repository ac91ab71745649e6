"""Each metric against a hand computation on a tiny example."""

import math

import pytest

from fairseq_knowgen.evaluation import metrics
from fairseq_knowgen.evaluation.report import normalize, read_hypotheses, read_references
from fairseq_knowgen.textio import DataError


def test_tokenize_lowercases_and_splits_punctuation():
    assert metrics.tokenize("The Dog, barked.") == ["the", "dog", ",", "barked", "."]


def test_bleu4_perfect_and_multi_reference():
    # hypothesis equal to its *second* reference: every n-gram matches, BP = 1
    hyps = ["a cat sat on the mat today"]
    refs = [["the dog ran away from home", "a cat sat on the mat today"]]
    assert metrics.bleu4(hyps, refs) == pytest.approx(100.0)


def test_bleu4_hand_computed():
    # hyp "a b c d e" vs ref "a b c d f": precisions 4/5, 3/4, 2/3, 1/2; equal lengths -> BP 1
    expected = 100 * math.exp((math.log(4 / 5) + math.log(3 / 4) + math.log(2 / 3) + math.log(1 / 2)) / 4)
    assert metrics.bleu4(["a b c d e"], [["a b c d f"]]) == pytest.approx(expected, abs=1e-6)


def test_bleu4_variable_reference_counts():
    # second input has one reference only: padding must not count as an empty reference
    score = metrics.bleu4(["a b c d", "e f g h"], [["a b c d", "x y z w"], ["e f g h"]])
    assert score == pytest.approx(100.0)


def test_rouge_l_best_reference():
    # LCS("a b c d", "a x c d") = 3 -> P = R = 3/4 -> F = 0.75; other reference worse
    score = metrics.rouge_l(["a b c d"], [["q r s", "a x c d"]])
    assert score == pytest.approx(75.0)


def test_cider_d_ranks_matching_output_higher():
    refs = [["a man rides a horse", "a person riding a horse"], ["two dogs play in snow", "dogs playing in the snow"]]
    good = metrics.cider_d(["a man riding a horse", "two dogs playing in snow"], refs)
    bad = metrics.cider_d(["snow snow snow", "a horse"], refs)
    assert good > 1.0 > bad >= 0.0


def test_concept_coverage_uses_lemmas():
    # "dogs"->dog, "running"->run: 2 of 3 concepts of input 1; input 2: 1 of 1
    cov = metrics.concept_coverage(["The dogs were running", "an apple"], [["dog", "run", "frisbee"], ["apple"]])
    assert cov == pytest.approx(100 * (2 / 3 + 1) / 2)


def test_copy_precision_recall_hand_computed():
    # source words {alice, born, paris, london}; output copies alice, paris, london;
    # the reference has alice, paris, born -> wanted {alice, born, paris}
    # precision = |{alice, paris}| / |{alice, paris, london}| = 2/3; recall = 2/3
    out = metrics.copy_precision_recall(
        ["Alice went to Paris and London ."], ["Alice born Paris London"], [["Alice was born in Paris ."]]
    )
    assert out["copy_precision"] == pytest.approx(200 / 3)
    assert out["copy_recall"] == pytest.approx(200 / 3)


def test_novel_ngram_ratio():
    # bigrams of "a b c d": ab bc cd; source "a b x" has ab -> 2 of 3 novel
    assert metrics.novel_ngram_ratio(["a b c d"], ["a b x"], n=2) == pytest.approx(200 / 3)


def test_repeated_ngram_rate():
    # "a b c a b c": trigrams abc bca cab abc -> 1 duplicate of 4; second output none
    out = metrics.repeated_ngram_rate(["a b c a b c", "x y z w"], n=3)
    assert out["rep3_outputs"] == pytest.approx(50.0)
    assert out["rep3_ngrams"] == pytest.approx(100 * 1 / 6)


def test_coverage_entropy_uniform_is_log_n():
    assert metrics.coverage_entropy([2.0, 2.0, 2.0, 2.0]) == pytest.approx(math.log(4))
    assert metrics.coverage_entropy([1.0, 0.0]) == pytest.approx(0.0)


def test_normalize_undoes_bpe_and_moses():
    assert normalize("the new@@ s@@ paper is here .", detok="moses") == "the newspaper is here."


def test_read_generate_output_orders_by_id(tmp_path):
    p = tmp_path / "gen.out"
    p.write_text("S-1\tx\nH-1\t-0.1\tsecond\nD-1\t-0.1\tsecond\nH-0\t-0.2\tfirst\nD-0\t-0.2\tfirst\n")
    assert read_hypotheses(str(p)) == ["first", "second"]


def test_reference_files_must_align(tmp_path):
    a, b = tmp_path / "r0", tmp_path / "r1"
    a.write_text("x\ny\nz\n")
    b.write_text("x\ny\n")
    with pytest.raises(DataError, match=r"r1:3: line-count mismatch"):
        read_references([str(a), str(b)])


def test_bad_jsonl_names_line(tmp_path):
    p = tmp_path / "refs.jsonl"
    p.write_text('["ok"]\nnot json\n')
    with pytest.raises(DataError, match=r"refs.jsonl:2: not a JSON line"):
        read_references([str(p)])


def test_entity_copy_hand_computed():
    # entities: "Alan Bean" (found as a whole), "UT Austin" (only "austin" found)
    # entity words {alan, bean, ut, austin}; output has alan, bean, austin;
    # reference has alan, bean (not austin) -> precision 2/3; recall 1/2
    out = metrics.entity_copy(
        ["Alan Bean went to Austin ."], [["Alan Bean", "UT Austin"]], [["Alan Bean studied at UT ."]]
    )
    assert out["entity_recall"] == pytest.approx(50.0)
    assert out["entity_precision"] == pytest.approx(200 / 3)
