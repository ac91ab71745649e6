"""A released BERT as the encoder of a sequence-to-sequence model (``--encoder-pretrained``).

Rothe, Narayan and Severyn ("Leveraging Pre-trained Checkpoints for Sequence Generation Tasks", TACL 2020)
start the encoder of a Transformer from BERT and train the decoder from scratch (their BERT2RND), as
HuggingFace's ``EncoderDecoderModel`` does. With ``--encoder-pretrained PATH`` every sequence-to-sequence
model of this package does the same: ``transformer_pretrained_encoder`` (fairseq's ``transformer``),
``transformer_dimattn``, ``copy_transformer``, ``eki_transformer`` and ``kbert_transformer``. PATH is a
folder written by :mod:`fairseq_knowgen.convert.hf_bert` (its ``model.pt`` and ``dict.txt``), or that
``model.pt``; a fairseq RoBERTa / masked-LM checkpoint in the same layout is read the same way.

The encoder is :class:`BertSourceEncoder`, K-BERT's BERT-layout encoder
(:class:`~fairseq_knowgen.models.kbert.KBertEncoder`) with BERT's settings, each read from the checkpoint:
learned positions (fairseq's numbering, position p at row p + padding_idx + 1, as the converter writes
BERT's table), the segment-0 (token type 0) embedding added to every token, the embedding LayerNorm,
post-LN layers, GELU, LayerNorm epsilon 1e-12, its sizes and its dropouts. In ``kbert_transformer`` it
reads the sentence tree (soft positions, visible matrix) as K-BERT's own encoder does; elsewhere every
token sees every other one. When the decoder is narrower or wider than BERT, a linear projection
``W h + b`` (``output_projection``, Xavier-initialized, trained) maps each encoder state to the decoder's
width: the decoder's cross-attention and the package's heads (copy, EKI's scaling and position
indicator) read states of their usual width. ``--freeze-encoder`` keeps BERT's tensors as they are (the
projection and EKI's encoder parts still train).

The source dictionary must be the BERT's: ``dict.txt`` of the converted folder, grown with the recipe's
symbols by ``python -m fairseq_knowgen.convert.extend_dictionary`` (BERT's rows first and in order, then
``<sep>``, ``<ent-K>``...). New rows start at the mean of BERT's (:func:`~fairseq_knowgen.convert.
extend_dictionary.grow_rows`). The source text is WordPiece (``python -m fairseq_knowgen.prep.wordpiece``).

A partial load is an error (:class:`~fairseq_knowgen.textio.DataError`, ``PATH: ...``): a tensor of BERT's
layout left without a checkpoint value, a checkpoint tensor without a place, a shape that differs, or a
dictionary whose first rows are not the checkpoint's. The checkpoint is read only when training starts
from it: what it fixes (sizes, epsilon, dropouts) is recorded in the args as ``pretrained_encoder_config``
and saved with every checkpoint, so a trained model rebuilds and decodes without PATH, as K-BERT's
``--kbert-pretrained`` does.
"""

import json
import logging
import os
from argparse import Namespace
from typing import Dict, Optional, Sequence

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel, base_architecture
from torch import Tensor, nn

from ..convert.extend_dictionary import grow_rows, pretrained_symbols
from ..convert.fairseq_legacy import load_checkpoint_state, load_pretrained_part
from ..textio import DataError
from .kbert import ENCODER_PREFIX, LM_HEAD_PREFIX, KBertEncoder

logger = logging.getLogger(__name__)

# what the checkpoint's args fix, recorded in the model's args (pretrained_encoder_config) -> its default
CONFIG_KEYS = {
    "encoder_layers": None,
    "encoder_embed_dim": None,
    "encoder_ffn_embed_dim": None,
    "encoder_attention_heads": None,
    "activation_fn": "gelu",
    "layer_norm_eps": 1e-5,
    "num_segments": 0,
    "max_positions": 512,
    "dropout": 0.1,
    "attention_dropout": 0.1,
    "activation_dropout": 0.0,
}


def add_encoder_pretrained_args(parser):
    """``--encoder-pretrained`` and ``--freeze-encoder``."""
    parser.add_argument(
        "--encoder-pretrained",
        metavar="PATH",
        help="start the encoder from this BERT (a folder written by python -m fairseq_knowgen.convert.hf_bert, or "
        "its model.pt): BERT's layout, sizes and dropouts; the source dictionary is its dict.txt, grown by "
        "convert.extend_dictionary; read only when training starts from it",
    )
    parser.add_argument(
        "--freeze-encoder",
        action="store_true",
        help="with --encoder-pretrained: BERT's tensors are not trained (the projection to the decoder's width is)",
    )


def pretrained_pending(args) -> bool:
    """Whether ``--encoder-pretrained`` is still to be read (a model built for training from it)."""
    return bool(getattr(args, "encoder_pretrained", None)) and not getattr(args, "pretrained_encoder_config", None)


def uses_pretrained_encoder(args) -> bool:
    """Whether the model's encoder is BERT's (read now or recorded in a checkpoint's args)."""
    return bool(getattr(args, "pretrained_encoder_config", None))


def checkpoint_files(path: str):
    """``(model.pt, dict.txt)`` of ``--encoder-pretrained PATH`` (a folder, or the model.pt in one)."""
    model = os.path.join(path, "model.pt") if os.path.isdir(path) else path
    if not os.path.isfile(model):
        raise DataError(path, 0, "no such checkpoint (a folder of python -m fairseq_knowgen.convert.hf_bert, or a .pt)")
    dictionary = os.path.join(os.path.dirname(model), "dict.txt")
    if not os.path.isfile(dictionary):
        raise DataError(dictionary, 0, "no dict.txt beside the checkpoint: the encoder's rows cannot be checked")
    return model, dictionary


def pretrained_config(pretrained_args, source: str) -> Dict[str, object]:
    """What the checkpoint's args fix (:data:`CONFIG_KEYS`); its sizes must be there."""
    config = {}
    for key, default in CONFIG_KEYS.items():
        value = getattr(pretrained_args, key, None) if pretrained_args is not None else None
        if value is None and default is None:
            raise DataError(source, 0, f"the checkpoint's args do not give {key}: not a BERT / masked-LM encoder")
        config[key] = default if value is None else value
    if getattr(pretrained_args, "encoder_normalize_before", False):
        raise DataError(source, 0, "a pre-LN encoder (encoder_normalize_before): BERT's layout is post-LN")
    return config


def check_dictionary(dictionary, dict_path: str, num_rows: int, source: str):
    """The source dictionary's first ``num_rows`` symbols are the checkpoint's, in its order."""
    theirs = pretrained_symbols(dict_path, num_rows)
    ours = list(dictionary.symbols[:num_rows])
    if ours != theirs:
        i = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
        found = repr(ours[i]) if i < len(ours) else f"the end of the dictionary ({len(ours)} symbols)"
        raise DataError(
            source,
            0,
            f"the source dictionary is not the encoder's: row {i} is {found}, {dict_path} has {theirs[i]!r}; "
            "binarize the source with that dict.txt, grown by python -m fairseq_knowgen.convert.extend_dictionary",
        )


class BertSourceEncoder(KBertEncoder):
    """BERT as a sequence-to-sequence encoder: :class:`KBertEncoder` with the checkpoint's settings
    (``pretrained_encoder_config``), an optional projection to the decoder's width, and fairseq's
    encoder interface (``src_lengths``, ``src_tokens`` kept for the copy head, any reordering).

    Args:
        args: the model's args (``pretrained_encoder_config``; ``no_visible_matrix`` and
            ``no_soft_positions`` for ``kbert_transformer``, a plain sentence elsewhere)
        dictionary: the source dictionary (BERT's, possibly grown)
        embed_tokens: the model's source embedding, used when it has BERT's width (shared embeddings)
        output_dim: the width the decoder reads; a projection when it is not BERT's
    """

    NOT_PRETRAINED = ("output_projection",)  # parts of the encoder the checkpoint has no tensors for

    def __init__(self, args, dictionary, embed_tokens: Optional[nn.Embedding], output_dim: int):
        config = json.loads(args.pretrained_encoder_config)
        bert = Namespace(
            **config,
            encoder_normalize_before=False,
            no_visible_matrix=getattr(args, "no_visible_matrix", None) in (None, True),
            no_soft_positions=bool(getattr(args, "no_soft_positions", False)),
        )
        dim = config["encoder_embed_dim"]
        if embed_tokens is not None and embed_tokens.embedding_dim != dim:
            embed_tokens = None  # the model's (narrower or wider) table: BERT has its own
        super().__init__(bert, dictionary, embed_tokens, config["max_positions"])
        self.embed_scale = 1.0  # BERT does not scale its token embeddings
        self.output_projection = None
        if output_dim != dim:
            self.output_projection = nn.Linear(dim, output_dim)
            nn.init.xavier_uniform_(self.output_projection.weight)
            nn.init.zeros_(self.output_projection.bias)
        self.output_dim = output_dim

    def forward(self, src_tokens, src_lengths=None, token_embeddings=None, return_all_hiddens=False, **kwargs):
        """
        Args:
            src_tokens: B x T (``<s> wordpieces </s>``, right-padded)
            src_lengths: B (kept for the decoder)
            token_embeddings: B x T x C token embeddings to use instead of the table's (EKI adds E_group)
            kwargs: ``soft_positions``, ``branch_ids``, ``mention_ids``, ``segment_ids`` (K-BERT's tree)

        Returns:
            fairseq's encoder dict: ``encoder_out`` [T x B x output_dim], ``encoder_padding_mask`` [B x T],
            ``src_tokens`` [B x T], ``src_lengths`` [B]
        """
        out = super().forward(src_tokens, token_embeddings=token_embeddings, **kwargs)
        if self.output_projection is not None:
            out["encoder_out"] = [self.output_projection(out["encoder_out"][0])]  # T x B x output_dim
        out["src_tokens"] = [src_tokens]
        out["src_lengths"] = [src_lengths] if src_lengths is not None else []
        return out

    def reorder_encoder_out(self, encoder_out: Dict[str, list], new_order):
        """Every entry reordered (the T x B x C states on their batch dimension 1, the rest on 0)."""
        return {
            key: [t.index_select(1 if key in ("encoder_out", "encoder_states") else 0, new_order) for t in tensors]
            for key, tensors in encoder_out.items()
        }

    def pretrained_names(self) -> Sequence[str]:
        """The tensor names that come from the checkpoint (the rest are :data:`NOT_PRETRAINED` parts)."""
        return [k for k in self.state_dict() if k.split(".")[0] not in self.NOT_PRETRAINED]

    def load_pretrained(self, state: Dict[str, Tensor], dict_path: str, source: str):
        """Every BERT tensor of ``state`` (fairseq's masked-LM layout) into this encoder, or an error; the token
        table grown to the dictionary (new rows: the mean of BERT's)."""
        key = ENCODER_PREFIX + "embed_tokens.weight"
        if key not in state:
            raise DataError(source, 0, f"no {key}: not a converted BERT or a masked-LM checkpoint")
        check_dictionary(self.dictionary, dict_path, state[key].size(0), source)
        state = dict(state)
        state[key] = grow_rows(state[key], len(self.dictionary))
        new = [k for k in self.state_dict() if k not in self.pretrained_names()]
        loaded = load_pretrained_part(self, state, ENCODER_PREFIX, source, extras=(LM_HEAD_PREFIX,), new=new)
        logger.info(f"encoder from {source}: all {len(loaded)} tensors loaded; new: {', '.join(new) or 'none'}")

    def freeze_pretrained(self):
        """``--freeze-encoder``: BERT's tensors get no gradient."""
        params = dict(self.named_parameters())
        for name in self.pretrained_names():
            if name in params:
                params[name].requires_grad_(False)


class PretrainedEncoderMixin:
    """Put before a fairseq ``TransformerModel`` subclass: ``--encoder-pretrained`` builds
    :class:`BertSourceEncoder` (``build_encoder``) and loads the checkpoint into it (``build_model``).
    A model whose own ``build_encoder`` makes another encoder calls this one when
    :func:`uses_pretrained_encoder` (``copy_transformer``) or builds its own subclass of :class:`BertSourceEncoder`
    (``eki_transformer``)."""

    @classmethod
    def build_model(cls, args, task):
        source = getattr(args, "encoder_pretrained", None)
        state = dict_path = None
        if pretrained_pending(args):
            model_path, dict_path = checkpoint_files(source)
            state, pretrained_args = load_checkpoint_state(model_path)
            config = pretrained_config(pretrained_args, model_path)
            args.pretrained_encoder_config = json.dumps(config, sort_keys=True)
        if uses_pretrained_encoder(args):
            width = json.loads(args.pretrained_encoder_config)["encoder_embed_dim"]
            # the decoder reads encoder states of its own width (a projection when BERT's differs)
            args.encoder_embed_dim = args.decoder_embed_dim
            if getattr(args, "share_all_embeddings", False) and args.decoder_embed_dim != width:
                raise ValueError(
                    f"--share-all-embeddings needs the decoder as wide as the pretrained encoder ({width}), not "
                    f"--decoder-embed-dim {args.decoder_embed_dim}: use --share-decoder-input-output-embed"
                )
        model = super().build_model(args, task)
        if state is not None:
            model.encoder.load_pretrained(state, dict_path, source)
        if uses_pretrained_encoder(args) and getattr(args, "freeze_encoder", False):
            model.encoder.freeze_pretrained()
        return model

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        if uses_pretrained_encoder(args):
            return BertSourceEncoder(args, src_dict, embed_tokens, embed_tokens.embedding_dim)
        return super().build_encoder(args, src_dict, embed_tokens)


@register_model("transformer_pretrained_encoder")
class PretrainedEncoderTransformerModel(PretrainedEncoderMixin, TransformerModel):
    """fairseq's ``transformer`` with ``--encoder-pretrained`` (Rothe et al., 2020, BERT2RND); without the flag it
    is fairseq's transformer."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        add_encoder_pretrained_args(parser)


@register_model_architecture("transformer_pretrained_encoder", "transformer_pretrained_encoder")
def transformer_pretrained_encoder_architecture(args):
    """fairseq's ``transformer`` defaults (the encoder's sizes are the checkpoint's)."""
    base_architecture(args)


__all__ = [
    "BertSourceEncoder",
    "PretrainedEncoderMixin",
    "PretrainedEncoderTransformerModel",
    "add_encoder_pretrained_args",
    "uses_pretrained_encoder",
]
