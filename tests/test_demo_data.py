"""The demo's data (fairseq_knowgen.demo_data) and the demo script (scripts/demo.sh)."""

import json
import os
import signal
import subprocess

from conftest import ROOT

from fairseq_knowgen import demo_data
from fairseq_knowgen.evaluation import metrics
from fairseq_knowgen.evaluation.report import read_hypotheses


def _triples(line):
    """(subject, predicate, object) of a linearized source, parsed here by its markers."""
    out = []
    for part in line.split("<S> ")[1:]:
        s, rest = part.split(" <P> ")
        p, o = rest.split(" <O> ")
        out.append((s.strip(), p.strip(), o.strip()))
    return out


def _names(line):
    """Person, city and club names of a source: every subject and every object but occupations."""
    return {s for s, _, _ in _triples(line)} | {o for _, p, o in _triples(line) if p != "occupation"}


def _train_words(out):
    words = set()
    for side in ("src", "tgt"):
        with open(os.path.join(out, f"train.{side}")) as f:
            words |= set(f.read().split())
    return words


def _lines(out, name):
    with open(os.path.join(out, name)) as f:
        return f.read().splitlines()


def _names_seen_in_train(out):
    """Names of valid and test having a word that occurs anywhere in train.src or train.tgt."""
    train = _train_words(out)
    return {
        n
        for split in ("valid", "test")
        for x in _lines(out, f"{split}.src")
        for n in _names(x)
        if set(n.split()) & train
    }


def test_disjoint_names_never_occur_in_train(tmp_path):
    demo_data.main(["--out", str(tmp_path), "--train", "400", "--valid", "30", "--test", "30", "--disjoint-names"])
    assert _names_seen_in_train(tmp_path) == set()


def test_without_the_flag_test_names_are_training_names(tmp_path):
    """The check above can fail: the default data reuses the training names."""
    demo_data.make_dataset(str(tmp_path), train=400, valid=30, test=30, seed=1)
    assert len(_names_seen_in_train(tmp_path)) > 20


def test_unseen_pools_share_no_word_with_training_pools_or_templates():
    unseen = {w for pool in demo_data.UNSEEN.values() for name in pool for w in name.split()}
    seen = {w for pool in demo_data.SEEN.values() for name in pool for w in name.split()}
    seen |= set(demo_data.JOBS)
    seen |= {w for p, (_, templates) in demo_data.PREDICATES.items() for t in templates for w in (p + " " + t).split()}
    assert unseen and not unseen & seen


def test_disjoint_names_keep_the_training_split(tmp_path):
    demo_data.make_dataset(str(tmp_path / "a"), train=200, valid=20, test=20, seed=4)
    demo_data.make_dataset(str(tmp_path / "b"), train=200, valid=20, test=20, seed=4, disjoint_names=True)
    for name in ("train.src", "train.tgt"):
        assert _lines(tmp_path / "a", name) == _lines(tmp_path / "b", name)
    assert _lines(tmp_path / "a", "test.src") != _lines(tmp_path / "b", "test.src")


def test_entities_file_lists_subject_and_objects_that_every_reference_mentions(tmp_path):
    demo_data.make_dataset(str(tmp_path), train=50, valid=20, test=40, seed=5, disjoint_names=True)
    src, ents = _lines(tmp_path, "test.src"), _lines(tmp_path, "test.entities")
    refs = [json.loads(x) for x in _lines(tmp_path, "test.refs.jsonl")]
    assert len(src) == len(ents) == len(refs) == 40
    for line, e in zip(src, ents):
        t = _triples(line)
        assert e.split("|") == [t[0][0]] + [o for _, _, o in t]  # the subject is the same in every triple
    # the package's entity recall on the references themselves (as outputs) is 100%
    entities = [e.split("|") for e in ents]
    for k in range(len(refs[0])):
        hyps = [r[k] if k < len(r) else r[0] for r in refs]
        assert metrics.entity_copy(hyps, entities, refs)["entity_recall"] == 100.0


def _demo(tmp_path, **env):
    """``bash scripts/demo.sh`` on a small data set; on timeout its whole process group is killed (the two
    background trainings included)."""
    env = dict(os.environ, TRAIN_N="240", TEST_N="8", MAX_UPDATE="2", SAMPLES="2", **env)
    cmd = ["bash", "scripts/demo.sh", str(tmp_path / "demo")]
    with subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    ) as child:
        try:
            out, err = child.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            raise
    return subprocess.CompletedProcess(cmd, child.returncode, out, err)


def test_demo_runs_both_systems_and_prints_their_scores(tmp_path):
    proc = _demo(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    scores = json.load(open(tmp_path / "demo" / "scores.json"))
    assert set(scores) == {"plain", "copy"} and all("entity_recall" in s for s in scores.values())
    # every placeholder of the knowledge-aware outputs is restored to its source word
    copy = read_hypotheses(str(tmp_path / "demo" / "copy" / "test.out"))
    assert len(copy) == 8 and not any("<unk-" in h for h in copy)
    assert proc.stdout.count("  SOURCE ") == 2
    table = proc.stdout[proc.stdout.index("BLEU-4") :]
    assert f"{scores['copy']['bleu4']:.2f}" in table and f"{scores['plain']['entity_recall']:.2f}" in table


def test_demo_fails_with_the_log_of_a_failed_training(tmp_path):
    proc = _demo(tmp_path, ARCH="no_such_arch")
    assert proc.returncode != 0
    assert "training 'plain' failed" in proc.stdout
    assert "no_such_arch" in proc.stdout  # fairseq-train's error, from the end of its log
    assert not (tmp_path / "demo" / "scores.json").exists()
