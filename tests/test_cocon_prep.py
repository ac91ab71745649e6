"""prep.cocon's decoding inputs with prompts (as the authors decode: always from a prompt): CommonGen concept sets
get the fixed prompts of ``prompts.txt`` in turn, held-back sentences their own first words, with the content taken
after them; the prompted LM's inputs hold the content before the prompt."""

import re

import pytest

from fairseq_knowgen.prep.cocon import PROMPTS, make_inputs, write_prompts

CONCEPTS = ["dog ball throw", "gi@@ raffe tree", "boat river", "cat sit"]
OPENINGS = ["the", "in the morning ,", "there is"]
HELD = [
    "the gi@@ raffe ran across the big field to eat leaves",
    "a dog chased the red ball in the park yes@@ ter@@ day morning",
    "short one",  # two words: no prompt of three and a content after it
    "my friend sw@@ am in the cold river",  # prompt "my friend sw@@ am": 4 tokens after it
]


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")


def read(path):
    return path.read_text().splitlines()


@pytest.fixture
def bpe_dir(tmp_path):
    bpe = tmp_path / "bpe"
    bpe.mkdir()
    write(bpe / "cg.concepts.txt", CONCEPTS)
    write(bpe / "prompts.txt", OPENINGS)
    write(bpe / "heldout.txt", HELD)
    return bpe


@pytest.mark.parametrize("mode", ["separate", "joined"])
def test_commongen_inputs_take_the_prompts_in_turn(bpe_dir, tmp_path, mode):
    """Concept set i: its concepts (one content each, a word with its BPE pieces; or one content) then
    ``<prompt>`` and prompt i mod n; the prompted LM's input: ``<prompt>``, the concepts, the prompt."""
    out = tmp_path / "gen"
    make_inputs(str(bpe_dir), str(out), content_mode=mode, lengths=(3,))
    sep = " <sep> " if mode == "separate" else " "
    contents = [["dog", "ball", "throw"], ["gi@@ raffe", "tree"], ["boat", "river"], ["cat", "sit"]]
    prompts = [OPENINGS[i % 3] for i in range(4)]
    assert read(out / "cg.src") == [f"{sep.join(c)} <prompt> {p}" for c, p in zip(contents, prompts)]
    assert read(out / "cg.prompt.src") == [f"<prompt> {' '.join(c)} {p}" for c, p in zip(contents, prompts)]


def test_commongen_inputs_without_a_prompt_file_have_no_prompt(bpe_dir, tmp_path):
    (bpe_dir / "prompts.txt").unlink()
    make_inputs(str(bpe_dir), str(tmp_path / "gen"), lengths=(3,))
    assert read(tmp_path / "gen" / "cg.src")[0] == "dog <sep> ball <sep> throw"
    assert read(tmp_path / "gen" / "cg.prompt.src")[0] == "<prompt> dog ball throw"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_held_back_inputs_prompt_with_the_first_words_and_take_the_content_after_them(bpe_dir, tmp_path, seed):
    """ht{K}: for each held-back sentence with more than 3 words and K tokens after them, the prompt is its first
    3 words (BPE pieces and all), the content at most K tokens from after the prompt, starting and ending at word
    boundaries; ``ht{K}.prompt.src`` holds the content before the prompt; ``ht{K}.content`` the content's text."""
    out = tmp_path / "gen"
    make_inputs(str(bpe_dir), str(out), lengths=(3, 5), seed=seed, prompt_words=3)
    prompts = {"the gi@@ raffe ran": HELD[0], "a dog chased": HELD[1], "my friend sw@@ am": HELD[3]}
    for k, which in ((3, [0, 1, 3]), (5, [0, 1])):
        src, prompted, text = read(out / f"ht{k}.src"), read(out / f"ht{k}.prompt.src"), read(out / f"ht{k}.content")
        assert len(src) == len(prompted) == len(text) == len(which)
        for line, pline, ctext, n in zip(src, prompted, text, which):
            content, prompt = (x.strip() for x in line.split("<prompt>"))
            assert prompts[prompt] == HELD[n]
            rest = HELD[n].split()[len(prompt.split()) :]
            c = content.split()
            assert 0 < len(c) <= k
            starts = [i for i in range(len(rest) - len(c) + 1) if rest[i : i + len(c)] == c]
            assert starts, (content, rest)
            i = starts[0]
            assert not (i > 0 and rest[i - 1].endswith("@@")) and not c[-1].endswith("@@")  # whole words
            assert pline == f"<prompt> {content} {prompt}"
            assert ctext == re.sub(r"@@( |$)", "", content)


def test_held_back_inputs_without_prompt_words(bpe_dir, tmp_path):
    """--prompt-words 0: no prompt, the content from anywhere in the sentence."""
    out = tmp_path / "gen"
    make_inputs(str(bpe_dir), str(out), lengths=(3,), prompt_words=0)
    src = read(out / "ht3.src")
    assert len(src) == 3 and not any("<prompt>" in x for x in src)  # "short one" has 2 tokens
    assert read(out / "ht3.prompt.src") == [f"<prompt> {x}" for x in src]


def test_the_corpus_writes_the_prompt_list(tmp_path):
    write_prompts(str(tmp_path / "prompts.txt"))
    assert read(tmp_path / "prompts.txt") == list(PROMPTS) and len(PROMPTS) == 10
