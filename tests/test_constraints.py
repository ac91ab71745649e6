"""Lexical constraints from a file (``--constraints-from``) with ``fairseq-generate --constraints``.

Packing and collating by hand (the constraints of example i go with example i after the collater
sorts by length), bad files (file:line, exit 2), and end to end: tiny models trained for a few
updates (a transformer with ``translation_constrained``, ``copy_transformer_small``, and
``eki_transformer`` with ``eki_generation``) put every constraint of example i into every
hypothesis of example i, which the same run without constraints does not.
"""

import re

import pytest
import torch
from conftest import TINY_MODEL, TRAIN_COMMON
from fairseq.data import Dictionary, LanguagePairDataset
from fairseq.token_generation_constraints import unpack_constraints
from test_interactive import by_id, in_process

from fairseq_knowgen.data.constraints import attach_constraints, parse_constraints
from fairseq_knowgen.data.eki_dataset import EKIDataset
from fairseq_knowgen.textio import DataError

DECODE = [
    "--user-dir",
    "fairseq_knowgen",
    "--cpu",
    "--beam",
    "3",
    "--nbest",
    "3",
    "--batch-size",
    "8",
    "--required-batch-size-multiple",
    "1",
    "--max-len-a",
    "0",
    "--max-len-b",
    "20",
]
ARCHS = {
    # arch: (training data fixture, task, training flags); decoded: split 'test'
    "transformer": ("tiny_bin", "translation_constrained", [*TINY_MODEL]),
    "copy_transformer_small": ("tiny_bin", "translation_constrained", [*TINY_MODEL, "--criterion", "force_copy"]),
    "eki_transformer": (
        "eki_bin",
        "eki_generation",
        [*TINY_MODEL, "--eki-scaling-dim", "8", "--criterion", "eki_label_smoothed_cross_entropy"],
    ),
}


def make_dict(words):
    d = Dictionary()
    for w in words:
        d.add_symbol(w)
    return d


def test_packed_format_hand_computed(tmp_path):
    d = make_dict("a b c".split())
    a, b, c = d.index("a"), d.index("b"), d.index("c")
    cons = parse_constraints(["a b\tc", "", "c"], d)
    assert [[x.tolist() for x in row] for row in cons] == [[[a, b], [c]], [], [[c]]]
    # fairseq's packed row: number of constraints, then each constraint followed by 0
    src = [torch.tensor([a, d.eos()])] * 3
    ds = LanguagePairDataset(src, [2] * 3, d)
    attach_constraints(ds, write(tmp_path / "test.cons", ["a b\tc", "", "c"]), d)
    assert [row.tolist() for row in ds.constraints] == [[2, a, b, 0, c, 0], [0], [1, c, 0]]


def write(path, lines):
    """Write LINES to PATH; its name as a string."""
    path.write_text("".join(x + "\n" for x in lines))
    return str(path)


def sorted_dataset(d, path, wrap_eki=False):
    """Four examples whose sources have lengths 2, 5, 3, 4 (so the collater reorders them), with
    constraint i = the i-th word and, for odd i, also the 2-word phrase 'w w'."""
    words = "w0 w1 w2 w3".split()
    for w in words:
        d.add_symbol(w)
    lengths = [2, 5, 3, 4]
    srcs = [torch.tensor([d.index("<sep>")] + [d.index("x")] * (n - 2) + [d.eos()]) for n in lengths]
    ds = LanguagePairDataset(srcs, lengths, d, srcs, lengths, d, left_pad_source=True)
    lines = [w + (f"\t{w} {w}" if i % 2 else "") for i, w in enumerate(words)]
    attach_constraints(ds, write(path, lines), d)
    return EKIDataset(ds, d) if wrap_eki else ds


@pytest.mark.parametrize("wrap_eki", [False, True])
def test_collater_keeps_each_examples_constraints(wrap_eki, tmp_path):
    d = make_dict("x <sep>".split())
    ds = sorted_dataset(d, tmp_path / "test.cons", wrap_eki)
    batch = ds.collater([ds[i] for i in range(4)])
    ids = batch["id"].tolist()
    assert ids == [1, 3, 2, 0]  # sorted by source length, longest first: the order differs from the file's
    for row, i in enumerate(ids):
        got = [d.string(c) for c in unpack_constraints(batch["constraints"][row])]
        assert got == [f"w{i}"] + ([f"w{i} w{i}"] if i % 2 else [])


@pytest.mark.parametrize(
    "lines,match",
    [
        (["a", "b\t\tc", "c"], r":2: constraint 2 is empty"),
        (["a\t", "b", "c"], r":1: constraint 2 is empty"),
        (["a", "b", "a@@ \tb"], r":3: constraint 1 ends in the BPE continuation piece 'a@@'"),
        (["a", "zebra", "c"], r":2: constraint 1 holds 'zebra', which is not in the target dictionary"),
        (["a", "b </s>", "c"], r":2: constraint 1 holds the special symbol '</s>'"),
        (["a", "b"], r":3: line-count mismatch: 2 lines of constraints but 3 inputs"),
        (["a", "b", "c", "a"], r":4: line-count mismatch: 4 lines of constraints but 3 inputs"),
    ],
)
def test_bad_constraints_name_file_and_line(lines, match, tmp_path):
    d = make_dict("a b c a@@".split())
    src = [torch.tensor([d.index("a"), d.eos()])] * 3
    path = write(tmp_path / "test.cons", lines)
    with pytest.raises(DataError, match=rf"^{path}{match}"):
        attach_constraints(LanguagePairDataset(src, [2] * 3, d), path, d)


def test_placeholder_must_be_in_its_source(tmp_path):
    d = make_dict("a <unk-0> <unk-1>".split())
    src = [torch.tensor([d.index("a"), d.index("<unk-0>"), d.eos()]), torch.tensor([d.index("<unk-1>"), d.eos()])]
    ds = LanguagePairDataset(src, [3, 2], d)
    attach_constraints(ds, write(tmp_path / "test.cons", ["a <unk-0>", "<unk-1>"]), d)
    path = write(tmp_path / "test.bad", ["a <unk-0>", "a\ta <unk-0>"])
    with pytest.raises(DataError, match=r"test\.bad:2: constraint 2 holds the placeholder '<unk-0>', which is not in"):
        attach_constraints(ds, path, d)


def test_missing_file_is_named(tmp_path):
    d = make_dict("a".split())
    with pytest.raises(DataError, match=r"test\.cons: constraints file not found"):
        attach_constraints(LanguagePairDataset([torch.tensor([d.eos()])], [1], d), str(tmp_path / "test.cons"), d)


def test_unknown_words_can_be_dropped():
    d = make_dict("a b".split())
    cons = parse_constraints(["a\tzebra b", "b"], d, unk="drop")
    assert [[d.string(c) for c in row] for row in cons] == [["a"], ["b"]]


# ----------------------------------------------------------------- end to end


def eki_decode_data(eki_bin, out):
    """``OUT/test``: EKI sources of different lengths (prototypes of 1-4 clauses) binarized with
    ``eki_bin``'s dictionaries, so that batches get sorted (``eki_bin``'s valid sources all have one
    length)."""
    from conftest import WORDS

    raw = out / "raw"
    raw.mkdir()
    src, tgt = [], []
    for i in range(16):
        a, b, c = WORDS[i % 14], WORDS[(i + 5) % 14], WORDS[(i + 9) % 14]
        clauses = " and ".join(f"the {WORDS[(i + k) % 14]} are near the {a}" for k in range(1 + (i * 7) % 4))
        src.append(f"{a} {b} {c} <sep> {clauses}")
        tgt.append(f"the {a} and the {b} {c}")
    (raw / "test.src").write_text("".join(x + "\n" for x in src))
    (raw / "test.tgt").write_text("".join(x + "\n" for x in tgt))
    dest = out / "bin"
    args = ["--source-lang", "src", "--target-lang", "tgt", "--testpref", raw / "test", "--destdir", dest]
    in_process("preprocess", *args, "--srcdict", eki_bin / "dict.src.txt", "--tgtdict", eki_bin / "dict.tgt.txt")
    return dest


@pytest.fixture(scope="module")
def trained(request, tmp_path_factory):
    """``arch -> (data dir to decode, checkpoint)``, trained on first use (20 updates, in-process)."""
    cache = {}

    def get(arch):
        if arch not in cache:
            fixture, task, flags = ARCHS[arch]
            data = request.getfixturevalue(fixture)
            save = tmp_path_factory.mktemp(arch)
            train = (
                ["--task", task] if task == "eki_generation" else []
            )  # translation_constrained decodes translation's
            in_process(
                "train", data, *TRAIN_COMMON, *train, "--arch", arch, *flags, "--max-update", "20", "--save-dir", save
            )
            if task == "eki_generation":
                data = eki_decode_data(data, tmp_path_factory.mktemp("ekidecode"))
            cache[arch] = data, save / "checkpoint_last.pt"
        return cache[arch]

    return get


def distinct_constraints(data, n_inputs):
    """One line per input: input i gets a word and a 2-word phrase, from the words of the target
    dictionary except its 5 most frequent, taken in turn (so neighbouring inputs share none);
    every fourth input gets none."""
    d = Dictionary.load(str(data / "dict.tgt.txt"))
    pool = [w for w in d.symbols[d.nspecial :] if w.isalpha()][5:]
    lines, k = [], 0
    for i in range(n_inputs):
        if i % 4 == 3:
            lines.append("")
            continue
        lines.append(f"{pool[k % len(pool)]}\t{pool[(k + 1) % len(pool)]} {pool[(k + 2) % len(pool)]}")
        k += 3
    assert len(set(lines)) == n_inputs - n_inputs // 4 + 1  # every input's constraints are its own
    return lines


def contains(hyp, constraint):
    h, c = hyp.split(), constraint.split()
    return any(h[j : j + len(c)] == c for j in range(len(h) - len(c) + 1))


def hypotheses(output):
    """``{id: [hypothesis text, ...]}`` (all n-best) of fairseq-generate's output."""
    out = {}
    for line in output.splitlines():
        if line.startswith("H-"):
            fields = line.split("\t")
            out.setdefault(int(fields[0][2:]), []).append(fields[2])
    return out


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_generate_puts_each_examples_constraints_in_its_hypotheses(arch, trained):
    data, checkpoint = trained(arch)
    common = [data, *DECODE, "--task", ARCHS[arch][1], "--path", checkpoint, "--gen-subset", "test"]
    plain_out = in_process("generate", *common)
    n = len(by_id(plain_out, "S"))
    lines = distinct_constraints(data, n)
    (data / "test.cons").write_text("".join(x + "\n" for x in lines))

    out = in_process("generate", *common, "--constraints", "unordered", "--constraints-from", "cons")
    hyps = hypotheses(out)
    assert sorted(hyps) == list(range(n))
    printed = [int(line.split("\t")[0][2:]) for line in out.splitlines() if line.startswith("S-")]
    assert printed != sorted(printed)  # batches go in source-length order, not in the file's
    for i, line in enumerate(lines):
        constraints = line.split("\t") if line else []
        for hyp in hyps[i]:  # every n-best hypothesis (fairseq may end with fewer than --nbest)
            assert all(contains(hyp, c) for c in constraints), (i, hyp, constraints)

    plain = hypotheses(plain_out)
    missed = [i for i, line in enumerate(lines) if line and not all(contains(plain[i][0], c) for c in line.split("\t"))]
    assert len(missed) >= n // 2, "the model writes most constraints unforced: the test shows little"


def test_bad_file_stops_generate_with_exit_2(trained, tiny_raw, capsys):
    data, checkpoint = trained("transformer")
    common = [data, *DECODE, "--task", "translation_constrained", "--path", checkpoint, "--gen-subset", "test"]
    n = len((tiny_raw / "test.src").read_text().splitlines())
    (data / "test.bad").write_text("".join("Lisbon\n" if i != 4 else "Lisbon\t\tchemist\n" for i in range(n)))
    with pytest.raises(SystemExit) as e:
        in_process("generate", *common, "--constraints", "unordered", "--constraints-from", "bad")
    assert e.value.code == 2
    assert f"error: {data}/test.bad:5: constraint 2 is empty" in capsys.readouterr().err
    # constraints without a constrained search: fairseq's beam search would refuse every batch
    (data / "test.good").write_text("Lisbon\n" * n)
    with pytest.raises(SystemExit) as e:
        in_process("generate", *common, "--constraints-from", "good")
    assert e.value.code == 2
    assert "error: --constraints-from good puts lexical constraints in every batch" in capsys.readouterr().err


def test_constraints_longer_than_the_length_limit_stop_with_exit_2(trained, tiny_raw, capsys):
    """3 constraint tokens: --max-len-b 3 decodes them (fairseq's limit is inclusive), 2 would make
    fairseq's search fail an assertion; fairseq-generate and fairseq-interactive stop with exit 2
    naming the limit instead."""
    data, checkpoint = trained("transformer")
    sources = (tiny_raw / "test.src").read_text().splitlines()
    (data / "test.long").write_text("Lisbon\tchemist Oslo\n" * len(sources))
    base = [*DECODE[:-4], "--task", "translation_constrained", "--path", checkpoint, "--constraints", "unordered"]
    base += ["--max-len-a", "0"]
    generate = [data, *base, "--gen-subset", "test", "--constraints-from", "long"]
    interactive = [data, *base, "--buffer-size", "8"]
    stdin = "".join(f"{x}\tLisbon\tchemist Oslo\n" for x in sources[:3])
    for hyps in (
        hypotheses(in_process("generate", *generate, "--max-len-b", "3")),
        hypotheses(in_process("interactive", *interactive, "--max-len-b", "3", stdin=stdin)),
    ):
        assert sorted(hyps) in (list(range(len(sources))), [0, 1, 2])
        # 3 tokens and EOS: each hypothesis is the two constraints, in either order
        assert all(h in ("Lisbon chemist Oslo", "chemist Oslo Lisbon") for hs in hyps.values() for h in hs)
    for tool, args, which in (("generate", generate, r"input \d+"), ("interactive", interactive, "an input")):
        with pytest.raises(SystemExit) as e:
            in_process(tool, *args, "--max-len-b", "2", stdin=stdin)
        assert e.value.code == 2
        assert re.search(
            rf"error: {which}: its constraints hold 3 tokens, more than the 2 the decoder may write",
            capsys.readouterr().err,
        )


@pytest.mark.parametrize("arch", ["transformer", "copy_transformer_small"])
def test_at_most_once_keeps_listed_symbols_to_one_occurrence(arch, trained):
    """``--at-most-once REGEX``: no hypothesis (of the n-best) holds a matching symbol twice, while the
    same checkpoint repeats such symbols without the rule; symbols outside REGEX stay free."""
    data, checkpoint = trained(arch)
    common = [data, *DECODE, "--task", "translation_constrained", "--path", checkpoint, "--gen-subset", "test"]

    def repeats(hyps, regex):
        return [h for hs in hyps.values() for h in hs if len(matching := re.findall(regex, h)) > len(set(matching))]

    words = r"\b[a-z]+\b"
    assert repeats(hypotheses(in_process("generate", *common)), words), "the tiny model repeats no word: no test"
    ruled = hypotheses(in_process("generate", *common, "--at-most-once", "[a-z]+"))
    assert ruled and not repeats(ruled, words)


def test_at_most_once_matching_nothing_is_an_error(trained, capsys):
    data, checkpoint = trained("transformer")
    with pytest.raises(SystemExit) as e:
        in_process(
            "generate", data, *DECODE, "--task", "translation_constrained", "--path", checkpoint,
            "--gen-subset", "test", "--at-most-once", "<nothing-\\d+>",
        )  # fmt: skip
    assert e.value.code == 2 and "matches no target symbol" in capsys.readouterr().err


def test_constraints_unmet_at_the_length_limit_end_there_instead_of_failing(trained, tiny_raw, caplog):
    """Two constraints 'Lisbon' (it must appear twice) under ``--at-most-once Lisbon`` can never be
    met (fairseq's banks still force the blocked second 'Lisbon', at score -inf, and a -inf EOS is
    never finalized): fairseq's search failed ``AssertionError: N < N`` (seen on WebNLG dev); the
    length-safe search ends such inputs' best hypotheses at the limit, every input keeps
    hypotheses, none breaks the rule, and the count is logged."""
    data, checkpoint = trained("transformer")
    n = len((tiny_raw / "test.src").read_text().splitlines())
    (data / "test.twice").write_text("Lisbon\tLisbon\n" * n)
    args = [data, *DECODE, "--task", "translation_constrained", "--path", checkpoint, "--gen-subset", "test"]
    args += ["--constraints", "unordered", "--constraints-from", "twice", "--at-most-once", "Lisbon"]
    with caplog.at_level("WARNING"):
        hyps = hypotheses(in_process("generate", *args))
    assert sorted(hyps) == list(range(n))
    assert all(h.split().count("Lisbon") <= 1 for hs in hyps.values() for h in hs)  # the rule still holds
    assert any("had no hypothesis meeting its constraints at the length limit" in r.message for r in caplog.records)
