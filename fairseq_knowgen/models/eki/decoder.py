"""The EKI decoder: the position indicator in the cross-attention keys (Eq. 7-9), with diminishing attention and
the copy head composed by flags."""

import functools
from typing import Optional, Tuple

from fairseq.models.transformer import TransformerDecoderBase
from torch import Tensor

from ...modules.cross_attention import replace_cross_attention
from ...modules.diminishing_attention import DiminishingMultiheadAttention
from ...modules.position_indicator import PositionIndicatorAttention
from ..copy_transformer import CopyDecoderMixin
from ..dimattn import diminishing_attention_kwargs, parse_layers
from .config import EKI_UNCOPYABLE


class DiminishingPositionIndicatorAttention(PositionIndicatorAttention, DiminishingMultiheadAttention):
    """A cross-attention layer with both EKI's position indicator and diminishing attention.

    The logits are Eq. 9 of the EKI paper (E_D added to the projected keys, cached with
    them); the weights that mix the values are Han, Lin and Joty's diminishing weights of the
    softmax of those logits (Eq. 4, or Eq. 5 for ``dydim``), with their coverage state
    in the incremental state. Parameters: those of :class:`PositionIndicatorAttention`
    (fairseq's projections and ``distance_embed``), so an EKI checkpoint loads into it.

    Args: those of both parents (``max_distance``; ``dim_type``, ``g``, ``g2``, ``normalize``).
    """

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        incremental_state=None,
        need_weights=True,
        static_kv=True,
        attn_mask=None,
        before_softmax=False,
        need_head_weights=False,
        distances: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """query ``T x B x C``, key/value ``S x B x C``, distances ``B x S`` ->
        (``T x B x C``, the diminishing weights as fairseq returns attention weights)."""
        distances = self.distances if distances is None else distances
        if distances is None:
            raise ValueError("the position indicator needs the prototype distances of the source")
        return DiminishingMultiheadAttention.forward(
            self,
            query,
            key,
            value,
            key_padding_mask,
            incremental_state,
            need_weights,
            static_kv,
            attn_mask,
            before_softmax,
            need_head_weights,
            key_offset=functools.partial(self.distance_keys, distances),
        )


class EKIDecoder(TransformerDecoderBase):
    """Decoder whose chosen cross-attention layers use the position indicator (Eq. 9) and,
    with ``--dimattn-type``, diminishing attention (layers ``--dimattn-layers``; a layer
    named by both gets :class:`DiminishingPositionIndicatorAttention`)."""

    def __init__(self, cfg, dictionary, embed_tokens, args):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=False)
        self.position_layers = []
        if args.eki_position_indicator:
            self.position_layers = parse_layers(
                args.eki_position_layers, len(self.layers), flag="--eki-position-layers"
            )
            if not self.position_layers:
                raise ValueError(
                    f"--eki-position-layers: no layer given ({args.eki_position_layers!r}); "
                    "switch the position indicator off with --eki-position-indicator 0"
                )
        dim_layers, dim_kwargs = [], {}
        if getattr(args, "dimattn_type", None):
            dim_layers = parse_layers(args.dimattn_layers, len(self.layers))
            dim_kwargs = diminishing_attention_kwargs(args, self.max_positions())
        distance = dict(max_distance=args.eki_max_distance, distance_init_std=args.eki_distance_init_std)
        position = functools.partial(PositionIndicatorAttention, **distance)
        for layers, build in (
            ([i for i in self.position_layers if i not in dim_layers], position),
            (
                [i for i in dim_layers if i not in self.position_layers],
                functools.partial(DiminishingMultiheadAttention, **dim_kwargs),
            ),
            (
                [i for i in dim_layers if i in self.position_layers],
                functools.partial(DiminishingPositionIndicatorAttention, **distance, **dim_kwargs),
            ),
        ):
            replace_cross_attention(self, layers, build)

    def extract_features(
        self,
        prev_output_tokens,
        encoder_out=None,
        incremental_state=None,
        full_context_alignment=False,
        alignment_layer=None,
        alignment_heads=None,
    ):
        # fairseq's decoder layer has no argument for the distances: hand them to the
        # position-indicator attentions for the duration of this call only
        attns = [self.layers[i].encoder_attn for i in self.position_layers]
        if attns:
            if encoder_out is None or not encoder_out.get("src_distance"):
                raise ValueError("the position indicator needs src_distance: use --task eki_generation")
            for a in attns:
                a.distances = encoder_out["src_distance"][0]
        try:
            x, extra = super().extract_features(
                prev_output_tokens,
                encoder_out,
                incremental_state,
                full_context_alignment,
                alignment_layer,
                alignment_heads,
            )
        finally:
            for a in attns:
                a.distances = None
        if encoder_out is not None and encoder_out.get("eki_lambda_mean"):
            extra["eki_lambda_mean"] = encoder_out["eki_lambda_mean"][0]
        return x, extra


class EKICopyDecoder(CopyDecoderMixin, EKIDecoder):
    """:class:`EKIDecoder` with the pointer-generator output (``--copy``): the copy attention is
    the (position-indicator, maybe diminishing) cross-attention of ``--copy-layer``, over the
    whole source ``concepts <sep> prototype``; ``<sep>`` and ``<mask>`` are never copied."""

    def __init__(self, cfg, dictionary, embed_tokens, args):
        super().__init__(cfg, dictionary, embed_tokens, args)
        self.add_copy_head(
            cfg,
            dictionary,
            args.copy_layer,
            args.copy_heads,
            uncopyable_symbols=EKI_UNCOPYABLE,
            copy_alpha=args.copy_alpha,
        )
