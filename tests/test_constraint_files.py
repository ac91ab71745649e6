"""Constraint files written from the encoded sources (fairseq_knowgen/prep/constraints.py)."""

from conftest import run_cli

from fairseq_knowgen.prep.constraints import concept_constraints, entity_constraints


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
