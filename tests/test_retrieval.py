"""Prototype retrieval (EKI): no answer leaks into a training prototype, and the test-like
option excludes near-duplicate concept sets while keeping genuine neighbours."""

import json

from conftest import run_cli

from fairseq_knowgen.prep.retrieval import PrototypeRetriever, concept_overlap_histogram, in_domain_corpus

SHARED = "the boy eats an apple under the tree ."


def test_sentence_written_for_two_concept_sets_is_never_their_prototype():
    # the shared sentence is the answer of both "apple eat tree" and "boy eat apple"; keeping
    # it only under its first concept set let it become the prototype of the second
    src = ["apple eat tree", "boy eat apple", "apple grow tree"]
    tgt = [SHARED, SHARED, "an apple tree grows in the garden ."]
    corpus, keys = in_domain_corpus(tgt, src)
    assert corpus == [SHARED, tgt[2]]
    assert keys[0] == ("apple eat tree", "apple boy eat")
    r = PrototypeRetriever(corpus, keys)
    (d, _), (d2, _) = r.retrieve(["boy eat apple", "eat apple tree"])
    assert corpus[d] == tgt[2] and corpus[d2] == tgt[2]
    assert r.stats["excluded_own"] == 2  # one excluded BM25 hit per query


def test_max_shared_concepts_drops_near_duplicates_keeps_neighbours():
    keys_src = ["dog frisbee catch park", "dog frisbee throw", "cat sofa sleep", "dog ball kick"]
    tgt = [
        "a dog catches a frisbee in the park .",  # near-duplicate of the query (shares 3 of 4)
        "a man throws a frisbee to his dog .",  # shares 2: dog, frisbee
        "the cat sleeps on the sofa .",
        "a boy kicks a ball to the dog .",  # shares 1: dog
    ]
    corpus, keys = in_domain_corpus(tgt, keys_src)
    query = "dog frisbee catch run"
    r = PrototypeRetriever(corpus, keys)
    assert corpus[r.retrieve([query])[0][0]] == tgt[0]  # without a limit: the near-duplicate
    assert r.stats["excluded_overlap"] == 0
    ((d, cov),) = r.retrieve([query], max_shared=2)
    assert corpus[d] == tgt[1] and cov == 0.5
    assert r.stats["excluded_overlap"] == 1
    ((d, cov),) = r.retrieve([query], max_shared=1)
    assert corpus[d] == tgt[3] and cov == 0.25
    assert r.stats["excluded_overlap"] == 2
    ((d, cov),) = r.retrieve([query], max_shared=0)
    assert corpus[d] == tgt[2] and cov == 0.0  # the only sentence sharing nothing


def test_retrieval_asks_bm25_for_more_hits_when_exclusions_empty_the_candidates():
    # 12 near-duplicates outrank the one allowed sentence; with 2 candidates the first BM25
    # call sees only excluded hits, so retrieval must widen the search
    src = [f"dog frisbee catch x{i}" for i in range(12)] + ["dog swim lake"]
    tgt = [f"the dog catches the frisbee number {i} ." for i in range(12)] + ["the dog swims in the lake ."]
    corpus, keys = in_domain_corpus(tgt, src)
    r = PrototypeRetriever(corpus, keys)
    ((d, _),) = r.retrieve(["dog frisbee catch"], candidates=2, max_shared=1)
    assert corpus[d] == tgt[-1]
    assert r.stats["no_prototype"] == 0


def test_concept_overlap_histogram_by_hand():
    corpus_keys = ["a b c", "a b d", "e f g"]
    # "a b c": closest other set "a b d" shares 2; "c b a" is the same set as "a b c" (skipped);
    # "e x y" shares 1 with "e f g"; "p q r" shares 0
    assert concept_overlap_histogram(["a b c", "c b a", "e x y", "p q r"], corpus_keys) == {0: 1, 1: 1, 2: 1}


def test_cli_reports_exclusions(tmp_path):
    (tmp_path / "train.src").write_text("apple eat tree\nboy eat apple\napple grow tree\n")
    (tmp_path / "train.tgt").write_text(f"{SHARED}\n{SHARED}\nan apple tree grows in the garden .\n")
    out = run_cli(
        "scripts/retrieve_prototypes.py",
        "--queries",
        tmp_path / "train.src",
        "--out",
        tmp_path / "train.proto",
        "--corpus",
        tmp_path / "train.tgt",
        "--corpus-keys",
        tmp_path / "train.src",
        "--overlap-report",
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    protos = (tmp_path / "train.proto").read_text().splitlines()
    # no line gets its own answer: lines 1-2 get the third sentence, line 3 the shared one
    assert protos == ["an apple tree grows in the garden .", "an apple tree grows in the garden .", SHARED]
    assert report["excluded_own"] == 3  # distinct queries: 3, each with its own sentence among the hits
    assert report["closest_set_shares"] == {"2": 3}
