"""Growing a pretrained dictionary (fairseq_knowgen.convert.extend_dictionary): the checkpoint's
rows bit-identical, new rows the mean of the old ones (computed here by hand), '<mask>' kept
on its row, tied matrices grown once, and the task dictionary written in the checkpoint's order."""

import shutil

import pytest
import torch
from conftest import run_cli
from fairseq.data import Dictionary

from fairseq_knowgen.convert.extend_dictionary import (
    check_mask_row,
    extended_symbols,
    grow_embeddings,
    grow_rows,
    pretrained_symbols,
)


def test_grow_rows_keeps_rows_and_adds_the_mean():
    torch.manual_seed(0)
    w = torch.randn(5, 3)
    g = grow_rows(w, 7)
    assert g.shape == (7, 3) and torch.equal(g[:5], w)
    mean = [sum(w[i, c].item() for i in range(5)) / 5 for c in range(3)]  # by hand
    for r in (5, 6):
        assert g[r].tolist() == pytest.approx(mean, abs=1e-6)
    half = grow_rows(w.half(), 6)
    assert half.dtype == torch.float16 and torch.equal(half[:5], w.half())


def test_grow_embeddings_tied_once_untied_apart():
    d = Dictionary()
    for s in "a b c <mask> <sep> <ent-0>".split():
        d.add_symbol(s)
    n = len(d) - 2  # the checkpoint knew up to '<mask>'
    torch.manual_seed(0)
    shared, out = torch.randn(n, 4), torch.randn(n, 4)
    sd = {"encoder.embed_tokens.weight": shared, "decoder.embed_tokens.weight": shared,
          "decoder.output_projection.weight": out}
    assert grow_embeddings(sd, d) == 2
    assert sd["encoder.embed_tokens.weight"] is sd["decoder.embed_tokens.weight"]  # still one tensor
    assert torch.equal(sd["decoder.output_projection.weight"][:n], out)
    torch.testing.assert_close(sd["decoder.output_projection.weight"][n], out.mean(0))  # its own mean
    torch.testing.assert_close(sd["encoder.embed_tokens.weight"][n + 1], shared.mean(0))


def test_mask_row_taken_by_a_new_symbol_is_refused():
    d = Dictionary()
    for s in "a b <sep>".split():  # bart's dict.txt + '<sep>': '<sep>' on the checkpoint's '<mask>' row
        d.add_symbol(s)
    with pytest.raises(ValueError, match="'<sep>' on row 6.*'<mask>'"):
        check_mask_row(d, len(d))
    check_mask_row(d, len(d) - 1)  # a checkpoint without that row: '<sep>' is new, fine
    d.add_symbol("<mask>")
    check_mask_row(d, len(d) - 1)  # '<mask>' in the dictionary: its own row


def test_task_dictionary_keeps_the_checkpoints_order(tmp_path):
    (tmp_path / "dict.txt").write_text("11 5\n7 3\n")  # bart-like: GPT-2 ids, no '<mask>'
    specials = Dictionary().symbols
    # one row more than dict.txt + specials: fairseq's denoising task's '<mask>'
    assert pretrained_symbols(str(tmp_path / "dict.txt"), 7) == specials + ["11", "7", "<mask>"]
    assert pretrained_symbols(str(tmp_path / "dict.txt"), 6) == specials + ["11", "7"]
    with pytest.raises(ValueError, match="8 rows"):
        pretrained_symbols(str(tmp_path / "dict.txt"), 8)
    assert extended_symbols(["a", "b"], ["<sep>", "a", "<sep>", "<ent-0>"]) == ["a", "b", "<sep>", "<ent-0>"]
    # the command line on a checkpoint folder
    torch.save({"model": {"encoder.embed_tokens.weight": torch.zeros(7, 2)}}, tmp_path / "model.pt")
    run_cli("-m", "fairseq_knowgen.convert.extend_dictionary", tmp_path, tmp_path / "task.txt", "--add", "<sep>")
    d = Dictionary.load(str(tmp_path / "task.txt"))
    assert d.symbols == specials + ["11", "7", "<mask>", "<sep>"] and d.count[4:6] == [5, 3]


def test_released_bart_dictionary_and_gpt2_bpe(tmp_path):
    """The released bart dict.txt (50,260 lines; a checkpoint of 50,265 rows with fairseq's four
    specials and <mask>) grown with '<sep>': every released symbol keeps its row, '<mask>' its own,
    '<sep>' the next, and GPT-2-encoded text lands on the released rows (stand-ins without
    ../shared/released)."""
    from test_convert_hf_bart import released_or_stand_in
    from test_eki_bart_released import gpt2_bpe

    encoder_json, vocab_bpe, dict_txt = released_or_stand_in(tmp_path / "bpe")
    released = Dictionary.load(str(dict_txt))
    folder = tmp_path / "bart"
    folder.mkdir()
    for f in (dict_txt, encoder_json, vocab_bpe):
        shutil.copy(f, folder)
    torch.save({"model": {"encoder.embed_tokens.weight": torch.zeros(len(released) + 1, 2)}}, folder / "model.pt")
    run_cli("-m", "fairseq_knowgen.convert.extend_dictionary", folder, tmp_path / "task.txt", "--add", "<sep>")
    d = Dictionary.load(str(tmp_path / "task.txt"))
    n = len(released)
    assert d.symbols[:n] == released.symbols and d[n] == "<mask>" and d[n + 1] == "<sep>" and len(d) == n + 2
    text = "A Dog catches the Frisbee in Central Park."
    pieces = gpt2_bpe(folder).encode(text).split()
    ids = d.encode_line(" ".join(pieces), append_eos=False).tolist()
    lines = [x.split()[0] for x in open(dict_txt, encoding="utf-8")]
    assert ids == [lines.index(p) + 4 for p in pieces]  # line k of dict.txt is row k + 3 (1-based)
    assert d.unk() not in ids and len(ids) > 5
