"""``copy_transformer``: a transformer whose decoder mixes generating and copying.

The copy head (Eq. 5-6 of the force-copy paper, See et al.'s pointer-generator) is
:class:`~fairseq_knowgen.modules.copy_generator.CopyGenerator`; train it with the
``force_copy`` criterion (``--copy-supervision none|force|force-unk``). The decoder returns
the mixture *probabilities* P(w) as its first output, and ``p_gen``, the (renormalized) copy
attention and P_vocab in its ``extra`` dict, so criteria and analyses can read them.

With ``--dimattn-type`` (and the other ``--dimattn-*`` flags) the cross-attention of the
copy layer (and any layer named by ``--dimattn-layers``) becomes diminishing attention,
and the copy distribution uses the diminishing weights.
"""

import re
from typing import Any, Dict, List, Optional

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
)
from torch import Tensor

from ..modules.copy_generator import CopyGenerator, copyable_mask
from .dimattn import add_dimattn_args, dimattn_defaults, install_diminishing_attention

PLACEHOLDER = re.compile(r"^<unk-\d+>$")


def special_symbols_mask(dictionary) -> Tensor:
    """Vocabulary-sized bool tensor: True for symbols that are never copied."""
    mask = torch.zeros(len(dictionary), dtype=torch.bool)
    for idx in {dictionary.pad(), dictionary.eos(), dictionary.bos()}:
        mask[idx] = True
    return mask


def placeholder_mask(dictionary) -> Tensor:
    """Vocabulary-sized bool tensor: True for ``<unk>`` and the ``<unk-N>`` placeholders."""
    mask = torch.tensor([bool(PLACEHOLDER.match(s)) for s in dictionary.symbols], dtype=torch.bool)
    mask[dictionary.unk()] = True
    return mask


class SourceKeepingEncoder(TransformerEncoderBase):
    """fairseq's encoder, which also returns ``src_tokens`` (the copy head scatters onto
    them; fairseq's ``reorder_encoder_out`` already reorders that entry in beam search)."""

    def forward(
        self,
        src_tokens,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[Tensor] = None,
    ):
        out = super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)
        out["src_tokens"] = [src_tokens]
        return out


class CopyTransformerDecoder(TransformerDecoderBase):
    """Transformer decoder with a pointer-generator output (returns probabilities)."""

    def __init__(self, cfg, dictionary, embed_tokens, copy_layer: int = -1, copy_heads: Optional[int] = None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=False)
        self.copy_layer = copy_layer % len(self.layers)
        if copy_heads is not None and not 1 <= copy_heads <= cfg.decoder.attention_heads:
            raise ValueError(f"--copy-heads must be in 1..{cfg.decoder.attention_heads}, got {copy_heads}")
        self.copy_heads = copy_heads
        self.copy_generator = CopyGenerator(self.output_embed_dim, cfg.encoder.embed_dim, self.embed_dim)
        self.register_buffer("special", special_symbols_mask(dictionary), persistent=False)

    def forward(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        features_only: bool = False,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
        src_lengths: Optional[Any] = None,
        return_all_hiddens: bool = False,
    ):
        """Returns (P(w) ``B x T x V`` probabilities, extra) where extra holds ``p_gen``
        (``B x T x 1``), ``copy_attn`` (``B x T x S``), ``vocab_probs`` and ``attn``."""
        x, extra = self.extract_features(
            prev_output_tokens,
            encoder_out=encoder_out,
            incremental_state=incremental_state,
            alignment_layer=self.copy_layer,
            alignment_heads=self.copy_heads,
        )
        if features_only:
            return x, extra
        tokens = prev_output_tokens[:, -1:] if incremental_state is not None else prev_output_tokens
        input_embed = self.embed_tokens(tokens)  # y_t: B x T x C
        src_tokens = encoder_out["src_tokens"][0]
        enc = encoder_out["encoder_out"][0].transpose(0, 1)  # B x S x C
        out = self.copy_generator(
            self.output_layer(x),
            x,
            input_embed,
            extra["attn"][0],
            enc,
            src_tokens,
            copyable_mask(src_tokens, self.special),
        )
        extra.update(p_gen=out["p_gen"], copy_attn=out["copy_attn"], vocab_probs=out["vocab_probs"])
        extra["attn"] = [out["copy_attn"]]
        return out["probs"], extra

    def get_normalized_probs(self, net_output, log_probs: bool, sample=None):
        probs = net_output[0].float()
        return probs.clamp_min(1e-10).log() if log_probs else probs


@register_model("copy_transformer")
class CopyTransformerModel(TransformerModel):
    """Transformer + pointer-generator copy head (force-copy paper; See et al., 2017)."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        parser.add_argument(
            "--copy-layer",
            type=int,
            metavar="L",
            help="decoder layer whose cross-attention is the copy attention (default -1: last)",
        )
        parser.add_argument(
            "--copy-heads",
            type=int,
            metavar="H",
            help="average the copy attention over the first H heads (default: all)",
        )
        add_dimattn_args(parser)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return SourceKeepingEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        decoder = CopyTransformerDecoder(
            cfg, tgt_dict, embed_tokens, getattr(args, "copy_layer", -1), getattr(args, "copy_heads", None)
        )
        if getattr(args, "dimattn_type", None):
            dimattn_defaults(args)
            if getattr(args, "dimattn_layers", "-1") == "-1":
                args.dimattn_layers = str(decoder.copy_layer)
            install_diminishing_attention(decoder, args)
        return decoder

    def get_normalized_probs(self, net_output, log_probs: bool, sample=None):
        return self.decoder.get_normalized_probs(net_output, log_probs, sample)


@register_model_architecture("copy_transformer", "copy_transformer")
def copy_transformer_architecture(args):
    args.copy_layer = getattr(args, "copy_layer", None)
    if args.copy_layer is None:
        args.copy_layer = -1
    args.copy_heads = getattr(args, "copy_heads", None)
    base_architecture(args)


@register_model_architecture("copy_transformer", "copy_transformer_small")
def copy_transformer_small_architecture(args):
    """2+2 layers, 128 wide: the size of this project's CPU recipes and tests."""
    for side in ("encoder", "decoder"):
        setattr(args, f"{side}_layers", getattr(args, f"{side}_layers", 2))
        setattr(args, f"{side}_embed_dim", getattr(args, f"{side}_embed_dim", 128))
        setattr(args, f"{side}_ffn_embed_dim", getattr(args, f"{side}_ffn_embed_dim", 512))
        setattr(args, f"{side}_attention_heads", getattr(args, f"{side}_attention_heads", 4))
    copy_transformer_architecture(args)
