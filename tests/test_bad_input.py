"""Bad input stops with a message naming the file and line; nothing written is lost."""

import json
import os
from pathlib import Path

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


# --- writing: outputs replaced only when complete (textio.atomic_write / output_folder), cli_entry ---


def _dead_pid():
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_atomic_write_follows_the_umask(tmp_path):
    import os

    old = os.umask(0o027)
    try:
        with atomic_write(str(tmp_path / "a.txt")) as f:
            f.write("x\n")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o640  # mkstemp's files were 0600 whatever the umask


def test_a_rerun_removes_the_temporary_files_of_killed_writers_only(tmp_path):
    import os

    dead = tmp_path / f".tmp-{_dead_pid()}-0badc0de-out.txt"
    live = tmp_path / f".tmp-{os.getpid()}-0badc0de-out.txt"  # a writer still at work
    other = tmp_path / f".tmp-{_dead_pid()}-0badc0de-other.txt"  # another target's
    for p in (dead, live, other):
        p.write_text("half")
    with atomic_write(str(tmp_path / "out.txt")) as f:
        f.write("new\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.txt", live.name, other.name])


def test_output_folder_is_swapped_in_whole_and_keeps_what_is_not_its_own(tmp_path):
    from fairseq_knowgen.textio import output_folder

    out = tmp_path / "out"
    out.mkdir()
    for name, text in (("train.src", "old"), ("test.src", "stale"), ("notes.md", "mine")):
        (out / name).write_text(text)
    (out / "sub").mkdir()
    (out / "sub" / "x").write_text("kept")
    with output_folder(str(out), owned=("*.src",)) as tmp:
        assert os.path.dirname(tmp) == str(tmp_path) and os.path.basename(tmp).startswith(".tmp-")
        (Path(tmp) / "train.src").write_text("new")
        assert (out / "train.src").read_text() == "old"  # nothing changes before the end
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == ["notes.md", "sub", "train.src"]  # test.src: stale, dropped
    assert (out / "train.src").read_text() == "new" and (out / "sub" / "x").read_text() == "kept"


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_output_folder_keeps_the_old_folder_when_the_run_fails(tmp_path, monkeypatch, exchange):
    from fairseq_knowgen import textio

    if not exchange:
        monkeypatch.setattr(textio, "_exchange", lambda a, b: False)
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.src").write_text("old")
    with pytest.raises(DataError):
        with textio.output_folder(str(out)) as tmp:
            (Path(tmp) / "train.src").write_text("new")
            raise DataError("x.xml", 3, "bad")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (out / "train.src").read_text() == "old"
    with textio.output_folder(str(out)) as tmp:
        (Path(tmp) / "valid.src").write_text("new")
    assert [p.name for p in out.iterdir()] == ["valid.src"] and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_interrupted_prep_exits_130_quietly_and_leaves_the_old_output(tmp_path, monkeypatch, capsys):
    """Ctrl-C in the middle of prep.webnlg's writing (after train, before valid): exit 130, no
    traceback, the previous output folder as it was and no temporary folder."""
    from fairseq_knowgen.prep import webnlg
    from fairseq_knowgen.textio import cli_entry

    xml = "<benchmark><entries><entry category='A' eid='1'><mtriple>a | b | c</mtriple><lex><text>a b c</text></lex>"
    xml += "</entry></entries></benchmark>\n"
    for split in ("train", "dev"):
        (tmp_path / "wn" / split).mkdir(parents=True)
        (tmp_path / "wn" / split / "A.xml").write_text(xml)
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.src").write_text("old")
    write_split = webnlg.write_split

    def interrupted(dest, name, *args, **kwargs):
        if name == "valid":
            raise KeyboardInterrupt
        return write_split(dest, name, *args, **kwargs)

    monkeypatch.setattr(webnlg, "write_split", interrupted)
    argv = ["--data", str(tmp_path / "wn"), "--out", str(out), "--heldout-categories", ""]
    with pytest.raises(SystemExit) as stop:
        cli_entry(lambda: webnlg.main(argv))
    assert stop.value.code == 130 and "Traceback" not in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "wn"]
    assert [p.name for p in out.iterdir()] == ["train.src"]
    monkeypatch.setattr(webnlg, "write_split", write_split)
    cli_entry(lambda: webnlg.main(argv))
    assert sorted(p.name for p in out.iterdir()) == ["eval_splits", "train.src", "train.tgt", "valid.category",
                                                     "valid.entities", "valid.refs.jsonl", "valid.src", "valid.tgt"]


def test_sigterm_unwinds_through_cli_entry(tmp_path):
    """SIGTERM ends a command with exit 143 after its clean-up (the temporary file is removed)."""
    import signal

    from fairseq_knowgen.textio import cli_entry

    def main():
        with atomic_write(str(tmp_path / "o.txt")) as f:
            f.write("half")
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(SystemExit) as stop:
        cli_entry(main)
    assert stop.value.code == 143 and list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored


def test_bom_and_crlf_are_stripped(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"\xef\xbb\xbfchicken run\r\ndog\r\n\r\n")
    assert read_lines(str(tmp_path / "a.txt")) == ["chicken run", "dog", ""]
    (tmp_path / "b.txt").write_bytes(b"dog\n\xef\xbb\xbfcat\n")  # a BOM inside a file is a character
    assert read_lines(str(tmp_path / "b.txt")) == ["dog", "\ufeffcat"]
