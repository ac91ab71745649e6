"""The inputs ``scripts/benchmark.py --growth kbert|cocon`` times: K-BERT trees with exactly k injected
tokens per sentence and the sentence kept; CoCon batches with contents of the asked length."""

import torch
from fairseq.data import Dictionary

from benchmarks.harness import cocon_grown_samples, kbert_injected_sample
from fairseq_knowgen.modules.sentence_tree import visible_matrix


def kbert_sample(d, sentences):
    rows = [torch.tensor([d.bos()] + [d.index(w) for w in s.split()] + [d.eos()]) for s in sentences]
    width = max(len(r) for r in rows)
    src = torch.full((len(rows), width), d.pad())
    for i, r in enumerate(rows):
        src[i, : len(r)] = r
    zeros = torch.zeros_like(src)
    net = {"src_tokens": src, "soft_positions": zeros, "branch_ids": zeros, "mention_ids": zeros,
           "segment_ids": zeros, "src_lengths": torch.tensor([len(r) for r in rows])}  # fmt: skip
    return {"id": torch.arange(len(rows)), "nsentences": len(rows), "net_input": net, "target": torch.zeros(len(rows))}


def test_kbert_trees_carry_exactly_k_injected_tokens_and_keep_the_sentence():
    d = Dictionary()
    for w in "a b c d e f g h".split():
        d.add_symbol(w)
    sentences = ["a b c d", "e f g h a b c", "h"]
    sample = kbert_sample(d, sentences)
    for k in (0, 8, 32):
        grown = kbert_injected_sample(sample, d, k)
        net = grown["net_input"]
        for i, s in enumerate(sentences):
            real = net["src_tokens"][i].ne(d.pad())
            branch = net["branch_ids"][i][real]
            assert int((branch > 0).sum()) == k
            trunk = [d[t] for t, b in zip(net["src_tokens"][i][real].tolist(), branch.tolist()) if b == 0]
            assert trunk == ["<s>", *s.split(), "</s>"]
        # the injected tokens are hidden from every trunk token but their mention's
        vis = visible_matrix(net["branch_ids"], net["mention_ids"], net["src_tokens"].eq(d.pad()))
        trunk_q = net["branch_ids"].eq(0) & net["mention_ids"].eq(0) & net["src_tokens"].ne(d.pad())
        branch_k = net["branch_ids"].gt(0)
        assert not (vis & trunk_q[:, :, None] & branch_k[:, None, :]).any()
        assert grown["ntokens"] == sum(len(s.split()) + 2 + k for s in sentences)


def test_cocon_batches_have_the_asked_content_length():
    pad, eos = 1, 2
    src = torch.tensor([[5, 6, 7], [8, 9, pad]])
    target = torch.tensor([[5, 6, 7, eos], [8, 9, eos, pad]])
    sample = {"id": torch.arange(2), "nsentences": 2, "target": target,
              "net_input": {"src_tokens": src, "src_lengths": torch.tensor([3, 2])}}  # fmt: skip
    train, decode = cocon_grown_samples(sample, pad, content=5, prefix=4)
    assert train["target"].tolist() == [[5, 6, 7, 5, 6, 7, 5, 6, 7, eos], [8, 9, 8, 9, 8, 9, 8, 9, 8, eos]]
    assert train["net_input"]["prev_output_tokens"][:, 0].tolist() == [eos, eos]
    assert train["net_input"]["prev_output_tokens"][:, 1:].tolist() == train["target"][:, :-1].tolist()
    assert decode["net_input"]["src_tokens"].tolist() == [[5, 6, 7, 5, 6], [8, 9, 8, 9, 8]]


def test_saved_for_backward_bytes_by_hand():
    """``--memory``'s count: exp(x W) keeps x and W (W is a parameter, left out) and
    exp's output: 4 x 8 + 4 x 3 float32 = 176 bytes; state: W (8 x 3) x 4 (value, gradient, 2 Adam moments)."""
    from benchmarks.harness import saved_for_backward_bytes

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 3))

    def criterion(model, sample):
        return torch.exp(sample @ model.w).sum(), 1, {}

    # x needs a gradient too, so the product keeps W as well: the count must leave it out
    res = saved_for_backward_bytes(Model(), criterion, torch.randn(4, 8, requires_grad=True))
    assert res == {"saved_bytes": 4 * (4 * 8 + 4 * 3), "state_bytes": 4 * 4 * 8 * 3}


def data_with_sizes(workdir, n_train, n_valid, sizes=None):
    return workdir, {"arch": [str(sizes)], "baseline": []}


def data_without_sizes(workdir, n_train, n_valid):
    return workdir


def test_make_data_passes_sizes_to_a_data_function_that_takes_them():
    """--size base reaches CoCon's data function (its frozen LM is made with the data); others are called as before."""
    from benchmarks.profiles import make_data

    assert make_data("test_benchmark_growth:data_with_sizes", "d", 1, 1, sizes=(6, 512, 8))[1]["arch"] == ["(6, 512, 8)"]
    assert make_data("test_benchmark_growth:data_with_sizes", "d", 1, 1)[1]["arch"] == ["None"]
    assert make_data("test_benchmark_growth:data_without_sizes", "d", 1, 1, sizes=(6, 512, 8)) == ("d", {})
