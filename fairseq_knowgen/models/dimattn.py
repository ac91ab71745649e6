"""Transformer and BART with diminishing attention in the decoder's cross-attention (Han, Lin and
Joty, "Resurrecting Submodularity for Neural Text Generation").

Architectures (``--arch``):

- ``transformer_dimattn``: fairseq's ``transformer`` (same defaults) with DimAttn/DyDimAttn
  in the cross-attention of the decoder layers named by ``--dimattn-layers`` (default the
  last, as the paper does for machine translation);
- ``bart_dimattn_base`` / ``bart_dimattn_large``: BART with the same change, fine-tuned
  from a fairseq BART checkpoint. Diminishing attention adds no parameters, so the
  checkpoint loads as it is::

      fairseq-train DATA --user-dir fairseq_knowgen --arch bart_dimattn_large \\
          --restore-file bart.large/model.pt --reset-optimizer --reset-dataloader \\
          --reset-meters --reset-lr-scheduler ...

The same ``--dimattn-*`` flags (off unless ``--dimattn-type`` is given) compose diminishing
attention with the other models: ``copy_transformer`` (default layer: the copy layer) and
``eki_*`` (combined with the position indicator where a layer has both; see
:mod:`fairseq_knowgen.models.eki`). They share :func:`diminishing_attention_kwargs`.

The equations are in :mod:`fairseq_knowgen.modules.diminishing_attention`.
"""

import functools
import logging
from typing import Any, Dict, List

from fairseq.models import register_model, register_model_architecture
from fairseq.models.bart import BARTModel
from fairseq.models.bart.model import bart_base_architecture, bart_large_architecture
from fairseq.models.transformer import TransformerModel, base_architecture

from ..modules.cross_attention import replace_cross_attention
from ..modules.diminishing_attention import (
    CONCAVE_CHOICES,
    DiminishingMultiheadAttention,
    check_slower_diminishing,
    parse_concave,
)
from .pretrained_encoder import PretrainedEncoderMixin, add_encoder_pretrained_args

logger = logging.getLogger(__name__)

DYDIM_G2_DEFAULT = "2*sqrt"  # g2 = 2 sqrt(x+1): g2' >= log(x+1)' at every coverage (module docstring)


def add_dimattn_args(parser):
    parser.add_argument("--dimattn-type", choices=["dim", "dydim"], help="DimAttn (Eq. 4) or dynamic DyDimAttn (Eq. 5)")
    parser.add_argument("--dimattn-g", type=str, metavar="G", help=f"concave g (g1 for dydim): {CONCAVE_CHOICES}")
    parser.add_argument(
        "--dimattn-g2",
        type=str,
        metavar="G",
        help="dydim only (default 2*sqrt, 2 sqrt(x+1); a warning with dim, which has no g2): the "
        "slower-diminishing g2, checked at build time: g2'(c) >= g1'(c) for all coverage c up to the decoder's "
        "max positions (checkpoints keep the g2 they were trained with)",
    )
    parser.add_argument(
        "--dimattn-normalize",
        action="store_true",
        help="renormalize the diminishing weights to sum to 1 (the paper: no)",
    )
    parser.add_argument(
        "--dimattn-layers",
        type=str,
        metavar="L",
        help="decoder layers with diminishing cross-attention: 'all' or a comma list of indices, negative from the "
        "end (default: -1, the last; the copy layer in a model with the copy head)",
    )


def dimattn_defaults(args):
    """Fill unset ``--dimattn-*`` options. DyDimAttn's g2 defaults to 2 sqrt(x+1) (see
    :mod:`fairseq_knowgen.modules.diminishing_attention`); the value is written into the args, so a
    checkpoint keeps the g2 it was trained with (``identity`` for those saved when that was the
    default)."""
    args.dimattn_type = getattr(args, "dimattn_type", None) or "dim"
    args.dimattn_g = getattr(args, "dimattn_g", None) or "log"
    if args.dimattn_type == "dydim":  # dim has no g2: left None, so that a given one can be warned about
        args.dimattn_g2 = getattr(args, "dimattn_g2", None) or DYDIM_G2_DEFAULT
    else:
        args.dimattn_g2 = getattr(args, "dimattn_g2", None)
    args.dimattn_normalize = getattr(args, "dimattn_normalize", False)
    args.dimattn_layers = getattr(args, "dimattn_layers", None) or "-1"


def parse_layers(spec: str, num_layers: int, flag: str = "--dimattn-layers") -> List[int]:
    """``all`` or comma-separated indices (negative count from the end) -> sorted indices.

    ``flag``: the command-line flag ``spec`` came from, named in the error messages.
    """
    if spec == "all":
        return list(range(num_layers))
    try:
        idx = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag}: expected 'all' or integers, got {spec!r}") from None
    out = set()
    for i in idx:
        if not -num_layers <= i < num_layers:
            raise ValueError(f"{flag}: layer {i} out of range for {num_layers} layers")
        out.add(i % num_layers)
    return sorted(out)


def diminishing_attention_kwargs(args, max_positions: int) -> Dict[str, Any]:
    """The keyword arguments of :class:`DiminishingMultiheadAttention` that ``--dimattn-*``
    ask for (``dim_type``, ``g``, ``g2``, ``normalize``), after checking them.

    For ``dydim`` it refuses a g2 that does not diminish more slowly than g1 (Eq. 5) on the
    coverage values a decoder of ``max_positions`` steps can reach (0 to ``max_positions``);
    for ``dim`` it warns when ``--dimattn-g2`` was given, as it is unused. Shared by
    :func:`install_diminishing_attention` and the EKI decoder (which combines it with its
    position indicator on the layers that have both).
    """
    g1 = parse_concave(args.dimattn_g)  # fail early on a bad spec
    if args.dimattn_type == "dydim":
        check_slower_diminishing(
            g1, parse_concave(args.dimattn_g2), max_positions, names=("--dimattn-g", "--dimattn-g2")
        )
    elif getattr(args, "dimattn_g2", None) is not None:
        logger.warning(
            f"--dimattn-g2 {args.dimattn_g2} is unused with --dimattn-type {args.dimattn_type}: "
            "only DyDimAttn (--dimattn-type dydim) has a g2"
        )
    return {
        "dim_type": args.dimattn_type,
        "g": args.dimattn_g,
        "g2": args.dimattn_g2,
        "normalize": args.dimattn_normalize,
    }


def install_diminishing_attention(decoder, args):
    """Replace the cross-attention of the decoder layers ``--dimattn-layers`` by diminishing
    attention (settings checked by :func:`diminishing_attention_kwargs`).

    The new module has exactly the parameters of the one it replaces (so nothing is left
    without a gradient under DDP, and pretrained weights load into it).
    """
    build = functools.partial(
        DiminishingMultiheadAttention, **diminishing_attention_kwargs(args, decoder.max_positions())
    )
    return replace_cross_attention(decoder, parse_layers(args.dimattn_layers, len(decoder.layers)), build)


class DimAttnMixin:
    """Builds the parent's decoder, then makes the chosen cross-attentions diminishing."""

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        decoder = super().build_decoder(args, tgt_dict, embed_tokens)
        return install_diminishing_attention(decoder, args)


@register_model("transformer_dimattn")
class DimAttnTransformerModel(PretrainedEncoderMixin, DimAttnMixin, TransformerModel):
    """Transformer with diminishing cross-attention (Han, Lin and Joty); see module docstring.
    ``--encoder-pretrained``: a released BERT as its encoder (:mod:`.pretrained_encoder`)."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        add_dimattn_args(parser)
        add_encoder_pretrained_args(parser)


@register_model("bart_dimattn")
class DimAttnBARTModel(DimAttnMixin, BARTModel):
    """BART with diminishing cross-attention, fine-tuned from a BART checkpoint."""

    @staticmethod
    def add_args(parser):
        BARTModel.add_args(parser)
        add_dimattn_args(parser)

    def upgrade_state_dict_named(self, state_dict, name):
        """BART's upgrade, then the checkpoint's embeddings grown to the task dictionary; a
        pretrained tensor the upgrade would drop is refused
        (:func:`~fairseq_knowgen.convert.extend_dictionary.upgrade_pretrained_bart`)."""
        # imported here: ``python -m fairseq_knowgen.convert.extend_dictionary`` runs that module as
        # __main__, and runpy warns when the package import (which registers the models) loaded it first
        from ..convert.extend_dictionary import upgrade_pretrained_bart

        upgrade_pretrained_bart(self, state_dict, name, super().upgrade_state_dict_named)


@register_model_architecture("transformer_dimattn", "transformer_dimattn")
def transformer_dimattn_architecture(args):
    dimattn_defaults(args)
    base_architecture(args)


@register_model_architecture("bart_dimattn", "bart_dimattn_base")
def bart_dimattn_base_architecture(args):
    dimattn_defaults(args)
    bart_base_architecture(args)


@register_model_architecture("bart_dimattn", "bart_dimattn_large")
def bart_dimattn_large_architecture(args):
    dimattn_defaults(args)
    bart_large_architecture(args)
