"""AtMostOnceBlock against a hand-written step of beam search."""

import math

import torch

from fairseq_knowgen.modules.at_most_once import AtMostOnceBlock, token_ids_matching


def test_blocks_a_listed_token_only_in_hypotheses_that_hold_it():
    # 2 sentences x beam 2 = 4 hypotheses; vocabulary of 6; listed tokens 4 and 5; step 2 (two tokens so far)
    tokens = torch.tensor(
        [
            [2, 4, 3, 0],  # holds 4 -> 4 blocked
            [2, 3, 3, 0],  # holds neither
            [2, 5, 4, 0],  # holds both
            [2, 3, 0, 5],  # 5 only beyond the step: not generated yet
        ]
    )
    lprobs = torch.log(torch.full((4, 6), 1 / 6))
    out = AtMostOnceBlock(torch.tensor([4, 5]))(tokens, lprobs.clone(), bsz=2, beam_size=2, step=2)
    inf = -math.inf
    expected = torch.log(torch.full((4, 6), 1 / 6))
    expected[0, 4] = inf
    expected[2, 4] = expected[2, 5] = inf
    assert torch.equal(out, expected)


def test_first_step_and_inner_blocker():
    calls = []

    class Inner(torch.nn.Module):
        def forward(self, tokens, lprobs, bsz, beam_size, step):
            calls.append(step)
            return lprobs - 1

    tokens = torch.tensor([[2, 4, 0]])
    lprobs = torch.zeros(1, 6)
    out = AtMostOnceBlock(torch.tensor([4]), Inner())(tokens, lprobs, 1, 1, step=0)
    assert calls == [0] and torch.equal(out, torch.full((1, 6), -1.0))  # nothing generated at step 0


def test_token_ids_match_whole_symbols():
    class D:
        symbols = ["<s>", "<pad>", "</s>", "<unk>", "<ent-0>", "<ent-12>", "x<ent-1>", "<ent-1>y"]

    assert token_ids_matching(D(), r"<ent-\d+>").tolist() == [4, 5]


def test_a_step_runs_on_the_device_without_copies_or_syncs():
    """A search step on the ``meta`` device (tensors without values: any read to the host raises):
    the rule computes on the device, and its CPU-built list moves there once, not every step."""
    block = AtMostOnceBlock(torch.tensor([4, 5]))
    tokens = torch.zeros(6, 9, dtype=torch.long, device="meta")
    lprobs = torch.zeros(6, 20, device="meta")
    for step in (1, 2, 3):
        out = block(tokens, lprobs, bsz=2, beam_size=3, step=step)
        assert out.device.type == "meta" and out.shape == (6, 20)
        assert block.token_ids.device.type == "meta"  # the buffer itself moved: no copy per step
