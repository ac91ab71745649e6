"""--no-repeat-ngram-size on CPU: fairseq's blocker, given the generator's whole token buffer, bans nothing;
ours bans exactly the tokens that would repeat an n-gram of the generated prefix (checked by hand)."""

import math

import torch
from fairseq.ngram_repeat_block import NGramRepeatBlock

from fairseq_knowgen.compat.ngram_block import GeneratedPrefixNGramBlock

PAD, EOS = 1, 2


def _buffer_and_lprobs():
    # one hypothesis at step 3: generated EOS(start) 5 6 5, then padding as in SequenceGenerator's buffer
    tokens = torch.full((1, 8), PAD)
    tokens[0, :4] = torch.tensor([EOS, 5, 6, 5])
    return tokens, torch.zeros(1, 10)


def test_bigram_blocking_bans_the_token_that_followed_the_last_token_before():
    tokens, lprobs = _buffer_and_lprobs()
    banned = GeneratedPrefixNGramBlock(NGramRepeatBlock(2, use_extension=False))(tokens, lprobs, 1, 1, 3)
    # by hand: the last token is 5; the bigram (5, 6) occurred; so 6 is banned, nothing else
    assert torch.isinf(banned[0, 6]) and banned[0, 6] < 0
    assert torch.isfinite(banned[0, [i for i in range(10) if i != 6]]).all()


def test_fairseqs_cpu_blocker_on_the_whole_buffer_bans_nothing():
    """Documents the fairseq bug the wrapper fixes: if this starts failing, fairseq fixed it."""
    tokens, lprobs = _buffer_and_lprobs()
    out = NGramRepeatBlock(2, use_extension=False)(tokens, lprobs.clone(), 1, 1, 3)
    assert torch.isfinite(out).all() and not math.isinf(out.sum().item())
