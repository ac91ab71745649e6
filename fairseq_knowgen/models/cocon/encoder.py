"""The content encoder: the frozen LM's lower layers on each content alone."""

from typing import TYPE_CHECKING, Dict, List, Optional

import torch
from fairseq.models import FairseqEncoder
from torch import Tensor

from .config import SEP

if TYPE_CHECKING:  # the decoder module needs nothing of this one; the encoder runs the decoder's lower layers
    from .decoder import CoConDecoder


def content_of(encoder_out: Dict[str, List[Tensor]]):
    """``(content S x B x C, padding mask B x S, bias B x S)`` of the current rows of an encoder output."""
    rows = encoder_out["content_rows"][0]
    return (
        encoder_out["content"][0].index_select(1, rows),
        encoder_out["content_padding_mask"][0].index_select(0, rows),
        encoder_out["content_bias"][0].index_select(0, rows),
    )


class CoConEncoder(FairseqEncoder):
    """Content encoder: the LM's lower layers on each content alone.

    Holds no parameters of its own; it calls the decoder's lower layers (a plain reference,
    not a submodule, so the LM's weights are stored once in the state dict).
    """

    def __init__(self, dictionary, decoder: "CoConDecoder", default_tau: float = 0.0):
        super().__init__(dictionary)
        self.__dict__["decoder_ref"] = decoder
        self.sep = dictionary.index(SEP) if SEP in dictionary.indices else None
        self.default_tau = default_tau

    def split_contents(self, src_tokens: Tensor) -> List[List[List[int]]]:
        """Per row, its contents as token lists (``<sep>``-separated; ``</s>``/padding dropped;
        empty contents dropped)."""
        d = self.dictionary
        rows = []
        for row in src_tokens.tolist():
            contents, cur = [], []
            for t in row:
                if t == d.pad() or t == d.eos():
                    continue
                if t == self.sep:
                    if cur:
                        contents.append(cur)
                    cur = []
                else:
                    cur.append(t)
            if cur:
                contents.append(cur)
            rows.append(contents)
        return rows

    def forward(
        self,
        src_tokens: Tensor,
        src_lengths: Optional[Tensor] = None,
        content_tau: Optional[Tensor] = None,
        prompt_lengths: Optional[Tensor] = None,
    ):
        """src_tokens: ``B x S_raw``; content_tau: 1-D, tau of content k (the last repeats);
        prompt_lengths: ``B``, the prompt tokens each row's output starts with (the decoder keeps the
        LM's own states before the prompt's last token: Eq. 7). Returns ``content`` ``[S x B x C]``,
        ``content_padding_mask`` ``[B x S]``, ``content_bias`` ``[B x S]``, ``content_rows`` and
        ``prompt_lengths`` ``[B]`` (empty list without prompts)."""
        out = self.encode(src_tokens, content_tau)
        out["prompt_lengths"] = [] if prompt_lengths is None else [prompt_lengths]
        return out

    def encode(self, src_tokens: Tensor, content_tau: Optional[Tensor] = None):
        """The content part of :meth:`forward` (its outputs but ``prompt_lengths``)."""
        contents_of = self.split_contents(src_tokens)
        dec = self.decoder_ref
        B, dev = src_tokens.size(0), src_tokens.device
        segs = [c for contents in contents_of for c in contents]
        if content_tau is None:
            content_tau = torch.tensor([self.default_tau])
        taus = content_tau.tolist() if torch.is_tensor(content_tau) else list(content_tau)
        rows = torch.arange(B, device=dev)
        if not segs or dec.bypass:  # null content everywhere (or the LM alone: content unused)
            C = dec.embed_dim
            return {
                "content": [src_tokens.new_zeros(0, B, C, dtype=torch.float)],
                "content_padding_mask": [src_tokens.new_zeros(B, 0, dtype=torch.bool)],
                "content_bias": [src_tokens.new_zeros(B, 0, dtype=torch.float)],
                "content_rows": [rows],
            }
        states, _ = dec.encode_contents(segs, dev)  # N x Lmax x C
        N, Lmax, C = states.shape
        flat = states.reshape(N * Lmax, C)
        lengths = [sum(len(c) for c in contents) for contents in contents_of]
        S = max(lengths)
        index = torch.zeros(B, S, dtype=torch.long)
        pad = torch.ones(B, S, dtype=torch.bool)
        bias = torch.zeros(B, S)
        n = 0
        for b, contents in enumerate(contents_of):
            pos = 0
            for k, c in enumerate(contents):
                L = len(c)
                index[b, pos : pos + L] = torch.arange(L) + n * Lmax
                pad[b, pos : pos + L] = False
                bias[b, pos : pos + L] = taus[min(k, len(taus) - 1)]
                pos += L
                n += 1
        content = flat.index_select(0, index.view(-1).to(dev)).view(B, S, C).transpose(0, 1)
        return {
            "content": [content],  # S x B x C
            "content_padding_mask": [pad.to(dev)],
            "content_bias": [bias.to(dev).to(content.dtype)],
            "content_rows": [rows],
        }

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order: Tensor):
        """Only the row index is reordered (O(batch) per step); :func:`content_of` gathers the
        content states by it when the decoder first needs them."""
        out = dict(encoder_out)
        out["content_rows"] = [encoder_out["content_rows"][0].index_select(0, new_order)]
        if encoder_out.get("prompt_lengths"):
            out["prompt_lengths"] = [encoder_out["prompt_lengths"][0].index_select(0, new_order)]
        return out

    def max_positions(self):
        return self.decoder_ref.max_positions()
