"""``copy_transformer``: a transformer whose decoder mixes generating and copying.

The copy head (Eq. 5-6 of "May the Force Be with Your Copy Mechanism", See et al.'s
pointer-generator) is :class:`~fairseq_knowgen.modules.copy_generator.CopyGenerator`; train it with
the ``force_copy`` criterion (``--copy-supervision none|force|force-unk``). The decoder returns
the *logits* of the mixture as its first output (log P(w) - log p_gen,
:func:`~fairseq_knowgen.modules.copy_generator.mixture_logits`: their log-softmax is log P(w)),
and ``p_gen`` (with its logit ``p_gen_logit``), the copy attention ``copy_attn`` and log P_vocab
(``vocab_lprobs``) in its ``extra`` dict, so criteria and analyses can read them.

The copy distribution (alpha_t of Eq. 6), by default as the paper writes it: the attention of one
head (``--copy-heads 1``, the first, as fairseq's pointer-generator's ``--alignment-heads 1``) of
the last decoder layer's cross-attention (``--copy-layer -1``), over every source position (EOS
and ``<unk>`` in the source add to P(EOS) and P(<unk>), as in Eq. 6 and fairseq's
pointer-generator). ``--copy-alpha renormalized`` instead keeps special symbols (EOS, BOS, pad),
``<unk>`` (and EKI's ``<sep>``/``<mask>``) out of the copy distribution and renormalizes alpha over
the remaining, copyable positions; ``--copy-heads all`` averages every head. A checkpoint saved
before ``--copy-alpha`` existed (its args have no ``copy_alpha``) was trained with both
(renormalized alpha, all heads unless it set ``--copy-heads``) and loads that way, with the
choice written into its args (:func:`copy_defaults`).

P_vocab (Eq. 4) is by default the decoder's output projection of s_t (fairseq's, tied with the
embeddings under ``--share-decoder-input-output-embed`` / ``--share-all-embeddings``, as fairseq's
``transformer_pointer_generator`` computes it); ``--copy-p-vocab eq4`` computes it as the paper
writes it, softmax(W'_v (W_v [s_t; c_t] + b) + b'), with the decoder's output projection as W'_v
(``copy_transformer`` only; see :mod:`~fairseq_knowgen.modules.copy_generator`).

In training mode the first output is None: the mixture over the whole vocabulary is not
needed for a loss at the targets (the ``force_copy`` criteria take log P(w*) from the extras,
:func:`~fairseq_knowgen.modules.copy_generator.mixture_lprobs_at`); ``get_normalized_probs``
computes it from the extras for any other criterion.

Decoding: ``get_normalized_probs`` is ``log_softmax`` of that first output, the one
normalisation every fairseq decoder's logits get, so fairseq-generate's ``--temperature T``,
which divides the decoder's first output by T, samples and searches P(w)^(1/T) / Z: the
temperature of the mixture, as ``softmax(logits / T)`` is for a plain transformer. In
incremental decoding (no gradients) the mixture is written into log P_vocab's tensor, and
``vocab_lprobs`` is left out of the extras; what depends on the source alone is computed on
the first step and kept in the incremental state
(:meth:`~fairseq_knowgen.modules.copy_generator.CopyGenerator.source_index`).

Vocabulary: source and target must share one dictionary (the copy head scatters source ids
into the target vocabulary; :meth:`CopyTransformerModel.build_model` refuses two). Its
``<unk-N>`` placeholders (:mod:`fairseq_knowgen.prep.placeholders`) are outside the fixed
vocabulary: P_vocab gives them probability 0, and their input embedding is ``<unk>``'s in
encoder and decoder (as in fairseq's ``examples/pointer_generator`` and See et al.): a
placeholder names a source position, not a word, so no vector of its own could mean
anything across examples.

With ``--dimattn-type`` (and the other ``--dimattn-*`` flags) the cross-attention of the
copy layer (and any layer named by ``--dimattn-layers``) becomes diminishing attention,
and the copy distribution uses the diminishing weights, divided by their sum over the
positions of Eq. 6 (all non-pad positions, or the copyable ones with ``--copy-alpha
renormalized``): diminishing weights sum to less than 1, and Eq. 6 needs a distribution.

The copy head is :class:`CopyDecoderMixin` on fairseq's decoder (:class:`CopyTransformerDecoder`);
the EKI models put the same mixin on their decoder with ``--copy`` (see
:mod:`fairseq_knowgen.models.eki`), so both share the flags (:func:`add_copy_args`), the
defaults and the masks defined here.
"""

import os
import re
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn as nn
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
)
from torch import Tensor

from ..modules.copy_generator import CopyGenerator, copyable_mask, full_mixture
from .dimattn import add_dimattn_args, dimattn_defaults, install_diminishing_attention
from .pretrained_encoder import PretrainedEncoderMixin, add_encoder_pretrained_args, uses_pretrained_encoder

PLACEHOLDER = re.compile(r"^<unk-\d+>$")
COPY_ALPHA = ("raw", "renormalized")
P_VOCAB = CopyGenerator.P_VOCAB


def uncopyable_mask(dictionary, symbols: Sequence[str] = ()) -> Tensor:
    """Vocabulary-sized bool tensor: True for symbols that are never copied (pad, EOS, BOS
    and ``<unk>``: a source ``<unk>`` is some unknown word, not the target's), and for the
    given ``symbols`` the dictionary has (EKI: ``<sep>`` and BART's ``<mask>``, markers of the
    source's layout, not words)."""
    mask = torch.zeros(len(dictionary), dtype=torch.bool)
    for idx in {dictionary.pad(), dictionary.eos(), dictionary.bos(), dictionary.unk()}:
        mask[idx] = True
    for symbol in symbols:
        if symbol in dictionary.indices:
            mask[dictionary.index(symbol)] = True
    return mask


def placeholder_mask(dictionary) -> Tensor:
    """Vocabulary-sized bool tensor: True for the ``<unk-N>`` placeholders (not ``<unk>``)."""
    return torch.tensor([bool(PLACEHOLDER.match(s)) for s in dictionary.symbols], dtype=torch.bool)


class UnkTiedEmbedding(nn.Embedding):
    """An embedding that looks up ``<unk>``'s row for the ids in ``tied`` (the placeholders).

    Same weight (and state-dict entry) as the embedding it wraps; the rows of the tied ids
    are never read."""

    def __init__(self, embedding: nn.Embedding, tied: Tensor, unk: int):
        super().__init__(embedding.num_embeddings, embedding.embedding_dim, embedding.padding_idx)
        self.weight = embedding.weight
        remap = torch.arange(embedding.num_embeddings)
        remap[tied] = unk
        self.register_buffer("remap", remap, persistent=False)

    def forward(self, tokens: Tensor) -> Tensor:
        return super().forward(self.remap[tokens])


def tie_placeholders(embedding: nn.Embedding, dictionary) -> nn.Embedding:
    """``embedding`` with the ``<unk-N>`` placeholders reading ``<unk>``'s row (see the module
    docstring); unchanged when the dictionary has none."""
    tied = placeholder_mask(dictionary)
    return UnkTiedEmbedding(embedding, tied, dictionary.unk()) if tied.any() else embedding


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


def pad_only_mask(dictionary) -> Tensor:
    """Vocabulary-sized bool tensor, True for pad only: the positions Eq. 6 leaves out with raw
    alpha (pad gets no attention anyway)."""
    mask = torch.zeros(len(dictionary), dtype=torch.bool)
    mask[dictionary.pad()] = True
    return mask


def copy_heads_arg(value: str) -> int:
    """``--copy-heads``: a number of heads, or ``all`` (0)."""
    if value == "all":
        return 0
    heads = int(value)
    if heads < 0:
        raise ValueError(f"--copy-heads must be 'all' or a positive number, got {value!r}")
    return heads


def add_copy_args(parser, switch: bool = False):
    """``--copy-layer``, ``--copy-heads`` and ``--copy-alpha``; with ``switch`` also ``--copy``
    (the models on which the copy head is optional: ``eki_*``).

    ``--copy-alpha`` has its default in the parser (the others get theirs from
    :func:`copy_defaults`): fairseq's model-specific option group leaves an option without one
    out of the args when it is not given, and the EKI models build their decoder from a copy of
    the args, so only a parser default puts the value into every checkpoint's args, and lets
    :func:`copy_defaults` tell a checkpoint saved before the flag existed by its absence."""
    if switch:
        parser.add_argument(
            "--copy",
            action="store_true",
            help="add the pointer-generator copy head (force-copy paper, Eq. 5-6) over the whole source; "
            "train with --criterion eki_force_copy (default: off, no copy parameters)",
        )
    parser.add_argument(
        "--copy-layer",
        type=int,
        metavar="L",
        help="decoder layer whose cross-attention is the copy attention (default -1: last)",
    )
    parser.add_argument(
        "--copy-heads",
        type=copy_heads_arg,
        metavar="H",
        help="the copy attention is the first head of --copy-layer (default 1: one attention distribution, as the "
        "force-copy paper and fairseq's pointer-generator's --alignment-heads 1), or the average of its first H "
        "heads, or of all of them ('all')",
    )
    parser.add_argument(
        "--copy-alpha",
        choices=COPY_ALPHA,
        default="raw",
        help="the copy distribution of Eq. 6: raw: the attention alpha_t over every source position, as the paper "
        "(EOS and <unk> in the source are copied as themselves); renormalized: alpha over the copyable positions "
        "only (not EOS/BOS/pad/<unk>, nor EKI's <sep>/<mask>), renormalized to sum to 1 (default raw; checkpoints "
        "saved before this flag existed load as renormalized, with all heads unless they set --copy-heads)",
    )


def add_p_vocab_arg(parser):
    """``--copy-p-vocab`` (``copy_transformer``): P_vocab of Eq. 4 from fairseq's output projection of
    s_t, or from [s_t; c_t] as the paper writes it. Its default is in the parser, so every checkpoint's
    args record it; one saved before the flag existed has none and loads with ``output``, the P_vocab
    it was trained with (:meth:`CopyTransformerModel.build_decoder`)."""
    parser.add_argument(
        "--copy-p-vocab",
        choices=P_VOCAB,
        default="output",
        help="P_vocab of Eq. 4: output: the decoder's output projection of s_t (default; tied with the embeddings "
        "under --share-decoder-input-output-embed or --share-all-embeddings, as fairseq's "
        "transformer_pointer_generator); eq4: the paper's softmax(W'_v (W_v [s_t; c_t] + b) + b'), two linear "
        "layers on the decoder state and the copy context c_t (Eq. 3), W'_v being the decoder's output projection",
    )


def copy_defaults(args):
    """Fill unset copy options: the last layer's attention, its first head, raw alpha (Eq. 6 as
    written).

    A model config saved before ``--copy-alpha`` existed (a checkpoint's: fairseq names it with
    ``_name``, which no command line sets) has no ``copy_alpha``, where every command line has
    the parser's default: its model renormalized alpha over the copyable positions and averaged
    all heads (unless ``--copy-heads`` was given), and is rebuilt so, with the choice written into
    the args (fairseq calls the arch function on a checkpoint's args before building its model,
    and a checkpoint saved from it again records them)."""
    if getattr(args, "copy_layer", None) is None:
        args.copy_layer = -1
    if getattr(args, "_name", None) and not hasattr(args, "copy_alpha"):  # saved before --copy-alpha existed
        args.copy_alpha = "renormalized"
        if getattr(args, "copy_heads", None) is None:
            args.copy_heads = 0
    if getattr(args, "copy_alpha", None) is None:
        args.copy_alpha = "raw"
    if getattr(args, "copy_heads", None) is None:
        args.copy_heads = 1


def dimattn_at_copy_layer(args, copy_layer: int):
    """With ``--dimattn-type``, fill the other ``--dimattn-*`` defaults, diminishing attention
    going to the copy layer (index ``copy_layer`` >= 0) when ``--dimattn-layers`` is left at
    its default: the copy distribution then uses the diminishing weights."""
    dimattn_defaults(args)
    if args.dimattn_layers == "-1":
        args.dimattn_layers = str(copy_layer)


class CopyDecoderMixin:
    """The pointer-generator output for a fairseq ``TransformerDecoderBase`` subclass.

    ``forward`` runs the class's own ``extract_features`` (fairseq's, or EKI's with its
    position indicator) with the copy layer's attention as alignment, then mixes P_vocab and
    the copy distribution (:class:`~fairseq_knowgen.modules.copy_generator.CopyGenerator`,
    Eq. 5-6) and returns the mixture's logits. A subclass calls :meth:`add_copy_head` at the end of its
    ``__init__``; its ``encoder_out`` must carry ``src_tokens``.
    """

    def add_copy_head(
        self,
        cfg,
        dictionary,
        copy_layer: int = -1,
        copy_heads: Optional[int] = 1,
        uncopyable_symbols=(),
        copy_alpha: str = "raw",
        p_vocab: str = "output",
    ):
        """The switch parameters (Eq. 5) and the masks. ``copy_heads``: how many heads of
        ``copy_layer`` the copy attention averages (0 or None: all). ``copy_alpha``: ``raw`` (Eq. 6
        over every non-pad source position) or ``renormalized`` (over the copyable positions
        only). Whatever ``copy_alpha``, ``uncopyable_symbols`` and pad/EOS/BOS/``<unk>`` are not
        copy candidates for the criterion's "w* in X" (see :func:`uncopyable_mask`). ``p_vocab``:
        ``output`` (P_vocab from the output projection of s_t) or ``eq4`` (Eq. 4, adding W_v, b and
        b'; the output projection is W'_v)."""
        if not -len(self.layers) <= copy_layer < len(self.layers):
            raise ValueError(f"--copy-layer {copy_layer} out of range for {len(self.layers)} decoder layers")
        self.copy_layer = copy_layer % len(self.layers)
        if copy_heads is not None and not 0 <= copy_heads <= cfg.decoder.attention_heads:
            raise ValueError(f"--copy-heads must be 'all' or in 1..{cfg.decoder.attention_heads}, got {copy_heads}")
        self.copy_heads = copy_heads or None  # None: fairseq's extract_features averages every head
        if copy_alpha not in COPY_ALPHA:
            raise ValueError(f"--copy-alpha must be one of {', '.join(COPY_ALPHA)}, got {copy_alpha!r}")
        self.copy_alpha = copy_alpha
        if p_vocab == "eq4" and self.adaptive_softmax is not None:
            raise ValueError("--copy-p-vocab eq4 needs the decoder's output projection (no --adaptive-softmax-cutoff)")
        self.copy_generator = CopyGenerator(
            self.output_embed_dim, cfg.encoder.embed_dim, self.embed_dim, p_vocab=p_vocab, vocab_size=len(dictionary)
        )
        uncopyable = uncopyable_mask(dictionary, uncopyable_symbols)
        self.register_buffer("uncopyable", uncopyable, persistent=False)
        # the positions Eq. 6 leaves out: pad only (raw alpha), or every uncopyable one (renormalized)
        outside = uncopyable if copy_alpha == "renormalized" else pad_only_mask(dictionary)
        self.register_buffer("outside_copy", outside, persistent=False)
        self.register_buffer("placeholders", placeholder_mask(dictionary), persistent=False)
        # their ids: P_vocab = 0 is written into these columns only
        self.register_buffer("placeholder_ids", self.placeholders.nonzero().squeeze(1), persistent=False)

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
        """Returns (the mixture's logits ``B x T x V``, extra) where extra holds ``p_gen`` and
        ``p_gen_logit`` (``B x T x 1``), ``copy_attn`` (alpha of Eq. 6, ``B x T x S``),
        ``vocab_lprobs`` (``B x T x V``; not in incremental decoding without gradients, where the
        mixture is written into it), ``copy_support`` (``B x S`` bool, the source positions of
        Eq. 6's sum), ``copyable`` (``B x S`` bool, the copy candidates: the criterion's "w* in
        X"), ``src_tokens`` and ``attn``. In training mode the first output is None (see the
        module docstring)."""
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
        index = self.copy_generator.source_index(src_tokens, self.outside_copy, incremental_state)
        support = index["copyable"]
        copyable = support if self.copy_alpha == "renormalized" else copyable_mask(src_tokens, self.uncopyable)
        eq4 = self.copy_generator.p_vocab == "eq4"
        out = self.copy_generator(
            None if eq4 else self.output_layer(x),  # eq4: from [s_t; c_t], through the output layer
            x,
            input_embed,
            extra["attn"][0],
            enc,
            src_tokens,
            support,
            self.placeholder_ids,
            full=not self.training,
            index=index,
            in_place=incremental_state is not None and not torch.is_grad_enabled(),
            vocab_projection=self.output_layer if eq4 else None,
        )
        for key in ("p_gen", "p_gen_logit", "copy_attn", "vocab_lprobs"):
            if out[key] is not None:
                extra[key] = out[key]
        extra["copy_support"], extra["copyable"], extra["src_tokens"] = support, copyable, src_tokens
        extra["attn"] = [out["copy_attn"]]
        return out["logits"], extra

    def get_normalized_probs(self, net_output, log_probs: bool, sample=None):
        """(Log-)softmax of the first output, the mixture's logits: P(w), or P(w)^(1/T) / Z after
        fairseq's sequence generator divided them by ``--temperature`` T. A training-mode output
        (first output None) gets its mixture computed here from the extras."""
        logits = net_output[0]
        if logits is None:
            e = net_output[1]
            lprobs = full_mixture(
                e["vocab_lprobs"], e["p_gen_logit"], e["copy_attn"], e["src_tokens"], e["copy_support"]
            )
            return lprobs if log_probs else lprobs.exp()
        logits = logits.float()
        return torch.log_softmax(logits, dim=-1) if log_probs else torch.softmax(logits, dim=-1)


class CopyTransformerDecoder(CopyDecoderMixin, TransformerDecoderBase):
    """Transformer decoder with a pointer-generator output (returns log-probabilities)."""

    def __init__(
        self,
        cfg,
        dictionary,
        embed_tokens,
        copy_layer: int = -1,
        copy_heads: Optional[int] = 1,
        copy_alpha="raw",
        p_vocab="output",
    ):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=False)
        self.add_copy_head(cfg, dictionary, copy_layer, copy_heads, copy_alpha=copy_alpha, p_vocab=p_vocab)


@register_model("copy_transformer")
class CopyTransformerModel(PretrainedEncoderMixin, TransformerModel):
    """Transformer + pointer-generator copy head (force-copy paper; See et al., 2017).
    ``--encoder-pretrained``: a released BERT as its encoder (:mod:`.pretrained_encoder`)."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        add_copy_args(parser)
        add_p_vocab_arg(parser)
        add_dimattn_args(parser)
        add_encoder_pretrained_args(parser)

    @classmethod
    def build_model(cls, args, task):
        """fairseq's transformer, after checking that source and target share one dictionary:
        Eq. 6 adds alpha at source ids to P_vocab at target ids, so the two id spaces must be
        the same."""
        src, tgt = task.source_dictionary, task.target_dictionary
        if src is not None and (
            src.symbols != tgt.symbols
            or [src.pad(), src.eos(), src.bos(), src.unk()] != [tgt.pad(), tgt.eos(), tgt.bos(), tgt.unk()]
        ):
            cfg = getattr(task, "cfg", args)  # the task infers the language pair into its cfg
            data = str(getattr(cfg, "data", "DATA")).split(":")[0]
            langs = (getattr(cfg, "source_lang", None) or "SRC", getattr(cfg, "target_lang", None) or "TGT")
            files = [os.path.join(data, f"dict.{lang}.txt") for lang in langs]
            raise ValueError(
                f"{args.arch} needs one dictionary for source and target (the copy head copies source ids "
                f"into the target vocabulary), but {files[0]} has {len(src)} symbols and {files[1]} "
                f"{len(tgt)}, not the same list; preprocess with --joined-dictionary or with the same "
                "--srcdict and --tgtdict"
            )
        return super().build_model(args, task)

    @classmethod
    def build_embedding(cls, args, dictionary, embed_dim, path=None):
        return tie_placeholders(super().build_embedding(args, dictionary, embed_dim, path), dictionary)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        if uses_pretrained_encoder(args):  # BERT's, which keeps src_tokens too
            return super().build_encoder(args, src_dict, embed_tokens)
        return SourceKeepingEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        copy_defaults(args)
        p_vocab = getattr(args, "copy_p_vocab", None) or "output"  # (none in a checkpoint from before the flag)
        decoder = CopyTransformerDecoder(
            cfg, tgt_dict, embed_tokens, args.copy_layer, args.copy_heads, copy_alpha=args.copy_alpha, p_vocab=p_vocab
        )
        if getattr(args, "dimattn_type", None):
            dimattn_at_copy_layer(args, decoder.copy_layer)
            install_diminishing_attention(decoder, args)
        return decoder

    def get_normalized_probs(self, net_output, log_probs: bool, sample=None):
        return self.decoder.get_normalized_probs(net_output, log_probs, sample)


@register_model_architecture("copy_transformer", "copy_transformer")
def copy_transformer_architecture(args):
    copy_defaults(args)
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
