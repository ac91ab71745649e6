"""Constraint files written from the encoded sources (fairseq_knowgen/prep/constraints.py)."""

import pytest
from conftest import run_cli

from fairseq_knowgen.evaluation.metrics import concept_coverage
from fairseq_knowgen.text import lemma
from fairseq_knowgen.prep.constraints import concept_constraints, entity_constraints, main, prototype_constraints
from fairseq_knowgen.textio import cli_entry


def test_concepts_keep_bpe_pieces_together_and_stop_at_sep():
    assert concept_constraints("dog fris@@ bee catch") == ["dog", "fris@@ bee", "catch"]
    assert concept_constraints("dog catch <sep> the dog catches a fris@@ bee") == ["dog", "catch"]
    assert concept_constraints("dog dog run") == ["dog", "run"]


def test_entities_are_subjects_and_objects_once_each():
    line = "<S> Alan <unk-2> <P> birth place <O> Wap@@ akoneta <S> Alan <unk-2> <P> occupation <O> test pilot"
    assert entity_constraints(line) == ["Alan <unk-2>", "Wap@@ akoneta", "test pilot"]
    assert entity_constraints("<S> <ent-0> <P> leader name <O> <ent-1> <S> <ent-1> <P> party <O> <ent-2>") == [
        "<ent-0>",
        "<ent-1>",
        "<ent-2>",
    ]


def test_cli_writes_one_tab_separated_line_per_source_and_names_bad_lines(tmp_path):
    src = tmp_path / "valid.src"
    src.write_text("<S> <ent-0> <P> club <O> <ent-1>\n<S> <ent-0> <P> age <O> 42\n")
    run_cli("-m", "fairseq_knowgen.prep.constraints", "entities", "--src", src, "--out", tmp_path / "valid.cons")
    assert (tmp_path / "valid.cons").read_text() == "<ent-0>\t<ent-1>\n<ent-0>\t42\n"
    src.write_text("<S> <ent-0> <P> club <O> <ent-1>\nno markers here\n")
    out = run_cli(
        "-m", "fairseq_knowgen.prep.constraints", "entities", "--src", src, "--out", tmp_path / "x.cons", check=False
    )
    assert out.returncode == 2 and "valid.src:2: no <S>/<O> entity" in out.stderr
    assert not (tmp_path / "x.cons").exists()


# --- concepts in the form of the retrieved prototype (--form prototype) ----------------------------------------


def test_prototype_form_by_hand():
    # the prototype inflects the concept: its form; the prototype lacks the concept: the concept itself
    assert prototype_constraints("dog run <sep> two dogs run") == ["dogs", "run"]
    assert prototype_constraints("dog frisbee <sep> two dogs run") == ["dogs", "frisbee"]
    # BPE pieces stay one constraint, in the prototype's pieces (the concept's own pieces when it falls back)
    assert prototype_constraints("fris@@ bee catch <sep> he cat@@ ches fris@@ bees") == ["fris@@ bees", "cat@@ ches"]
    assert prototype_constraints("fris@@ bee <sep> a ball") == ["fris@@ bee"]
    # the verbatim concept wins over an earlier inflected form; among inflected forms the first
    assert prototype_constraints("dog <sep> dogs chase a dog") == ["dog"]
    assert prototype_constraints("run <sep> he ran and runs") == ["ran"]
    # the prototype of another line (--prototypes: the EKI source of the same split); no prototype at all
    assert prototype_constraints("dog run", "dog run <sep> two dogs run") == ["dogs", "run"]
    assert prototype_constraints("dog run") == ["dog", "run"]
    assert prototype_constraints("dog run <sep>") == ["dog", "run"]


def test_prototype_form_lemma_ambiguity_is_simplemmas():
    """simplemma knows no part of speech: documented in prep/constraints.py, pinned here so that a change of
    lemmatizer shows up."""
    assert lemma("saw") == "see" and prototype_constraints("saw <sep> he sees a dog") == ["sees"]  # the tool
    assert lemma("sitting") == "sitting" and prototype_constraints("sit <sep> a man sitting") == ["sit"]
    # whatever form is taken, the coverage metric counts it as the concept (same lemma function)
    for line in ("dog <sep> two dogs", "saw <sep> he sees", "run <sep> he ran", "cat@@ ch <sep> he cat@@ ches"):
        (form,) = prototype_constraints(line)
        concept = line.split("<sep>")[0].replace("@@ ", "").strip()
        assert concept_coverage([form.replace("@@ ", "")], [[concept]]) == 100.0, line


def _bpe(corpus, merges):
    """subword-nmt codes learned on ``corpus`` (as stage 3 learns them) and its segmenter."""
    import io

    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    codes = io.StringIO()
    learn_bpe(io.StringIO("\n".join(corpus) + "\n"), codes, merges)
    codes.seek(0)
    return BPE(codes, glossaries=["<sep>"])


def test_cli_prototype_form_is_bped_as_the_target_side(tmp_path):
    """The recipe's files: bpe/SPLIT.src (concepts), bpe/SPLIT.eki.src (concepts <sep> prototype) and the
    target bpe/SPLIT.tgt, all segmented with one set of joint codes (stage 3). A constraint must be the
    target side's pieces of the word, or fairseq forces a segmentation the model never produces."""
    targets = ["two dogs catch frisbees", "the kids run in the park", "a dog runs", "kids throw frisbees"]
    sources = ["dog frisbee catch", "kid park run", "dog run", "kid throw frisbee"]
    bpe = _bpe(sources + targets, merges=12)
    protos = [targets[0], targets[1], targets[2], "a boat on a river"]  # retrieved prototypes
    (tmp_path / "valid.src").write_text("".join(bpe.process_line(s) + "\n" for s in sources))
    eki = [bpe.process_line(f"{s} <sep> {p}") for s, p in zip(sources, protos)]
    (tmp_path / "valid.eki.src").write_text("".join(e + "\n" for e in eki))
    out = tmp_path / "valid.cons-prototype"
    proc = run_cli(
        "-m", "fairseq_knowgen.prep.constraints", "concepts", "--form", "prototype",
        "--src", tmp_path / "valid.src", "--prototypes", tmp_path / "valid.eki.src", "--out", out,
    )  # fmt: skip
    # by hand: dog -> dogs, frisbee -> frisbees, catch verbatim | kid -> kids, park, run verbatim |
    # dog verbatim, run -> runs | "a boat on a river" has none of kid throw frisbee: the concepts
    words = [["dogs", "frisbees", "catch"], ["kids", "park", "run"], ["dog", "runs"], ["kid", "throw", "frisbee"]]
    expected = ["\t".join(" ".join(bpe.segment_tokens([w])) for w in ws) for ws in words]
    assert out.read_text().splitlines() == expected
    assert any("@@" in line for line in expected)  # the codes split some constraint word into pieces
    assert "11 constraints (8 in the prototype's form, 4 of them inflected; 3 absent" in proc.stdout
    # without --prototypes the EKI source is its own prototype file: the same constraints (in-process: faster)
    args = [
        "concepts",
        "--form",
        "prototype",
        "--src",
        tmp_path / "valid.eki.src",
        "--out",
        tmp_path / "eki.cons-prototype",
    ]
    main([str(a) for a in args])
    assert (tmp_path / "eki.cons-prototype").read_text() == out.read_text()


def test_cli_prototype_form_bad_input_names_file_and_line_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "valid.src").write_text("dog run\nkid park\ncat sit\n")
    (tmp_path / "valid.eki.src").write_text("dog run <sep> two dogs run\nkid park <sep> kids\n")
    (tmp_path / "other.eki.src").write_text("dog run <sep> dogs\nkid boat <sep> kids\ncat sit <sep> cats\n")
    (tmp_path / "plain.eki.src").write_text("dog run <sep> dogs\nkid park\ncat sit <sep> cats\n")

    def run(*args):  # in-process (the CLI's own entry, cli_entry(main)): a subprocess costs seconds of imports
        out = tmp_path / "x.cons"
        with pytest.raises(SystemExit) as stop:
            cli_entry(lambda: main(["concepts", "--form", "prototype", "--out", str(out), *map(str, args)]))
        assert stop.value.code == 2 and not out.exists()
        return capsys.readouterr().err

    # a prototype file one line short: the short file and the first line it lacks
    err = run("--src", tmp_path / "valid.src", "--prototypes", tmp_path / "valid.eki.src")
    assert f"{tmp_path / 'valid.eki.src'}:3: line-count mismatch" in err
    # line-aligned, but another split's prototypes (the concepts differ)
    err = run("--src", tmp_path / "valid.src", "--prototypes", tmp_path / "other.eki.src")
    assert f"{tmp_path / 'other.eki.src'}:2: concepts" in err and "differ" in err
    # a prototype file line without <sep>; a plain concept source without --prototypes is refused
    assert f"{tmp_path / 'plain.eki.src'}:2: no <sep>" in run(
        "--src", tmp_path / "valid.src", "--prototypes", tmp_path / "plain.eki.src"
    )
    err = run("--src", tmp_path / "valid.src")
    assert f"{tmp_path / 'valid.src'}:1: no <sep>" in err and "give --prototypes" in err
