"""Each metric against a hand computation on a tiny example."""

import math

import pytest

from fairseq_knowgen.evaluation import metrics
from fairseq_knowgen.evaluation.report import normalize, read_hypotheses, read_references
from fairseq_knowgen.text import tokenize
from fairseq_knowgen.textio import DataError


def test_tokenize_lowercases_and_splits_punctuation():
    assert tokenize("The Dog, barked.") == ["the", "dog", ",", "barked", "."]


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
    """An input with fewer references has *no* further reference (sacrebleu's ``None``), not an
    empty one (``""``): an empty reference of length 0 would be the closest length to the short
    second hypothesis and hide its brevity penalty."""
    hyps = ["a b c d", "e f"]
    refs = [["a b c d", "a b c d e f"], ["e f g h"]]
    # every hypothesis n-gram matches: p1..p4 = 6/6, 4/4, 2/2, 1/1. Closest reference lengths:
    # 4 (input 1) and 4 (input 2, its only reference), so r = 8, c = 6 and BP = exp(1 - 8/6).
    # (Padding with "" would give input 2 the closest length 0, r = 4 < c and BLEU = 100.)
    assert metrics.bleu4(hyps, refs) == pytest.approx(100 * math.exp(1 - 8 / 6), abs=1e-9)


def test_rouge_l_best_reference():
    # LCS("a b c d", "a x c d") = 3 -> P = R = 3/4 -> F = 0.75; other reference worse
    score = metrics.rouge_l(["a b c d"], [["q r s", "a x c d"]])
    assert score == pytest.approx(75.0)


def _clipped_cosine(hyp, ref):
    """CIDEr-D's similarity of one n-gram order: sum_g min(h_g, r_g) r_g / (|h| |r|), 0 if a norm is 0."""
    dot = sum(min(v, ref.get(g, 0.0)) * ref.get(g, 0.0) for g, v in hyp.items())
    norm_h = math.sqrt(sum(v * v for v in hyp.values()))
    norm_r = math.sqrt(sum(v * v for v in ref.values()))
    return dot / (norm_h * norm_r) if norm_h and norm_r else 0.0


def test_cider_d_hand_computed():
    """CIDEr-D (Vedantam et al., 2015, Sec. 4.2) by hand on a 2-input corpus:
    CIDEr-D_n(c, S) = 10/m sum_j exp(-(l_c - l_sj)^2 / (2 sigma^2)) sum_g min(g^n(c), g^n(s_j)) g^n(s_j)
    / (|g^n(c)| |g^n(s_j)|) with sigma = 6, averaged over n = 1..4 with equal weights.
    tf-idf: g_k(s) = tf_k(s) log(|I| / max(1, df_k)), |I| = 2 inputs, df_k = number of inputs
    whose references contain n-gram k. So an n-gram in the references of one input weighs
    w = log 2 per occurrence, one in the references of both inputs ("a") weighs 0, and one in no
    reference (df 0, clamped to 1) weighs w.
    """
    w = math.log(2)
    hyps = ["a b a b", "c d"]
    refs = [["a b"], ["a c d", "c d"]]
    # input 1: hypothesis "a b a b" (tf a 2, b 2; ab 2, ba 1; aba, bab; abab) vs reference "a b"
    h1 = [{"a": 0.0, "b": 2 * w}, {"ab": 2 * w, "ba": w}, {"aba": w, "bab": w}, {"abab": w}]
    r1 = [{"a": 0.0, "b": w}, {"ab": w}, {}, {}]
    # input 2: hypothesis "c d" vs references "a c d" and "c d"
    h2 = [{"c": w, "d": w}, {"cd": w}, {}, {}]
    r2a = [{"a": 0.0, "c": w, "d": w}, {"ac": w, "cd": w}, {"acd": w}, {}]
    r2b = [{"c": w, "d": w}, {"cd": w}, {}, {}]

    def sim(h, r, len_h, len_r):
        penalty = math.exp(-((len_h - len_r) ** 2) / (2 * 6.0**2))
        return penalty * sum(_clipped_cosine(hn, rn) for hn, rn in zip(h, r)) / 4

    # clipping: b has weight 2w in the hypothesis but only w in the reference
    assert _clipped_cosine(h1[0], r1[0]) == pytest.approx(w * w / (2 * w * w))
    score1 = 10 * sim(h1, r1, 4, 2)
    score2 = 10 * (sim(h2, r2a, 2, 3) + sim(h2, r2b, 2, 2)) / 2
    expected = (score1 + score2) / 2
    # the same number in closed form
    closed = (
        10 * (1 / 2 + 1 / math.sqrt(5)) / 4 * math.exp(-4 / 72)
        + 10 * ((1 + 1 / math.sqrt(2)) / 4 * math.exp(-1 / 72) + 2 / 4) / 2
    ) / 2
    assert expected == pytest.approx(closed, rel=1e-12)
    assert metrics.cider_d(hyps, refs) == pytest.approx(expected, rel=1e-9)


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
    assert out["entity_recall_exact"] == pytest.approx(50.0)
    assert out["entity_precision"] == pytest.approx(200 / 3)
    assert out["entity_repeat_outputs"] == 0.0


def test_entity_recall_finds_written_out_dates():
    """A date entity written as English text is recalled by the matcher, not by the exact form.
    Input 1: "Alan Bean" and 1932-03-15 (as restored from ``<ent-K>`` in the ``text`` surface);
    input 2: 1932-03-15 as "15 March 1932". Matcher: 3 of 3; exact DBpedia form: only "Alan
    Bean", 1 of 3."""
    hyps = ["Alan Bean was born on March 15 , 1932 .", "He was born on 15 March 1932."]
    ents = [["Alan Bean", "1932-03-15"], ["1932-03-15"]]
    out = metrics.entity_copy(hyps, ents, [["x"], ["x"]])
    assert out["entity_recall"] == pytest.approx(100.0)
    assert out["entity_recall_exact"] == pytest.approx(100 / 3)
    # the same output with the ISO form is found by both
    iso = metrics.entity_copy(["Born 1932-03-15 ."], [["1932-03-15"]], [["x"]])
    assert iso["entity_recall"] == iso["entity_recall_exact"] == pytest.approx(100.0)


def test_entity_repeat_flags_output_with_a_twice_mentioned_entity():
    """Output 1 names "Alan Shepard" twice (once in another case): flagged; output 2 names each
    entity once: not flagged -> 1 of 2 outputs = 50%. Recall is unaffected (3 of 3)."""
    hyps = ["Alan Shepard was born in New Hampshire . ALAN SHEPARD died .", "Alan Bean flew ."]
    ents = [["Alan Shepard", "New Hampshire"], ["Alan Bean"]]
    assert metrics.entity_mention_counts(hyps, ents) == [[2, 1], [1]]
    out = metrics.entity_copy(hyps, ents, [["x"], ["x"]])
    assert out["entity_repeat_outputs"] == pytest.approx(50.0)
    assert out["entity_recall"] == pytest.approx(100.0)


def test_nested_entities_are_not_counted_twice():
    """Entities "Abilene, Texas" and "Texas". Output 1 says both once: the "Texas" inside
    "Abilene, Texas" is part of that mention, so neither is repeated. Output 2 says only
    "Abilene, Texas": one mention of it and none of "Texas" (as prep's upper bound counts it),
    while the exact form finds "Texas" inside it. Recall 3 of 4, exact 4 of 4, no repeats."""
    hyps = ["Abilene, Texas is part of Texas.", "Abilene, Texas is a city."]
    ents = [["Abilene, Texas", "Texas"]] * 2
    assert metrics.entity_mention_counts(hyps, ents) == [[1, 1], [1, 0]]
    out = metrics.entity_copy(hyps, ents, [["x"], ["x"]])
    assert out["entity_repeat_outputs"] == 0.0
    assert out["entity_recall"] == pytest.approx(75.0)
    assert out["entity_recall_exact"] == pytest.approx(100.0)


def test_entity_recall_is_micro_averaged_over_entities():
    """7 entities in 3 outputs, one ("Deceased") missing: recall 6/7 (not the mean of the
    per-output shares, (1 + 2/3 + 1) / 3 = 8/9)."""
    hyps = [
        "Aarhus Airport serves Aarhus .",
        "Alan Shepard was born in New Hampshire .",
        "The runway of Adirondack Regional Airport is 2,702 metres long .",
    ]
    ents = [
        ["Aarhus Airport", "Aarhus"],
        ["Alan Shepard", "New Hampshire", "Deceased"],
        ["Adirondack Regional Airport", "2702.0"],
    ]
    out = metrics.entity_copy(hyps, ents, [["x"]] * 3)
    assert out["entity_recall"] == pytest.approx(600 / 7)
    # exact form: "2702.0" is not in the output -> 5/7
    assert out["entity_recall_exact"] == pytest.approx(500 / 7)
    full = metrics.entity_copy(
        hyps[:1] + ["Alan Shepard ( deceased ) was born in New Hampshire ."] + hyps[2:], ents, [["x"]] * 3
    )
    assert full["entity_recall"] - out["entity_recall"] == pytest.approx(100 / 7)


def test_entity_recall_of_references_equals_prep_upper_bound(tmp_path):
    """Scoring each reference as an output gives prep's ``entity_match_rate`` on the same texts:
    the metric reads the cleaned entities of ``.entities``, prep the Moses-tokenized linearized
    source, and both must find the same mentions."""
    from fairseq_knowgen.prep import webnlg

    entries = [
        {
            "category": "City",
            "triples": [
                ["Abilene,_Texas", "isPartOf", "Texas"],
                ["Abilene,_Texas", "elevationAboveTheSeaLevel", '"524.0"^^xsd:double'],
            ],
            "texts": ["Abilene, Texas is part of Texas and lies 524 m above sea level.", "Abilene is in the U.S."],
        },
        {
            "category": "Astronaut",
            "triples": [
                ["Alan_Bean", "birthDate", '"1932-03-15"^^xsd:date'],
                ["Alan_Bean", "nationality", "United_States"],
            ],
            "texts": ["Alan Bean, born on March 15th, 1932, is from the US.", "US citizen Alan Bean was born in 1932."],
        },
    ]
    stats = webnlg.write_split(str(tmp_path), "valid", entries, False, "text")
    lines = (tmp_path / "valid.entities").read_text().splitlines()
    hyps = [t for e in entries for t in e["texts"]]
    ents = [x.split("|") for x, e in zip(lines, entries) for _ in e["texts"]]
    out = metrics.entity_copy(hyps, ents, [["x"]] * len(hyps))
    # by hand: reference 1 has all 3 entities, reference 2 only "Abilene" (Abilene, Texas);
    # reference 3 all 3 ("US" for United States), reference 4 "Alan Bean" and "US" -> 9 of 12
    assert stats["found"] == 9 and stats["mentions"] == 12
    assert out["entity_recall"] == pytest.approx(75.0)


def test_evaluate_cli_reports_entity_metrics(tmp_path):
    """scripts/evaluate.py --entities on Moses-tokenized fairseq output (``--detok moses``):
    output 1 has both entities once; output 2 misses "Texas" and says "Aarhus" twice ->
    recall 3 of 4, repeats 1 of 2."""
    import json

    from fairseq_knowgen.evaluation import cli

    hyp, refs, ents, out = (tmp_path / n for n in ("hyp.txt", "refs.jsonl", "ents.txt", "scores.json"))
    hyp.write_text("Abilene , Texas is part of Texas .\nAarhus is in Aarhus .\n")
    refs.write_text(json.dumps(["Abilene, Texas is in Texas."]) + "\n" + json.dumps(["Aarhus is in Denmark."]) + "\n")
    ents.write_text("Abilene, Texas|Texas\nAarhus|Denmark\n")
    args = ["--hyp", str(hyp), "--name", "sys", "--refs", str(refs), "--entities", str(ents)]
    assert cli.main(args + ["--detok", "moses", "--no-cider", "--json-out", str(out)]) == 0
    row = json.loads(out.read_text())["sys"]
    assert row["entity_recall"] == pytest.approx(75.0)
    assert row["entity_recall_exact"] == pytest.approx(75.0)
    assert row["entity_repeat_outputs"] == pytest.approx(50.0)
