"""``--no-repeat-ngram-size`` that works on CPU.

fairseq 0.12's ``SequenceGenerator`` hands its n-gram blocker the whole token buffer (``bsz * beam`` x
``max_len + 2``, padding after the current step). The CUDA kernel reads only the first ``step + 1``
columns, but the CPU path (:meth:`fairseq.ngram_repeat_block.NGramRepeatBlock._no_repeat_ngram`)
takes "the last n-1 tokens" from the end of the buffer, which is padding: it never bans anything,
and ``fairseq-generate --no-repeat-ngram-size 3`` on CPU decodes exactly as without it (measured:
byte-identical CommonGen outputs; fairseq issue #4709). :class:`GeneratedPrefixNGramBlock` passes
the CPU path only the generated prefix ``tokens[:, : step + 1]``; the CUDA path is left as it is.
"""

from torch import Tensor, nn


class GeneratedPrefixNGramBlock(nn.Module):
    """Wraps fairseq's ``NGramRepeatBlock`` so that its CPU path sees the tokens generated so far."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, tokens: Tensor, lprobs: Tensor, bsz: int, beam_size: int, step: int) -> Tensor:
        if getattr(self.inner, "use_extension", False):
            return self.inner(tokens, lprobs, bsz, beam_size, step)
        return self.inner(tokens[:, : step + 1], lprobs, bsz, beam_size, step)


def fix_cpu_ngram_blocker(generator) -> None:
    """Wrap ``generator.repeat_ngram_blocker`` (fairseq's, when ``--no-repeat-ngram-size`` > 0) in place."""
    blocker = getattr(generator, "repeat_ngram_blocker", None)
    if blocker is not None and not isinstance(blocker, GeneratedPrefixNGramBlock):
        generator.repeat_ngram_blocker = GeneratedPrefixNGramBlock(blocker)
