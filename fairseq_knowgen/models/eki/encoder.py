"""The EKI encoder: group embeddings on the input (Eq. 3) and the scaling module on the output (Eq. 5), around
fairseq's transformer encoder or a released BERT's (``--encoder-pretrained``)."""

from typing import Dict, List, Optional

from fairseq.models.transformer import TransformerEncoderBase
from torch import Tensor

from ...modules.group_embedding import GroupEmbedding
from ...modules.scaling_module import ScalingModule
from ..pretrained_encoder import BertSourceEncoder
from .config import scaling_dropout


class EKIEncoderMixin:
    """Group embeddings and the scaling module around an encoder's ``forward`` (fairseq's transformer encoder or
    a pretrained BERT, :class:`~fairseq_knowgen.models.pretrained_encoder.BertSourceEncoder`).

    Returns, besides the encoder's entries, ``src_distance`` (for the decoder's position
    indicator) and ``eki_lambda_mean`` (Mean(Lambda_v) over channels, ``B x S``).
    """

    def add_eki_parts(self, args, embed_dim: int, output_dim: int):
        """E_C / E_O of width ``embed_dim`` (the token embeddings'), the scaling module of ``output_dim`` (the
        encoder output's)."""
        # the copy head scatters onto the source ids (fairseq's reorder_encoder_out keeps them)
        self.keep_src_tokens = bool(getattr(args, "copy", False))
        self.group_embedding = None
        if args.eki_group_embeddings:
            self.group_embedding = GroupEmbedding(embed_dim, init_std=args.eki_group_init_std)
        self.scaling = None
        if args.eki_scaling:
            self.scaling = ScalingModule(
                output_dim,
                args.eki_scaling_dim,
                activation=args.eki_scaling_activation,
                init_std=args.eki_scaling_init_std,
                init=args.eki_scaling_init,
                dropout=scaling_dropout(args),
            )

    def forward(
        self,
        src_tokens,
        src_lengths: Optional[Tensor] = None,
        src_group: Optional[Tensor] = None,
        src_distance: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[Tensor] = None,
    ):
        if self.group_embedding is not None:
            if src_group is None:
                raise ValueError("group embeddings need src_group: use --task eki_generation")
            tok = self.embed_tokens(src_tokens) if token_embeddings is None else token_embeddings
            # Eq. 3 adds E_group after the model's scaling of token embeddings
            token_embeddings = tok + self.group_embedding(src_group) / self.embed_scale
        out = super().forward(
            src_tokens,
            src_lengths=src_lengths,
            return_all_hiddens=return_all_hiddens,
            token_embeddings=token_embeddings,
        )
        if self.scaling is not None:
            h, lam = self.scaling(out["encoder_out"][0])  # S x B x C
            out["encoder_out"] = [h]
            out["eki_lambda_mean"] = [lam.float().mean(-1).transpose(0, 1)]  # B x S
        out["src_distance"] = [src_distance] if src_distance is not None else []
        if self.keep_src_tokens:
            out["src_tokens"] = [src_tokens]
        return out

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        """fairseq's reorder drops unknown keys: reorder ours too (beam search)."""
        new = super().reorder_encoder_out(encoder_out, new_order)
        for key in ("src_distance", "eki_lambda_mean"):
            new[key] = [t.index_select(0, new_order) for t in encoder_out.get(key, [])]
        return new


class EKIEncoder(EKIEncoderMixin, TransformerEncoderBase):
    """Transformer/BART encoder with group embeddings and the scaling module (:class:`EKIEncoderMixin`)."""

    def __init__(self, cfg, dictionary, embed_tokens, args):
        super().__init__(cfg, dictionary, embed_tokens)
        dim = embed_tokens.embedding_dim
        self.add_eki_parts(args, dim, dim)


class EKIBertEncoder(EKIEncoderMixin, BertSourceEncoder):
    """A released BERT (``--encoder-pretrained``) with EKI's group embeddings (BERT's width, added to its token
    embeddings) and scaling module (on the states the decoder reads, after the projection)."""

    NOT_PRETRAINED = BertSourceEncoder.NOT_PRETRAINED + ("group_embedding", "scaling")

    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(args, dictionary, embed_tokens, embed_tokens.embedding_dim)
        self.add_eki_parts(args, self.embed_tokens.embedding_dim, self.output_dim)
