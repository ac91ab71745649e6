"""Bad input stops with a message naming the file and line; nothing written is lost."""

import json

import pytest
from conftest import run_cli

from fairseq_knowgen.textio import DataError, atomic_write, read_lines, read_parallel


def test_missing_file():
    with pytest.raises(DataError, match="nope.txt: source file not found"):
        read_lines("nope.txt", "source")


def test_line_count_mismatch_names_file_and_line(tmp_path):
    (tmp_path / "a.src").write_text("x\ny\nz\n")
    (tmp_path / "a.tgt").write_text("X\nY\n")
    with pytest.raises(DataError, match=r"a\.tgt:3: line-count mismatch: 2 lines here but 3"):
        read_parallel(str(tmp_path / "a.src"), str(tmp_path / "a.tgt"))


def test_invalid_utf8_names_line(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(DataError, match=r"bad\.txt:2: not valid UTF-8"):
        read_lines(str(tmp_path / "bad.txt"))


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    p = tmp_path / "scores.json"
    p.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_write(str(p)) as f:
            f.write("half")
            raise RuntimeError("boom")
    assert p.read_text() == "old"
    assert [x.name for x in tmp_path.iterdir()] == ["scores.json"]


def test_evaluate_cli_reports_mismatch(tmp_path):
    (tmp_path / "hyp.txt").write_text("a b\nc d\n")
    (tmp_path / "refs.jsonl").write_text(json.dumps(["a b"]) + "\n")
    (tmp_path / "scores.json").write_text("keep me")
    out = run_cli(
        "scripts/evaluate.py",
        "--hyp",
        tmp_path / "hyp.txt",
        "--refs",
        tmp_path / "refs.jsonl",
        "--json-out",
        tmp_path / "scores.json",
        check=False,
    )
    assert out.returncode == 2
    assert "hyp.txt:2: 2 inputs here but 1" in out.stderr
    assert (tmp_path / "scores.json").read_text() == "keep me"


def test_evaluate_cli_end_to_end(tmp_path):
    (tmp_path / "gen.out").write_text("H-1\t-1\tb@@ ye now\nH-0\t-1\thel@@ lo world\n")
    (tmp_path / "refs.jsonl").write_text('["hello world"]\n["bye now", "bye"]\n')
    (tmp_path / "src").write_text("hello\nbye\n")
    out = run_cli(
        "scripts/evaluate.py",
        "--hyp",
        tmp_path / "gen.out",
        "--refs",
        tmp_path / "refs.jsonl",
        "--src",
        tmp_path / "src",
        "--concepts-from-src",
        "--json-out",
        tmp_path / "s.json",
    )
    scores = json.loads((tmp_path / "s.json").read_text())[str(tmp_path / "gen.out")]
    assert scores["coverage"] == pytest.approx(100.0)
    assert scores["rougeL"] == pytest.approx(100.0)
    assert "| system |" in out.stdout


def test_commongen_prep_line_mismatch(tmp_path):
    (tmp_path / "commongen.train.src_alpha.txt").write_text("dog run\ncat sit\nball throw\n")
    (tmp_path / "commongen.train.tgt.txt").write_text("a dog runs .\na cat sits .\n")
    out = run_cli("-m", "fairseq_knowgen.prep.commongen", "--data", tmp_path, "--out", tmp_path / "out", check=False)
    assert out.returncode == 2
    assert "commongen.train.tgt.txt:3: line-count mismatch" in out.stderr
    assert "Traceback" not in out.stderr


def test_webnlg_prep_malformed_xml(tmp_path):
    d = tmp_path / "train" / "1triples"
    d.mkdir(parents=True)
    (d / "Airport.xml").write_text("<benchmark>\n<entries>\n<entry category='Airport'>\n</entries>\n")
    (tmp_path / "dev").mkdir()
    out = run_cli("-m", "fairseq_knowgen.prep.webnlg", "--data", tmp_path, "--out", tmp_path / "out", check=False)
    assert out.returncode == 2
    assert "Airport.xml:4: XML parse error" in out.stderr


def test_retrieval_missing_corpus(tmp_path):
    (tmp_path / "q.txt").write_text("dog run\n")
    out = run_cli(
        "scripts/retrieve_prototypes.py",
        "--queries",
        tmp_path / "q.txt",
        "--corpus",
        tmp_path / "none.txt",
        "--out",
        tmp_path / "p.txt",
        check=False,
    )
    assert out.returncode == 2 and "none.txt: corpus file not found" in out.stderr
