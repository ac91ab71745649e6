"""CoCon on a frozen fairseq ``transformer_lm`` (Chan et al., "CoCon: A Self-Supervised
Approach for Controlled Text Generation", ICLR 2021).

Architectures ``cocon_lm`` (CoCon FFN as wide as the LM's) and ``cocon_lm_small`` (FFN 2 x d).

- ``--cocon-lm-path``: a fairseq ``transformer_lm`` checkpoint. It is loaded, frozen
  (``requires_grad`` False, so fairseq's optimizer holds no state for it and DDP all-reduces
  nothing of it) and kept in eval mode (no dropout: its states are a fixed function of the text).
  Its dictionary (``--cocon-lm-dict``, default ``dict.txt`` beside the checkpoint, else in the
  checkpoint's own data folder) must equal the task's (the task may append ``<sep>`` and
  ``<prompt>`` after the LM's symbols; they are never fed to the LM).
- ``--cocon-layer l``: the LM's layers ``0..l-1`` are ``enc`` (Eq. 4), run on the text and,
  separately, on each content alone (``</s> c_1 .. c_n``, the LM's own start symbol first; the
  state of ``</s>`` is dropped, so content position j is token c_j); layers ``l..`` with the
  LM's final LayerNorm and output projection are ``dec``. ``0 <= l <= layers``.
- the CoCon block (:mod:`fairseq_knowgen.modules.cocon_block`, Eq. 5-7) sits between them;
  ``--cocon-ffn-dim``, ``--cocon-dropout``, ``--cocon-attention-dropout``, ``--cocon-zero-init``,
  ``--cocon-content-kv {separate,shared}`` and ``--cocon-content-kv-init {fresh,copy}`` (the
  content's own key/value projections, as the authors' code, or the text's; checkpoints saved
  before the flag existed load as ``shared``), ``--cocon-content-prev-key {1,0}`` (content keys
  that also read the previous content column, default 1, beyond the paper; checkpoints saved
  before the flag existed load with 0).
  ``dec`` receives the block's output h' at every position, prompt included (a choice of this
  implementation: Eq. 7 writes ``o~_t = dec([h_{:t-2}; h'_{t-1}])``, the block's output at t-1
  "concatenated to the representations before t-1", so positions before t-1 keep the LM's h:
  with t-1 the end of the prompt x^a, the prompt's earlier positions; read per step, every
  earlier position). With h' everywhere, training, the cycle's generation and fairseq's
  incremental search share one state per position. Under the first reading the two agree when
  x^a is empty (``--cocon-min-prefix 0`` draws such splits) and when decoding from
  the start symbol without a prompt.
- the discriminator of the adversarial loss is the ``cocon`` criterion's, with its own optimizer
  (:mod:`fairseq_knowgen.optim.discriminator_optimizer`); the model holds none. A checkpoint that
  holds one (``discriminator.*``) loads without it.

A checkpoint holds the LM's weights too; building the model (fairseq-generate) still reads
``--cocon-lm-path`` for the LM's configuration (``--model-overrides "{'cocon_lm_path': ...}"``
points it elsewhere).

The encoder is the content encoder: ``src_tokens`` hold one or more contents separated by
``<sep>`` (``</s>`` and padding are ignored); several contents are concatenated (Section 3,
"Multiple Content Inputs"); ``content_tau`` gives one tau per content (the last value repeats).
The decoder decodes incrementally: the content states are computed once by the encoder, the
block caches their keys/values, and each step runs the LM's lower layers, the block and the
upper layers on the new token only (fairseq's incremental state).

Errors in the set-up (missing or unreadable checkpoint, another dictionary, ``--cocon-layer``
outside the LM) raise :class:`CoConSetupError`; the ``cocon_generation`` task turns them into
``error: ...`` and exit status 2.
"""

import os
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.data import Dictionary
from fairseq.models import (
    FairseqEncoder,
    FairseqEncoderDecoderModel,
    FairseqIncrementalDecoder,
    register_model,
    register_model_architecture,
)
from torch import Tensor

from ..modules.cocon_block import CONTENT_KV, CONTENT_KV_INIT, INITS, CoConBlock

SEP, PROMPT = "<sep>", "<prompt>"
PREFIX_STATES = ("lm", "block")


def default_cocon_layer(n_layers: int) -> int:
    """The authors' relative depth: their block reads the output of GPT-2 medium's 7th layer of 24
    (``--output_hidden_for_cocon_after_block_ind 6``), so after round(7/24 x layers) layers, at
    least 1 (a 4-layer LM: 1; GPT-2 small's 12: 4; medium's 24: 7)."""
    return min(n_layers, max(1, round(7 * n_layers / 24))) if n_layers else 0


class CoConSetupError(ValueError):
    """The LM checkpoint or the CoCon flags do not fit (the task exits with status 2)."""


def lm_dictionary_path(lm_path: str, cfg, given: Optional[str]) -> str:
    if given:
        return given
    beside = os.path.join(os.path.dirname(os.path.abspath(lm_path)), "dict.txt")
    if os.path.isfile(beside):
        return beside
    data = None
    try:
        data = cfg["task"]["data"]
    except (KeyError, TypeError):
        pass
    if data:
        p = os.path.join(str(data).split(os.pathsep)[0], "dict.txt")
        if os.path.isfile(p):
            return p
    raise CoConSetupError(
        f"{lm_path}: no dictionary found for this LM (looked for {beside} and its data folder's dict.txt): "
        "give --cocon-lm-dict"
    )


def check_dictionary_prefix(lm_dict: Dictionary, task_dict: Dictionary, lm_dict_path: str):
    n = len(lm_dict)
    if len(task_dict) < n or lm_dict.symbols != task_dict.symbols[:n]:
        m = min(n, len(task_dict))
        i = next((i for i in range(m) if lm_dict.symbols[i] != task_dict.symbols[i]), m)
        what = (
            f"first difference at id {i}: {lm_dict.symbols[i]!r} (LM) vs {task_dict.symbols[i]!r} (data)"
            if i < m
            else f"the LM has {n} symbols, the data {len(task_dict)}"
        )
        raise CoConSetupError(
            f"{lm_dict_path}: the LM's dictionary differs from the data's ({what}): binarize the data with the "
            "LM's dictionary (fairseq-preprocess --srcdict)"
        )


def load_frozen_lm(path: str, task_dict: Dictionary, dict_path: Optional[str] = None):
    """The decoder of a fairseq ``transformer_lm`` checkpoint, frozen and in eval mode."""
    from fairseq import checkpoint_utils
    from fairseq.models.transformer_lm import TransformerLanguageModel
    from fairseq.tasks.language_modeling import LanguageModelingTask

    if not path:
        raise CoConSetupError("--cocon-lm-path is required: a fairseq transformer_lm checkpoint")
    if not os.path.isfile(path):
        raise CoConSetupError(f"{path}: LM checkpoint not found (--cocon-lm-path)")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as e:  # a truncated or foreign file: name it
        raise CoConSetupError(f"{path}: not a readable fairseq checkpoint ({type(e).__name__}: {e})") from None
    cfg = state.get("cfg")
    if cfg is None or "model" not in state:
        raise CoConSetupError(f"{path}: not a fairseq checkpoint (no 'cfg'/'model' entries)")
    dpath = lm_dictionary_path(path, cfg, dict_path)
    lm_dict = Dictionary.load(dpath)
    check_dictionary_prefix(lm_dict, task_dict, dpath)
    lm_task = LanguageModelingTask(cfg.task, lm_dict)
    try:
        lm = lm_task.build_model(cfg.model)
    except Exception as e:
        raise CoConSetupError(f"{path}: cannot build its model ({type(e).__name__}: {e})") from None
    if not isinstance(lm, TransformerLanguageModel):
        raise CoConSetupError(f"{path}: a {type(lm).__name__}, not a transformer_lm checkpoint")
    try:
        lm.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    except RuntimeError as e:
        raise CoConSetupError(f"{path}: its weights do not fit its configuration ({e})") from None
    dec = lm.decoder
    if dec.adaptive_softmax is not None:
        raise CoConSetupError(f"{path}: LMs with an adaptive softmax are not supported")
    for p in dec.parameters():
        p.requires_grad_(False)
    return dec.eval()


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


def lm_activation(lm) -> str:
    """The activation of the LM's FFNs (its layers keep the function, its config the name)."""
    cfg = getattr(lm, "cfg", None)
    name = getattr(cfg, "activation_fn", None) if cfg is not None else None
    return str(name) if name else "relu"


class CoConDecoder(FairseqIncrementalDecoder):
    """The frozen LM's lower layers, the CoCon block, the LM's upper layers (Eq. 4-7).

    ``bypass = True`` skips the block: the decoder is then exactly the frozen LM (the plain and
    the prompted LM baselines decode through it; the ``cocon_generation`` task's ``--cocon-mode lm``).
    """

    def __init__(self, args, dictionary, lm):
        super().__init__(dictionary)
        self.lm = lm
        self.split = args.cocon_layer
        self.embed_dim = lm.embed_dim if lm.project_in_dim is None else lm.project_in_dim.out_features
        heads = lm.layers[0].self_attn.num_heads if len(lm.layers) else args.cocon_attention_heads
        self.block = CoConBlock(
            self.embed_dim,
            args.cocon_attention_heads or heads,
            args.cocon_ffn_dim,
            dropout=args.cocon_dropout,
            attention_dropout=args.cocon_attention_dropout,
            zero_init=bool(args.cocon_zero_init),
            activation=lm_activation(lm),
            content_kv=args.cocon_content_kv,
            content_kv_init=args.cocon_content_kv_init,
            content_prev_key=bool(args.cocon_content_prev_key),
            init=args.cocon_init,
        )
        self.lm_vocab = lm.output_projection.out_features
        self.bypass = False
        self.prefix_states = args.cocon_prefix_states
        # decoding with a fixed length (the task's --cocon-fixed-len): </s> gets no probability before each row's
        # prompt and this many new tokens, whatever step fairseq's search is at (it forces prompts of several
        # lengths for the batch's longest one, and bans </s> only after), and <s> none at all
        self.min_new_tokens = 0
        # marks checkpoints saved since --cocon-prefix-states existed (earlier ones decoded with "block")
        self.register_buffer("cocon_version", torch.tensor(2))
        # training state of the cocon criterion's --cocon-start-after-gap: the update at which the dev gap was reached
        # (-1: not yet), here so that every checkpoint keeps it
        self.register_buffer("gap_reached_at", torch.tensor(-1))

    # -- the LM's pieces ------------------------------------------------------------------
    def embed(
        self,
        tokens: Tensor,
        incremental_state=None,
        token_embeddings: Optional[Tensor] = None,
        new: Optional[int] = None,
    ):
        """The LM's input embedding (as fairseq's ``extract_features``) of the last ``new`` positions
        of ``tokens`` (default: the last one in incremental mode, else all); ``token_embeddings``
        (``B x new x C``, unscaled) replace their lookup (soft tokens). Returns ``new x B x C`` and
        the padding mask of those positions (None without padding)."""
        lm = self.lm
        if new is None:
            new = token_embeddings.size(1) if token_embeddings is not None else (1 if incremental_state else None)
        if new == 1 and incremental_state is not None:
            # fairseq's O(1) position of the one new step
            positions = lm.embed_positions(tokens, incremental_state=incremental_state) if lm.embed_positions else None
        else:
            positions = lm.embed_positions(tokens) if lm.embed_positions else None
        if new is not None:
            tokens = tokens[:, -new:]
            if positions is not None:
                positions = positions[:, -new:]
        if token_embeddings is None:
            # beam search carries -inf candidates, among them the task's extra symbols (<sep>, <prompt>),
            # which the LM has no embedding for: they never win, any embedding will do
            vocab = lm.embed_tokens.num_embeddings
            x = lm.embed_tokens(tokens.masked_fill(tokens >= vocab, lm.dictionary.unk()))
        else:
            x = token_embeddings
        x = lm.embed_scale * x
        if lm.project_in_dim is not None:
            x = lm.project_in_dim(x)
        if positions is not None:
            x = x + positions
        if lm.layernorm_embedding is not None:
            x = lm.layernorm_embedding(x)
        x = lm.dropout_module(x)
        # one new decoding step is never padding (fairseq's search feeds finished rows no more tokens);
        # otherwise the mask, whether or not it marks anything (no host-device sync to find out)
        pad = None if (new == 1 and incremental_state is not None) else tokens.eq(lm.padding_idx)
        return x.transpose(0, 1), pad

    def run_layers(self, x: Tensor, layers, incremental_state=None, padding_mask: Optional[Tensor] = None):
        # causal mask whenever several positions come at once (also the first incremental call
        # with a whole prefix: fairseq passes none in incremental mode, assuming one step)
        mask = self.lm.buffered_future_mask(x) if x.size(0) > 1 else None
        for layer in layers:
            x, _, _ = layer(x, None, None, incremental_state, self_attn_mask=mask, self_attn_padding_mask=padding_mask)
        return x

    def lower(
        self,
        tokens: Tensor,
        incremental_state=None,
        token_embeddings: Optional[Tensor] = None,
        new=None,
        padding_mask: bool = True,
    ):
        """``enc``: the states after layer ``l`` of the last ``new`` positions (see :meth:`embed`;
        ``T x B x C``) and their padding mask. ``padding_mask=False`` for right-padded rows: under
        the causal mask no real position sees a later pad, so the states of real positions are the
        same without it (and torch's attention takes its fast path)."""
        x, pad = self.embed(tokens, incremental_state, token_embeddings, new)
        return self.run_layers(x, self.lm.layers[: self.split], incremental_state, pad if padding_mask else None), pad

    def upper(self, h: Tensor, incremental_state=None, padding_mask: Optional[Tensor] = None) -> Tensor:
        """``dec`` up to the features: layers ``l..``, final LayerNorm; ``B x T x C``."""
        x = self.run_layers(h, self.lm.layers[self.split :], incremental_state, padding_mask)
        if self.lm.layer_norm is not None:
            x = self.lm.layer_norm(x)
        x = x.transpose(0, 1)
        if self.lm.project_out_dim is not None:
            x = self.lm.project_out_dim(x)
        return x

    def lm_logits(self, features: Tensor) -> Tensor:
        """Logits over the LM's vocabulary only (training)."""
        return self.lm.output_projection(features)

    def encode_content_tensor(self, content: Tensor):
        """Lower-layer states of right-padded contents ``B x L`` (no ``</s>``), each run alone
        after ``</s>``: ``L x B x C`` and the ``B x L`` padding mask."""
        eos = self.lm.dictionary.eos()
        toks = torch.cat([content.new_full((content.size(0), 1), eos), content], dim=1)
        h, _ = self.lower(toks, padding_mask=False)  # right-padded
        return h[1:], content.eq(self.lm.padding_idx)

    def encode_contents(self, contents: List[List[int]], device, soft: Optional[Tensor] = None):
        """Lower-layer states of contents run alone: ``N x Lmax x C`` and the ``N x Lmax``
        padding mask. Each content is preceded by ``</s>`` (the LM's start), whose state is
        dropped. ``soft`` (``N x L x C`` unscaled embeddings, e.g. softmax-weighted) replaces the
        token lookup of every content position (then ``contents`` is ignored)."""
        eos, pad = self.lm.dictionary.eos(), self.lm.padding_idx
        if soft is not None:
            N, L = soft.shape[:2]
            toks = torch.full((N, L + 1), eos, dtype=torch.long, device=device)
            bos = self.lm.embed_tokens(toks[:, :1])
            h, _ = self.lower(toks, token_embeddings=torch.cat([bos, soft], dim=1))
            return h[1:].transpose(0, 1), torch.zeros(N, L, dtype=torch.bool, device=device)
        Lmax = max(len(c) for c in contents)
        toks = torch.full((len(contents), Lmax + 1), pad, dtype=torch.long)
        toks[:, 0] = eos
        for i, c in enumerate(contents):
            toks[i, 1 : len(c) + 1] = torch.tensor(c, dtype=torch.long)
        toks = toks.to(device)
        h, _ = self.lower(toks, padding_mask=False)  # right-padded
        return h[1:].transpose(0, 1), toks[:, 1:].eq(pad)

    # -- fairseq decoder interface --------------------------------------------------------
    def with_prefix_states(self, h: Tensor, h_block: Tensor, prefix_len, start: int = 0) -> Tensor:
        """What ``dec`` receives (Eq. 7, ``o~_t = dec([h_{:t-2}; h'_{t-1}])``): at positions before
        ``prefix_len`` (an int or ``B`` per row: positions 0 .. prefix_len - 1 hold ``</s>`` and the
        prefix but its last token) the LM's own states ``h``, from the prefix's last token on the
        block's ``h_block`` (``T x B x C``, positions ``start`` ..). With ``--cocon-prefix-states
        block`` (or no prefix length) ``h_block`` everywhere."""
        if self.prefix_states != "lm" or prefix_len is None:
            return h_block
        pos = torch.arange(start, start + h.size(0), device=h.device)[:, None]  # T x 1
        keep = pos < (prefix_len[None, :] if torch.is_tensor(prefix_len) else prefix_len)
        return torch.where(keep.unsqueeze(-1), h, h_block)

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs):
        h, pad = self.lower(prev_output_tokens, incremental_state)
        if not self.bypass:
            content = mask = bias = rows = None
            cached = incremental_state is not None and self.block.attn.get_incremental_state(incremental_state, "cocon")
            if encoder_out is not None and not cached:  # after the first step the block has the content's K/V
                content = encoder_out["content"][0]
                mask, bias = encoder_out["content_padding_mask"][0], encoder_out["content_bias"][0]
                rows = encoder_out["content_rows"][0]
            h_block, _ = self.block(h, content, mask, bias, incremental_state=incremental_state, content_rows=rows)
            prompt = encoder_out.get("prompt_lengths") if encoder_out is not None else None
            start = prev_output_tokens.size(1) - h.size(0)  # the first new position (incremental: the last)
            h = self.with_prefix_states(h, h_block, prompt[0] if prompt else None, start)
        return self.upper(h, incremental_state, pad), {"attn": [None]}

    def output_layer(self, features):
        """The LM's logits, widened with -inf for the task's extra symbols (``<sep>``, ``<prompt>``)."""
        logits = self.lm_logits(features)
        extra = len(self.dictionary) - logits.size(-1)
        return F.pad(logits, (0, extra), value=float("-inf")) if extra > 0 else logits

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, features_only=False, **kwargs):
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        if features_only:
            return x, extra
        logits = self.output_layer(x)
        if self.min_new_tokens and encoder_out is not None:
            prompt = encoder_out.get("prompt_lengths")
            lengths = prompt[0] if prompt else torch.zeros(x.size(0), dtype=torch.long, device=x.device)
            start = prev_output_tokens.size(1) - x.size(1)
            pos = torch.arange(start, start + x.size(1), device=x.device)[None, :]  # the output token each predicts
            early = pos < (lengths[:, None] + self.min_new_tokens)  # B x T
            eos = self.dictionary.eos()
            logits[:, :, eos] = logits[:, :, eos].masked_fill(early, float("-inf"))
            # nor <s> anywhere: the LM never saw it in its text, and fairseq prints it as nothing, so an output with
            # one would read a token short of the fixed length
            logits[:, :, self.dictionary.bos()] = float("-inf")
        return logits, extra

    def max_positions(self):
        return self.lm.max_positions()


@register_model("cocon_lm")
class CoConModel(FairseqEncoderDecoderModel):
    """CoCon: the content encoder (LM lower layers on the content) and the CoCon decoder; see
    the module docstring."""

    def __init__(self, args, encoder, decoder):
        super().__init__(encoder, decoder)
        self.args = args

    @staticmethod
    def add_args(parser):
        parser.add_argument("--cocon-lm-path", type=str, metavar="PT", help="frozen fairseq transformer_lm checkpoint")
        parser.add_argument(
            "--cocon-lm-dict", type=str, metavar="TXT", help="its dictionary (default: dict.txt beside it)"
        )
        parser.add_argument(
            "--cocon-layer",
            type=int,
            metavar="L",
            help="the block sits after LM layer L (0 <= L <= layers); default: round(7/24 x layers), the authors' "
            "relative depth (after layer 7 of GPT-2 medium's 24)",
        )
        parser.add_argument("--cocon-ffn-dim", type=int, metavar="N", help="inner size of the block's FFN")
        parser.add_argument(
            "--cocon-attention-heads", type=int, metavar="N", help="heads of the block (default: the LM's)"
        )
        parser.add_argument("--cocon-dropout", type=float, metavar="P", help="dropout in the block")
        parser.add_argument(
            "--cocon-attention-dropout", type=float, metavar="P", help="attention dropout (default 0.1, the authors')"
        )
        parser.add_argument(
            "--cocon-init",
            choices=INITS,
            help="the block's weights: xavier (default; measured better on the toy copy task: docs/methods/cocon.md) "
            "or normal (N(0, 0.02^2), the authors' GPT-2 initializer)",
        )
        parser.add_argument(
            "--cocon-zero-init",
            type=int,
            choices=[0, 1],
            help="1: the block's output projections start at zero (CoCon starts as the LM, but no gradient reaches "
            "the attention until W_o has grown: in the toy probe it learned to read its content within 800 updates "
            "at one seed of three); default 0",
        )
        parser.add_argument(
            "--cocon-content-kv",
            choices=CONTENT_KV,
            help="content keys/values: separate (their own projections on the raw content states, as the "
            "authors' code; default) or shared (the text's projections and LayerNorm)",
        )
        parser.add_argument(
            "--cocon-content-kv-init",
            choices=CONTENT_KV_INIT,
            help="separate content K/V start fresh (default) or as copies of the text's",
        )
        parser.add_argument(
            "--cocon-content-prev-key",
            type=int,
            choices=[0, 1],
            help="1: each content key also reads the previous content column (K_j += h_{j-1} W', W' starting at "
            "zero; beyond the paper and the authors' code), where the query may see that column; 0 (default): "
            "the authors' keys",
        )
        parser.add_argument(
            "--cocon-prefix-states",
            choices=PREFIX_STATES,
            help="what the upper layers read before the prefix's (prompt's) last token: lm (the LM's own states, as "
            "Eq. 7 and the authors; default) or block (the block's output at every position: this package's "
            "earlier choice, which checkpoints saved before the flag keep)",
        )

    @classmethod
    def build_model(cls, args, task):
        cocon_lm_architecture(args)
        lm = load_frozen_lm(args.cocon_lm_path, task.target_dictionary, args.cocon_lm_dict)
        n = len(lm.layers)
        if args.cocon_layer is None:  # the authors' relative depth, recorded in the checkpoint's args
            args.cocon_layer = default_cocon_layer(n)
        if not 0 <= args.cocon_layer <= n:
            raise CoConSetupError(
                f"--cocon-layer {args.cocon_layer} is outside the LM {args.cocon_lm_path} (it has {n} layers: "
                f"0 <= L <= {n})"
            )
        dim = lm.embed_dim if lm.project_in_dim is None else lm.project_in_dim.out_features
        if args.cocon_ffn_dim is None:
            mult = getattr(args, "cocon_ffn_mult", None)
            args.cocon_ffn_dim = mult * dim if mult else (lm.layers[0].fc1.out_features if n else 4 * dim)
        decoder = CoConDecoder(args, task.target_dictionary, lm)
        encoder = CoConEncoder(task.source_dictionary, decoder)
        return cls(args, encoder, decoder)

    def forward(
        self, src_tokens, src_lengths, prev_output_tokens, content_tau=None, prompt_lengths=None, cocon_loss=None, **kwargs
    ):
        """The decoder's output for ``prev_output_tokens`` given the contents in ``src_tokens``;
        with ``cocon_loss`` (the ``cocon`` criterion's), that function of this model instead, so
        that a DDP wrapper sees the whole loss computation in one forward."""
        if cocon_loss is not None:
            return cocon_loss(self)
        encoder_out = self.encoder(
            src_tokens, src_lengths=src_lengths, content_tau=content_tau, prompt_lengths=prompt_lengths
        )
        return self.decoder(prev_output_tokens, encoder_out=encoder_out)

    def train(self, mode: bool = True):
        """The frozen LM always stays in eval mode (its states are a fixed function)."""
        super().train(mode)
        self.decoder.lm.eval()
        return self

    def upgrade_state_dict_named(self, state_dict, name):
        """A checkpoint saved before ``--cocon-content-kv`` existed has no content key/value projections:
        its block used the text's (``shared``); one saved before ``--cocon-content-prev-key`` has no
        W' (its keys read one column). The block is switched to that before the weights load (and the
        flags recorded, so that a checkpoint saved again says so)."""
        prefix = (name + "." if name else "") + "decoder.block.attn."
        has_text = prefix + "k_proj.weight" in state_dict
        has_content = any(k.startswith(prefix + "content_k_proj.") for k in state_dict)
        if has_text and not has_content and self.decoder.block.attn.content_kv_mode == "separate":
            self.decoder.block.attn.share_content_kv()
            self.args.cocon_content_kv = "shared"
        has_prev = any(k.startswith(prefix + "content_prev_k_proj.") for k in state_dict)
        if has_text and not has_prev and hasattr(self.decoder.block.attn, "content_prev_k_proj"):
            self.decoder.block.attn.drop_content_prev_key()
            self.args.cocon_content_prev_key = 0
        # a checkpoint saved before --cocon-prefix-states existed decoded with the block's states everywhere
        version = (name + "." if name else "") + "decoder.cocon_version"
        if version not in state_dict:
            state_dict[version] = self.decoder.cocon_version.clone()
            self.decoder.prefix_states = self.args.cocon_prefix_states = "block"
        gap = (name + "." if name else "") + "decoder.gap_reached_at"
        if gap not in state_dict:
            state_dict[gap] = torch.tensor(-1)
        # a checkpoint whose model held the discriminator: it is the criterion's now
        disc_prefix = (name + "." if name else "") + "discriminator."
        for k in [k for k in state_dict if k.startswith(disc_prefix)]:
            del state_dict[k]
        super().upgrade_state_dict_named(state_dict, name)

    def trainable_parameters(self):
        return [p for p in self.parameters() if p.requires_grad]

    def max_positions(self):
        # one number for source (content) and output alike: both go through the LM's positions
        return self.decoder.max_positions()


@register_model_architecture("cocon_lm", "cocon_lm")
def cocon_lm_architecture(args):
    args.cocon_lm_path = getattr(args, "cocon_lm_path", None)
    args.cocon_lm_dict = getattr(args, "cocon_lm_dict", None)
    args.cocon_layer = getattr(args, "cocon_layer", None)  # None: default_cocon_layer of the LM (build_model)
    args.cocon_ffn_dim = getattr(args, "cocon_ffn_dim", None)
    args.cocon_attention_heads = getattr(args, "cocon_attention_heads", None)
    args.cocon_dropout = getattr(args, "cocon_dropout", None)
    if args.cocon_dropout is None:
        args.cocon_dropout = 0.1
    ad = getattr(args, "cocon_attention_dropout", None)
    args.cocon_attention_dropout = 0.1 if ad is None else ad
    args.cocon_init = getattr(args, "cocon_init", None) or "xavier"
    zi = getattr(args, "cocon_zero_init", None)
    args.cocon_zero_init = 0 if zi is None else zi
    # the discriminator is the cocon criterion's (its config reads these from the same namespace)
    args.cocon_disc_dim = getattr(args, "cocon_disc_dim", None) or 128
    args.cocon_prefix_states = getattr(args, "cocon_prefix_states", None) or "lm"
    # (a checkpoint saved before the flag existed is turned to "shared" as it loads: upgrade_state_dict_named)
    args.cocon_content_kv = getattr(args, "cocon_content_kv", None) or "separate"
    args.cocon_content_kv_init = getattr(args, "cocon_content_kv_init", None) or "fresh"
    # (a checkpoint saved before this flag existed has no W': upgrade_state_dict_named turns it off as it loads)
    prev_key = getattr(args, "cocon_content_prev_key", None)
    args.cocon_content_prev_key = 0 if prev_key is None else prev_key


@register_model_architecture("cocon_lm", "cocon_lm_small")
def cocon_lm_small_architecture(args):
    """The block's FFN 2 x d wide (instead of the LM's), the discriminator 64 wide."""
    args.cocon_disc_dim = getattr(args, "cocon_disc_dim", None) or 64
    args.cocon_ffn_mult = 2  # used when --cocon-ffn-dim is not given
    cocon_lm_architecture(args)
