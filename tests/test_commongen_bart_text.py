"""BART's own text on the CommonGen recipe's PRETRAINED path: a cased source and target go through
stage 1 (``prep.commongen --text raw``), the EKI source as stage 2 pastes it, stage 3's GPT-2 BPE and
stage 4's grown dictionary, and decode back (GPT-2's decoder) to the raw strings; ``<sep>``,
``<ent-K>``, ``<unk-N>`` and symbols grown into the dictionary stay one row each. Over the released
GPT-2 BPE and BART ``dict.txt`` where ``../shared/released`` exists, stand-ins where it does not."""

import torch
from conftest import run_cli
from fairseq.data import Dictionary
from test_convert_hf_bart import released_or_stand_in

from fairseq_knowgen.data.eki_dataset import PieceWords, SeparatorKeepingBPE, encode_source

TARGETS = ["A Dog catches the Frisbee in Central Park.", "Two Kids throw a ball,  then run!"]
CONCEPTS = ["dog catch frisbee", "Kid throw ball"]


def gpt2(encoder_json, vocab_bpe):
    from fairseq.data.encoders.gpt2_bpe import GPT2BPE, GPT2BPEConfig

    return GPT2BPE(GPT2BPEConfig(gpt2_encoder_json=str(encoder_json), gpt2_vocab_bpe=str(vocab_bpe)))


def test_cased_source_and_target_decode_back_to_the_raw_strings(tmp_path):
    from fairseq_knowgen.prep.commongen import gpt2_bpe, prepare

    encoder_json, vocab_bpe, dict_txt = released_or_stand_in(tmp_path / "bpe")
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "dev"):
        (data / f"commongen.{split}.src_alpha.txt").write_text("\n".join(CONCEPTS) + "\n")
        (data / f"commongen.{split}.tgt.txt").write_text("\n".join(TARGETS) + "\n")
    raw = tmp_path / "raw"
    prepare(str(data), str(raw), text="raw")
    want_tgt = [" ".join(t.split()) for t in TARGETS]  # whitespace runs made one space, nothing else
    assert (raw / "train.tgt").read_text().splitlines() == want_tgt
    assert (raw / "train.src").read_text().splitlines() == CONCEPTS  # concepts keep their case
    assert (raw / "text").read_text().split() == ["raw"]
    # the EKI source as stage 2 pastes it, with the package's other symbols besides '<sep>'
    eki = [f"{c} <sep> {t}" for c, t in zip(CONCEPTS, want_tgt)] + ["Alan <ent-3> met <unk-2> <sep> The Dog <ent-0> ."]
    (raw / "train.eki.src").write_text("\n".join(eki) + "\n")
    bpe_dir = tmp_path / "out"
    gpt2_bpe(str(encoder_json), str(vocab_bpe), str(raw), str(bpe_dir), ["train.tgt", "train.eki.src"])
    bpe = gpt2(encoder_json, vocab_bpe)
    encoded_tgt = (bpe_dir / "train.tgt").read_text().splitlines()
    assert all(t.isdigit() for line in encoded_tgt for t in line.split())
    assert [bpe.decode(line) for line in encoded_tgt] == want_tgt  # cased, untokenized: BART's text
    # the task dictionary of stage 4: the released rows, <mask>, then the grown symbols
    (tmp_path / "bpe").mkdir(exist_ok=True)
    torch.save({"model": {"encoder.embed_tokens.weight": torch.zeros(len(Dictionary.load(str(dict_txt))) + 1, 1)}},
               tmp_path / "bpe" / "model.pt")
    if dict_txt != tmp_path / "bpe" / "dict.txt":
        (tmp_path / "bpe" / "dict.txt").write_bytes(open(dict_txt, "rb").read())
    grown = ["<sep>", "<ent-0>", "<ent-3>", "<unk-2>"]
    run_cli("-m", "fairseq_knowgen.convert.extend_dictionary", tmp_path / "bpe", tmp_path / "task.txt", "--add", *grown)
    d = Dictionary.load(str(tmp_path / "task.txt"))
    released = Dictionary.load(str(dict_txt))
    assert d.symbols[: len(released)] == released.symbols and d[len(released)] == "<mask>"
    for line, want in zip((bpe_dir / "train.eki.src").read_text().splitlines(), eki):
        ids = d.encode_line(line, add_if_not_exist=False)
        assert d.unk() not in ids.tolist()
        for sym in grown:  # one row each, the grown one
            assert line.split().count(sym) == want.split().count(sym)
            assert ids.tolist().count(d.index(sym)) == want.split().count(sym)
        assert SeparatorKeepingBPE(bpe).decode(d.string(ids)) == want  # each run decodes back


def test_gpt2_words_of_raw_text(tmp_path):
    """With raw text a GPT-2 piece without a leading space starts a new word when its kind
    changes (GPT-2's pre-tokenizer): ``Park.`` is two words, `` Fr`` + ``isbee`` one."""
    encoder_json, vocab_bpe, _ = released_or_stand_in(tmp_path / "bpe")
    bpe = gpt2(encoder_json, vocab_bpe)
    d = Dictionary()
    line = bpe.encode("A Dog catches the Frisbee in Central Park, then 2001.")
    for sym in line.split():
        d.add_symbol(sym)
    _, words = PieceWords(d, str(encoder_json)).words(d.encode_line(line, append_eos=False).tolist())
    assert words == ["a", "dog", "catches", "the", "frisbee", "in", "central", "park", ",", "then", "2001", "."]


def test_encode_source_keeps_package_symbols_whole():
    enc = encode_source("a b <sep> c <ent-1> d <unk-0> <sep>", lambda text: f"[{text}]")
    assert enc == "[a b] <sep> [c] <ent-1> [d] <unk-0> <sep>"
