"""Whole-entity placeholders ``<ent-K>`` of WebNLG (``fairseq_knowgen.prep.entities``): the
matcher on tricky entity forms, delexicalize -> restore round trips, the upper bound counted by
``prep.webnlg --entity-placeholders``, the composition with word placeholders ``<unk-N>`` (the
dictionary always has the entity tokens, restore puts both back), and bad input. The expected
strings are written by hand from the rules in the module docstring."""

import json

import pytest
from conftest import run_cli
from test_recipes import webnlg_xml

from fairseq_knowgen.prep import entities as E
from fairseq_knowgen.prep import placeholders, webnlg
from fairseq_knowgen.text import EntityMatcher, moses_tokenize, surface_form
from fairseq_knowgen.textio import cli_entry


def tok(text):
    return moses_tokenize(text, lowercase=False)


def delexicalize(triples, text, style="text"):
    """(delexicalized source, delexicalized tokenized text, entity ids found, surface forms)."""
    src = webnlg.linearize(triples, tok)
    delex, ents = E.delexicalize_source(src.split())
    tgt, found = EntityMatcher(ents, style).delexicalize(tok(text).split())
    return " ".join(delex), " ".join(tgt), found, [surface_form(e, style) for e in ents]


ROUND_TRIPS = [
    # nested: "Texas" inside "Abilene , Texas", "Abilene" inside "Abilene Regional Airport": longest first
    (
        [("Abilene,_Texas", "isPartOf", "Texas"), ("Abilene_Regional_Airport", "cityServed", "Abilene,_Texas")],
        "Abilene Regional Airport serves Abilene, Texas, which is in Texas.",
        "<ent-2> serves <ent-0> , which is in <ent-1> .",
        "Abilene Regional Airport serves Abilene , Texas , which is in Texas .",
    ),
    # a quoted ISO date (with an RDF datatype) written as text is restored as written
    (
        [("Alan_Bean", "birthDate", '"1932-03-15"^^xsd:date')],
        "Alan Bean was born on March 15, 1932.",
        "<ent-0> was born on <ent-1> .",
        "Alan Bean was born on March 15 , 1932 .",
    ),
    # another date format: restored in the one text form
    (
        [("Alan_Bean", "birthDate", '"1932-03-15"')],
        "Alan Bean (born 15th March 1932) flew.",
        "<ent-0> ( born <ent-1> ) flew .",
        "Alan Bean ( born March 15 , 1932 ) flew .",
    ),
    # a disambiguating parenthesis the text drops
    (
        [("Big_Hero_6_(film)", "starring", "Ryan_Potter")],
        "Ryan Potter starred in Big Hero 6.",
        "<ent-1> starred in <ent-0> .",
        "Ryan Potter starred in Big Hero 6 .",
    ),
    # accents and case
    (
        [("Arròs_negre", "country", "Spain")],
        "Arros Negre comes from Spain.",
        "<ent-0> comes from <ent-1> .",
        "Arròs negre comes from Spain .",
    ),
    # a number with its unit in parentheses, written without .0 and with an abbreviated unit
    (
        [("3Arena", "height", '"28.0 (metres)"')],
        "3Arena is 28 m high.",
        "<ent-0> is <ent-1> high .",
        "3Arena is 28.0 metres high .",
    ),
    # two entities of one normalized form: each mention goes to the one it spells
    (
        [("Ajoblanco", "alternativeName", '"Ajo blanco"')],
        "Ajoblanco is also called Ajo blanco.",
        "<ent-0> is also called <ent-1> .",
        "Ajoblanco is also called Ajo blanco .",
    ),
    # an acronym is matched with its case only ("U.S." yes, "us" no)
    (
        [("Alan_Shepard", "nationality", "United_States")],
        "Alan Shepard of the U.S. told us about it.",
        "<ent-0> of the <ent-1> told us about it .",
        "Alan Shepard of the United States told us about it .",
    ),
    # a language is its name; "the Spanish language" keeps its word "language"
    (
        [("Spain", "language", "Spanish_language")],
        "Spanish is spoken in Spain, the Spanish language.",
        "<ent-1> is spoken in <ent-0> , the <ent-1> language .",
        "Spanish is spoken in Spain , the Spanish language .",
    ),
    # a comma list with "and" before its last item
    (
        [("Ajoblanco", "ingredient", '"Bread, almonds, garlic"')],
        "Ajoblanco has bread, almonds and garlic.",
        "<ent-0> has <ent-1> .",
        "Ajoblanco has Bread , almonds , garlic .",
    ),
]


@pytest.mark.parametrize("triples, text, delexicalized, restored", ROUND_TRIPS)
def test_delexicalize_restore_round_trip(triples, text, delexicalized, restored):
    src, tgt, found, surfaces = delexicalize(triples, text)
    assert tgt == delexicalized
    assert found == set(range(len(surfaces)))
    assert E.restore(tgt, surfaces) == restored


def test_source_entities_numbered_by_first_occurrence():
    tokens = "<S> Ann Bo <P> knows <O> Cy <S> Cy <P> born in <O> Ann Bo".split()
    delex, ents = E.delexicalize_source(tokens)
    assert " ".join(delex) == "<S> <ent-0> <P> knows <O> <ent-1> <S> <ent-1> <P> born in <O> <ent-0>"
    assert ents == ["Ann Bo", "Cy"]


def test_dbpedia_surface_keeps_the_parenthesis_and_iso_date():
    _, tgt, _, surfaces = delexicalize(
        [("Big_Hero_6_(film)", "releaseDate", '"2014-11-07"')], "Big Hero 6 came out on 7 November 2014.", "dbpedia"
    )
    assert E.restore(tgt, surfaces) == "Big Hero 6 ( film ) came out on 2014-11-07 ."


def test_entity_missing_from_the_reference():
    src, tgt, found, surfaces = delexicalize([("Alan_Bean", "occupation", "Test_pilot")], "Alan Bean flew.")
    assert (src, tgt, found) == ("<S> <ent-0> <P> occupation <O> <ent-1>", "<ent-0> flew .", {0})
    assert E.restore("<ent-1> and <ent-0> and <ent-7>", surfaces) == "Test pilot and Alan Bean and <ent-7>"


# --- through the prep CLI ----------------------------------------------------------------------------------


def write_data(root, train, dev):
    for split, entries in (("train", train), ("dev", dev)):
        folder = root / split / "1triples"
        folder.mkdir(parents=True)
        (folder / "Artist.xml").write_text(webnlg_xml([("Artist", t, x) for t, x in entries]))


TRAIN = [
    ([("Abilene,_Texas", "isPartOf", "Texas")], ["Abilene, Texas is in Texas.", "Abilene is a city in Texas."]),
    # "UT Austin , B.S. 1955" is not in the text: found 2 of 3
    (
        [("Alan_Bean", "birthDate", '"1932-03-15"'), ("Alan_Bean", "almaMater", '"UT Austin, B.S. 1955"')],
        ["Alan Bean was born on March 15th, 1932 and studied at UT Austin."],
    ),
]
DEV = [
    (
        [("Arròs_negre", "country", "Spain"), ("Arròs_negre", "ingredient", "Squid_ink")],
        ["Arros negre is from Spain.", "Arròs negre, from Spain, contains squid ink."],
    )
]


def test_prep_cli_writes_placeholders_entmap_and_match_rate(tmp_path):
    write_data(tmp_path, TRAIN, DEV)
    out = tmp_path / "out"
    proc = run_cli(
        "-m",
        "fairseq_knowgen.prep.webnlg",
        "--data",
        tmp_path,
        "--out",
        out,
        "--heldout-categories",
        "",
        "--entity-placeholders",
    )
    lines = lambda name: (out / name).read_text().splitlines()  # noqa: E731
    assert lines("train.src") == [
        "<S> <ent-0> <P> is part of <O> <ent-1>",
        "<S> <ent-0> <P> is part of <O> <ent-1>",
        "<S> <ent-0> <P> birth date <O> <ent-1> <S> <ent-0> <P> alma mater <O> <ent-2>",
    ]
    assert lines("train.tgt") == [
        "<ent-0> is in <ent-1> .",
        "<ent-0> is a city in <ent-1> .",
        "<ent-0> was born on <ent-1> and studied at UT Austin .",
    ]
    assert lines("valid.src") == ["<S> <ent-0> <P> country <O> <ent-1> <S> <ent-0> <P> ingredient <O> <ent-2>"]
    assert lines("valid.tgt") == ["<ent-0> is from <ent-1> ."]
    assert lines("valid.lex.src") == [
        "<S> Arròs negre <P> country <O> Spain <S> Arròs negre <P> ingredient <O> Squid ink"
    ]
    assert [json.loads(x) for x in lines("valid.entmap")] == [["Arròs negre", "Spain", "Squid ink"]]
    assert [json.loads(x) for x in lines("train.entmap")][2] == [
        "Alan Bean",
        "March 15 , 1932",
        "UT Austin , B.S. 1955",
    ]
    # train: 2 texts x 2 entities all found + 1 text x 3 entities, 2 found; valid: every reference counts
    match = json.loads((out / "entity_match.json").read_text())
    assert (match["train"]["mentions"], match["train"]["found"]) == (7, 6)
    assert (match["valid"]["mentions"], match["valid"]["found"]) == (6, 5)
    assert match["valid"]["entity_match_rate"] == pytest.approx(5 / 6)
    printed = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert [(p["split"], p["entity_match_rate"]) for p in printed] == [("train", 6 / 7), ("valid", 5 / 6)]

    # the interactive path (entities delexicalize on the linearized source) gives the same input and map
    E.main(["delexicalize", "--input", str(out / "valid.lex.src"), "--out", str(tmp_path / "v.src"),
            "--entmap", str(tmp_path / "v.entmap")])  # fmt: skip
    assert (tmp_path / "v.src").read_text() == (out / "valid.src").read_text()
    assert (tmp_path / "v.entmap").read_text() == (out / "valid.entmap").read_text()

    # without the option: no stale entity files, plain sources
    webnlg.main(["--data", str(tmp_path), "--out", str(out), "--heldout-categories", ""])
    for name in ("valid.entmap", "valid.lex.src", "train.entmap", "entity_match.json"):
        assert not (out / name).exists(), name
    assert lines("valid.src") == ["<S> Arròs negre <P> country <O> Spain <S> Arròs negre <P> ingredient <O> Squid ink"]


# --- composition with <unk-N> ------------------------------------------------------------------------------


def test_dictionary_keeps_every_entity_token_and_restore_puts_both_back(tmp_path, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    # <ent-3> occurs only in valid (an unseen split): it must still be a word, never <unk-N> or <unk>
    (raw / "train.src").write_text("<S> <ent-0> <P> born in <O> <ent-1>\n" * 6)
    (raw / "train.tgt").write_text("<ent-0> was born in <ent-1> .\n" * 6)
    (raw / "valid.src").write_text("<S> <ent-0> <P> born in <O> <ent-1> <S> <ent-0> <P> likes <O> <ent-3>\n")
    (raw / "valid.tgt").write_text("<ent-0> likes <ent-3> and Zorblax .\n")
    out = tmp_path / "enc"
    placeholders.main(["encode", "--train-prefix", str(raw / "train"), "--splits", str(raw / "train"),
                       str(raw / "valid"), "--out-dir", str(out), "--max-positions", "20"])  # fmt: skip
    words = [line.split()[0] for line in (out / "dict.txt").read_text().splitlines()]
    assert len(words) == len(set(words))
    assert [w for w in words if w.startswith("<ent-")] == ["<ent-0>", "<ent-1>", "<ent-2>", "<ent-3>"]
    # train has one distinct source (< --min-source-df 5), and only "was" and "." are generated (not in the
    # source), so every other word but the markers <S> <P> <O> (always kept) is rare. valid.src positions:
    # 0 <S> 1 <ent-0> 2 <P> 3 born 4 in 5 <O> 6 <ent-1> 7 <S> 8 <ent-0> 9 <P> 10 likes 11 <O> 12 <ent-3>
    assert (out / "valid.src").read_text().split() == [
        "<S>", "<ent-0>", "<P>", "<unk-3>", "<unk-4>", "<O>", "<ent-1>",
        "<S>", "<ent-0>", "<P>", "<unk-10>", "<O>", "<ent-3>",
    ]  # fmt: skip
    assert (out / "valid.tgt").read_text().split() == ["<ent-0>", "<unk-10>", "<ent-3>", "<unk>", "<unk>", "."]

    # restore: <unk-N> from the delexicalized source, then <ent-K> from the entity map; other lines pass
    (raw / "valid.entmap").write_text(json.dumps(["Alan Bean", "Abilene , Texas", "NASA", "Arròs negre"]) + "\n")
    gen = tmp_path / "valid.gen"
    gen.write_text("S-0\t<S> <ent-0>\nH-0\t-0.5\t<ent-0> <unk-10> <ent-3> .\nD-0\t-0.5\t<ent-1> <ent-9>\n")
    placeholders.main(["restore", "--gen", str(gen), "--src", str(raw / "valid.src"), "--entmap",
                       str(raw / "valid.entmap"), "--out", str(tmp_path / "valid.out")])  # fmt: skip
    assert (tmp_path / "valid.out").read_text().splitlines() == [
        "S-0\t<S> <ent-0>",
        "H-0\t-0.5\tAlan Bean likes Arròs negre .",
        "D-0\t-0.5\tAbilene , Texas <ent-9>",
    ]

    # encode-source (fairseq-interactive) keeps <ent-K> too
    placeholders.main(["encode-source", "--dict", str(out / "dict.txt"), "--input", str(raw / "valid.src"),
                       "--out", str(tmp_path / "enc.src")])  # fmt: skip
    assert (tmp_path / "enc.src").read_text() == (out / "valid.src").read_text()


# --- bad input ----------------------------------------------------------------------------------------------


def run_main(main, argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli_entry(lambda: main(argv))
    return e.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "triple, message",
    [
        (("Alan_Bean", "birthDate"), "malformed triple"),  # two parts
        (("Alan_Bean", "birthDate", '""'), "empty object"),
        (("_", "birthDate", "1932"), "empty subject"),
    ],
)
def test_bad_triple_names_file_and_line(tmp_path, capsys, triple, message):
    # webnlg_xml: line 1 <benchmark>, 2 <entries>, 3 <entry>, 4 <modifiedtripleset>, 5 first <mtriple>
    write_data(tmp_path, [([("Ann", "knows", "Bo"), triple], ["Ann knows Bo."])], [([("Ann", "knows", "Bo")], ["x"])])
    code, err = run_main(webnlg.main, ["--data", str(tmp_path), "--out", str(tmp_path / "o")], capsys)
    assert code == 2
    assert f"Artist.xml:6: {message}" in err


@pytest.mark.parametrize(
    "line, message",
    [
        ("<S> Alan Bean <P> born in", "the last triple ends before its <O> part"),
        ("<S> <P> born in <O> Wapakoneta", "empty subject after <S>"),
        ("Alan Bean <P> born in <O> Wapakoneta", "token 1 is 'Alan' where <S> was expected"),
    ],
)
def test_bad_linearized_source_names_file_and_line(tmp_path, capsys, line, message):
    src = tmp_path / "raw.src"
    src.write_text(f"<S> Ann <P> knows <O> Bo\n{line}\n")
    argv = ["delexicalize", "--input", str(src), "--out", str(tmp_path / "o"), "--entmap", str(tmp_path / "m")]
    code, err = run_main(E.main, argv, capsys)
    assert code == 2 and f"raw.src:2: {message}" in err
    assert not (tmp_path / "o").exists()


def test_bad_entmap_names_file_and_line(tmp_path, capsys):
    (tmp_path / "s").write_text("<ent-0> x\n<ent-0> y\n")
    (tmp_path / "m").write_text('["Ann"]\n["Ann", ""]\n')
    (tmp_path / "g").write_text("H-0\t0\t<ent-0>\n")
    argv = ["restore", "--gen", str(tmp_path / "g"), "--src", str(tmp_path / "s"), "--entmap", str(tmp_path / "m")]
    code, err = run_main(placeholders.main, argv, capsys)
    assert code == 2 and "m:2: expected a JSON list of non-empty strings" in err


def test_markers_stay_in_the_vocabulary_when_sources_repeat():
    # with entity placeholders every source of one predicate is the same line: the markers have a source
    # document frequency of 1, yet must not become <unk-N> placeholders
    from fairseq_knowgen.prep.placeholders import build_vocab, encode_pair

    src = ["<S> <ent-0> <P> birth place <O> <ent-1>"] * 10
    tgt = ["<ent-0> was born in <ent-1> ."] * 10
    vocab = build_vocab(src, tgt, min_count=2, min_source_df=5)
    assert {"<S>", "<P>", "<O>"} <= set(vocab) and "birth" not in vocab and "<unk>" not in vocab
    s, _ = encode_pair(src[0].split(), tgt[0].split(), vocab, max_positions=100)
    assert s[0] == "<S>" and s[2] == "<P>" and s[5] == "<O>"
