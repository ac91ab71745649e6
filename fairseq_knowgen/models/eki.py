"""EKI retrieve-and-edit models ("An Enhanced Knowledge Injection Model for Commonsense Generation",
Fan et al., COLING 2020; the authors' code: https://github.com/LibertFan/EKI-BART): ``eki_transformer``
(from scratch), ``eki_bart_base`` and ``eki_bart_large`` (fine-tuned from fairseq BART). Each default
is the paper's or, where it is silent, the authors' code's; ``docs/methods/eki.md`` has the table.

Each part is its own module and its own switch, for ablations:

- ``--eki-group-embeddings``: E_C / E_O added to the input embeddings (Eq. 3,
  :mod:`~fairseq_knowgen.modules.group_embedding`), starting at N(0, ``--eki-group-init-std``^2);
- ``--eki-scaling``: the scaling module on the encoder output (Eq. 5,
  :mod:`~fairseq_knowgen.modules.scaling_module`), activation ``--eki-scaling-activation`` (the
  paper's relu), inner size ``--eki-scaling-dim`` (the authors' 512), dropout
  ``--eki-scaling-dropout`` (the authors': the model's ``--dropout``), weights N(0,
  ``--eki-scaling-init-std``^2) (the authors' 1e-3) arranged by ``--eki-scaling-init``; its
  Mean(Lambda) feeds L_E in the ``eki_label_smoothed_cross_entropy`` criterion (Eq. 6);
- ``--eki-position-indicator``: E_D added to the cross-attention keys of the decoder layers
  ``--eki-position-layers`` (default all; Eq. 7-9,
  :mod:`~fairseq_knowgen.modules.position_indicator`), starting at N(0, ``--eki-distance-init-std``^2).

The other two methods of this package compose with EKI by flags (all off by default; with
them off the model is parameter for parameter the plain EKI one, and its checkpoints load):

- ``--copy``: the pointer-generator copy head of ``copy_transformer`` (force-copy paper,
  Eq. 5-6; :class:`~fairseq_knowgen.models.copy_transformer.CopyDecoderMixin`) over the whole
  source (``concepts <sep> prototype`` or ``<s> concepts prototype``), with ``--copy-layer`` /
  ``--copy-heads``. Its only
  parameters are the switch of Eq. 5 (``decoder.copy_generator.switch``); ``<sep>`` and
  BART's ``<mask>`` are never copied (nor pad/EOS/BOS/``<unk>``), concept and prototype
  tokens are. The copy attention is the copy layer's cross-attention, with E_D in its keys
  when that layer has the position indicator. Train with ``--criterion eki_force_copy``
  (the ``force_copy`` loss + lambda * L_E);
- ``--dimattn-type dim|dydim`` (and the other ``--dimattn-*`` flags): diminishing attention
  (Han, Lin and Joty, Eq. 4-5) in the cross-attention of the layers ``--dimattn-layers`` (default
  the last, or the copy layer with ``--copy``). A layer with the position indicator as well
  gets :class:`DiminishingPositionIndicatorAttention`: Eq. 9's logits, diminishing weights.
  No new parameters.

For example, all three on the CommonGen EKI data of ``examples/commongen``::

    fairseq-train DATA --user-dir fairseq_knowgen --task eki_generation --arch eki_transformer \\
        --copy --dimattn-type dydim --criterion eki_force_copy --copy-supervision force ...

A switched-off part creates no parameters (no rank waits for a gradient under DDP). Use
them with ``--task eki_generation`` on data binarized with one dictionary for source and target
(``fairseq-preprocess --joined-dictionary``; separate dictionaries are refused at build time).
Fine-tuning from BART: the new parameters start near zero, as the paper and the authors' code
start them (group embeddings N(0, 0.01^2), E_D N(0, 0.005^2), the scaling module's weights
N(0, 0.001^2) so that 2 Lambda ~ 1), redrawn after BART's own ``init_bert_params``, which would
draw them from N(0, 0.02^2). ``--eki-group-init-std 0 --eki-distance-init-std 0
--eki-scaling-init mirrored`` starts EKI-BART exactly at BART's function (in evaluation)::

    fairseq-train DATA --user-dir fairseq_knowgen --task eki_generation --arch eki_bart_large \\
        --restore-file bart.large/model.pt --reset-optimizer --reset-dataloader --reset-meters \\
        --reset-lr-scheduler --criterion eki_label_smoothed_cross_entropy ...

``--restore-file`` loads the BART weights non-strictly for the new parameters only: they are
absent from the checkpoint and keep their initialization (see ``load_state_dict``). A task
dictionary larger than the checkpoint's embedding (``<sep>`` added to bart's ``dict.txt`` by
``python -m fairseq_knowgen.convert.extend_dictionary``) grows it: new rows start at the mean
of BART's, BART's stay as they are (``docs/pretrained_bart.md``). Any other tensor the
checkpoint lacks, or has beyond the model, is an error naming it.
"""

import argparse
import functools
from typing import Dict, List, Optional, Tuple

from fairseq import utils
from fairseq.models import register_model, register_model_architecture
from fairseq.models.bart import BARTModel
from fairseq.models.bart.model import bart_base_architecture, bart_large_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
)
from torch import Tensor

from ..data.eki_dataset import SEPARATOR
from ..modules.cross_attention import replace_cross_attention
from ..modules.diminishing_attention import DiminishingMultiheadAttention
from ..modules.group_embedding import GroupEmbedding
from ..modules.position_indicator import PositionIndicatorAttention
from ..modules.scaling_module import SCALING_INITS, ScalingModule
from .copy_transformer import CopyDecoderMixin, add_copy_args, copy_defaults, dimattn_at_copy_layer, tie_placeholders
from .dimattn import add_dimattn_args, dimattn_defaults, diminishing_attention_kwargs, parse_layers
from .pretrained_encoder import (
    BertSourceEncoder,
    PretrainedEncoderMixin,
    add_encoder_pretrained_args,
    uses_pretrained_encoder,
)

# parameters a pretrained (BART) checkpoint lacks: they keep their initialization on --restore-file
NEW_PARAMETER_PREFIXES = ("encoder.group_embedding.", "encoder.scaling.", "distance_embed.", "decoder.copy_generator.")
# never copied besides pad/EOS/BOS/<unk>: the separator of ``concepts <sep> prototype`` and
# BART's <mask> mark the source's layout, they are no words of it
EKI_UNCOPYABLE = (SEPARATOR, "<mask>")


# the paper's, else the authors' code's (docs/methods/eki.md); eki_scaling_dropout None: the model's --dropout
EKI_DEFAULTS = {
    "eki_group_embeddings": 1,
    "eki_group_init_std": 0.01,
    "eki_scaling": 1,
    "eki_scaling_activation": "relu",
    "eki_scaling_dim": 512,
    "eki_scaling_dropout": None,
    "eki_scaling_init_std": 1e-3,
    "eki_scaling_init": "normal",
    "eki_position_indicator": 1,
    "eki_position_layers": "all",
    "eki_max_distance": 64,
    "eki_distance_init_std": 5e-3,
}


def _at_least(minimum: int):
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in its messages
    return parse


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


_positive_float.__name__ = "float"


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


_non_negative_float.__name__ = "float"


def _dropout(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


_dropout.__name__ = "float"


def add_eki_args(parser):
    d = EKI_DEFAULTS
    parser.add_argument(
        "--eki-group-embeddings",
        type=int,
        choices=[0, 1],
        help=f"group embeddings E_C/E_O (Eq. 3; default {d['eki_group_embeddings']})",
    )
    parser.add_argument(
        "--eki-group-init-std",
        type=_non_negative_float,
        metavar="STD",
        help=f"E_C/E_O start at N(0, std^2) (default {d['eki_group_init_std']}, the authors' code; 0: zero, "
        "so that a fine-tuned BART's input starts unchanged)",
    )
    parser.add_argument(
        "--eki-scaling", type=int, choices=[0, 1], help="scaling module on the encoder output (Eq. 5; default 1)"
    )
    parser.add_argument(
        "--eki-scaling-activation",
        choices=utils.get_available_activation_fns(),
        help=f"activation of the scaling module (default {d['eki_scaling_activation']}, the paper's Eq. 5; the "
        "authors' code uses BART's gelu)",
    )
    parser.add_argument(
        "--eki-scaling-dim",
        type=_at_least(1),
        metavar="D_S",
        help=f"inner size d_s >= 1 of the scaling module (default {d['eki_scaling_dim']}, the authors' code)",
    )
    parser.add_argument(
        "--eki-scaling-dropout",
        type=_dropout,
        metavar="P",
        help="dropout on the scaling module's input and hidden units (default: the model's --dropout, as the "
        "authors' code)",
    )
    parser.add_argument(
        "--eki-scaling-init-std",
        type=_positive_float,
        metavar="STD",
        help=f"std of the N(0, std^2) scaling-module weights (default {d['eki_scaling_init_std']}, the authors' "
        "code); it sets how far 2*Lambda starts from 1",
    )
    parser.add_argument(
        "--eki-scaling-init",
        choices=SCALING_INITS,
        help="scaling-module start: 'normal' (default) is the paper's plain N(0, std^2) (2*Lambda ~ 1); 'mirrored' "
        "pairs hidden units with opposite output weights, so 2*Lambda = 1 exactly and a fine-tuned BART starts as BART",
    )
    parser.add_argument(
        "--eki-position-indicator",
        type=int,
        choices=[0, 1],
        help="distance embedding E_D in the cross-attention keys (Eq. 9; default 1, the paper's model; the authors' "
        "released code never feeds it distances: 0 is their model)",
    )
    parser.add_argument(
        "--eki-position-layers",
        type=str,
        metavar="L",
        help="decoder layers with E_D: 'all' (default) or a comma list of indices, negative from the end",
    )
    parser.add_argument(
        "--eki-max-distance",
        type=_at_least(1),
        help=f"distances are clipped here, >= 1 (E_D has this + 1 rows; default {d['eki_max_distance']})",
    )
    parser.add_argument(
        "--eki-distance-init-std",
        type=_non_negative_float,
        metavar="STD",
        help=f"E_D starts at N(0, std^2) (default {d['eki_distance_init_std']}, the authors' code; 0: zero)",
    )


def eki_defaults(args):
    """Fill unset EKI options (``None`` only: 0 is a value) and check them: a bad value is an
    error naming its flag, never silently replaced. A checkpoint from before the scaling module's
    activation and dropout options (its args have ``eki_scaling_dim`` and no
    ``eki_scaling_activation``) keeps the module it was trained with: ReLU, no dropout."""
    if hasattr(args, "eki_scaling_dim") and not hasattr(args, "eki_scaling_activation"):
        args.eki_scaling_dropout = 0.0
    for name, default in EKI_DEFAULTS.items():
        if getattr(args, name, None) is None and name != "eki_scaling_dropout":
            setattr(args, name, default)
    if not hasattr(args, "eki_scaling_dropout"):
        args.eki_scaling_dropout = None  # the model's --dropout
    for name in ("eki_scaling_dim", "eki_max_distance"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.eki_scaling_init_std > 0:
        raise ValueError(f"--eki-scaling-init-std must be > 0, got {args.eki_scaling_init_std}")
    for name in ("eki_group_init_std", "eki_distance_init_std"):
        if not getattr(args, name) >= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.eki_scaling_dropout is not None and not 0 <= args.eki_scaling_dropout < 1:
        raise ValueError(f"--eki-scaling-dropout must be in [0, 1), got {args.eki_scaling_dropout}")
    if args.eki_scaling_init not in SCALING_INITS:
        raise ValueError(f"--eki-scaling-init must be one of {SCALING_INITS}, got {args.eki_scaling_init!r}")


def scaling_dropout(args) -> float:
    """``--eki-scaling-dropout``, or the model's ``--dropout`` when unset (the authors' code)."""
    return args.eki_scaling_dropout if args.eki_scaling_dropout is not None else float(getattr(args, "dropout", 0.0))


def check_shared_dictionary(src_dict, tgt_dict):
    """EKI compares and scatters token ids between source and target (L_E labels, concept
    matches) and applies the target dictionary's special-symbol masks to source ids: both
    sides must use one dictionary."""
    if src_dict is tgt_dict or src_dict.symbols == tgt_dict.symbols:
        return
    n = min(len(src_dict), len(tgt_dict))
    i = next((i for i in range(n) if src_dict.symbols[i] != tgt_dict.symbols[i]), n)
    first = (
        f"first difference at id {i}: {src_dict.symbols[i]!r} vs {tgt_dict.symbols[i]!r}"
        if i < n
        else f"{len(src_dict)} vs {len(tgt_dict)} symbols"
    )
    raise ValueError(
        "EKI needs one dictionary for source and target, but the source and target dictionaries differ "
        f"({first}): binarize with fairseq-preprocess --joined-dictionary (or --srcdict and --tgtdict the same file)"
    )


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


class EKIMixin:
    """Shared by the transformer and BART variants: build EKI encoder/decoder, start the new
    parameters at their EKI initialization, load pretrained checkpoints that lack them."""

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        # BARTModel.__init__ has just run init_bert_params over every module, ours included
        # (N(0, 0.02^2) group/distance embeddings and scaling weights): restore the EKI start
        self.reset_eki_parameters()

    def reset_eki_parameters(self):
        """New parameters to their EKI start: E_C/E_O ~ N(0, ``--eki-group-init-std``^2), E_D ~
        N(0, ``--eki-distance-init-std``^2), the scaling module at 2 Lambda ~ 1 (``--eki-scaling-init``;
        exactly 1 with ``mirrored``). With both stds 0 and ``mirrored`` the pretrained model's function
        is unchanged."""
        for m in self.modules():
            if isinstance(m, (GroupEmbedding, ScalingModule, PositionIndicatorAttention)):
                m.reset_eki_parameters()

    @classmethod
    def build_model(cls, args, task):
        check_shared_dictionary(task.source_dictionary, task.target_dictionary)
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        eki_defaults(args)
        if uses_pretrained_encoder(args):
            return EKIBertEncoder(args, src_dict, embed_tokens)
        return EKIEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens, args)

    @classmethod
    def build_embedding(cls, args, dictionary, embed_dim, path=None):
        emb = super().build_embedding(args, dictionary, embed_dim, path)
        return tie_placeholders(emb, dictionary) if getattr(args, "copy", False) else emb

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        eki_defaults(args)
        cfg = TransformerConfig.from_namespace(args)
        if not getattr(args, "copy", False):
            if getattr(args, "dimattn_type", None):
                dimattn_defaults(args)
            return EKIDecoder(cfg, tgt_dict, embed_tokens, args)
        copy_defaults(args)
        if getattr(args, "dimattn_type", None):
            n = cfg.decoder.layers
            if not -n <= args.copy_layer < n:
                raise ValueError(f"--copy-layer {args.copy_layer} out of range for {n} decoder layers")
            dimattn_at_copy_layer(args, args.copy_layer % n)
        return EKICopyDecoder(cfg, tgt_dict, embed_tokens, args)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, src_group=None, src_distance=None, **kwargs):
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, src_group=src_group, src_distance=src_distance)
        return self.decoder(prev_output_tokens, encoder_out=encoder_out, src_lengths=src_lengths)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """Parameters of EKI parts absent from a checkpoint (a plain BART one) keep their
        initialization; everything else must match as usual."""
        own = self.state_dict()
        missing_new = {k for k in own if k not in state_dict and any(p in k for p in NEW_PARAMETER_PREFIXES)}
        if missing_new:
            state_dict = dict(state_dict)
            for k in missing_new:
                state_dict[k] = own[k]
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)


@register_model("eki_transformer")
class EKITransformerModel(EKIMixin, PretrainedEncoderMixin, TransformerModel):
    """EKI on a transformer trained from scratch, or on a released BERT's encoder (``--encoder-pretrained``)."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        add_eki_args(parser)
        add_copy_args(parser, switch=True)
        add_dimattn_args(parser)
        add_encoder_pretrained_args(parser)


@register_model("eki_bart")
class EKIBARTModel(EKIMixin, BARTModel):
    """EKI-BART: fine-tuned from a fairseq BART checkpoint."""

    @staticmethod
    def add_args(parser):
        BARTModel.add_args(parser)
        add_eki_args(parser)
        add_copy_args(parser, switch=True)
        add_dimattn_args(parser)

    def forward(
        self,
        src_tokens,
        src_lengths,
        prev_output_tokens,
        src_group=None,
        src_distance=None,
        features_only=False,
        classification_head_name=None,
        token_embeddings=None,
        return_all_hiddens=True,
        alignment_layer=None,
        alignment_heads=None,
    ):
        return EKIMixin.forward(self, src_tokens, src_lengths, prev_output_tokens, src_group, src_distance)

    def upgrade_state_dict_named(self, state_dict, name):
        """BART's upgrade, then the checkpoint's embeddings grown to the task dictionary
        (``<sep>`` and any other new symbol get new rows, the mean of the pretrained ones);
        a pretrained tensor the upgrade would drop is refused
        (:func:`~fairseq_knowgen.convert.extend_dictionary.upgrade_pretrained_bart`)."""
        # imported here: ``python -m fairseq_knowgen.convert.extend_dictionary`` runs that module as
        # __main__, and runpy warns when the package import (which registers the models) loaded it first
        from ..convert.extend_dictionary import upgrade_pretrained_bart

        upgrade_pretrained_bart(self, state_dict, name, super().upgrade_state_dict_named)


@register_model_architecture("eki_transformer", "eki_transformer")
def eki_transformer_architecture(args):
    eki_defaults(args)
    base_architecture(args)


@register_model_architecture("eki_bart", "eki_bart_base")
def eki_bart_base_architecture(args):
    eki_defaults(args)
    bart_base_architecture(args)


@register_model_architecture("eki_bart", "eki_bart_large")
def eki_bart_large_architecture(args):
    eki_defaults(args)
    bart_large_architecture(args)
