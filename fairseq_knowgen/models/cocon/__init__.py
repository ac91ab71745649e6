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
  before the flag existed load as ``shared``), ``--cocon-content-prev-key {0,1}`` (content keys
  that also read the previous content column: off by default (0), beyond the paper and the
  authors' code; checkpoints saved before the flag existed load with 0).
- ``--cocon-prefix-states {lm,block}``: what ``dec`` reads before the prompt's last token. Eq. 7
  writes ``o~_t = dec([h_{:t-2}; h'_{t-1}])``, the block's output at t-1 "concatenated to the
  representations before t-1": with ``lm`` (default, as Eq. 7 and the authors' code) the positions
  before the prompt's last token keep the LM's own states h and the block's output h' is read from
  there on, in training, in the cycle and in decoding (per row of a batch); ``block`` feeds h' at
  every position, prompt included (checkpoints saved before the flag existed load with it). The two
  agree when the prompt is empty (``--cocon-min-prefix 0`` draws such splits) and when decoding
  from the start symbol without a prompt.
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

The package, as fairseq's ``models/transformer/``: :mod:`.config` (symbols, choices, the block's default depth,
the set-up error), :mod:`.lm` (the frozen LM), :mod:`.encoder` (contents), :mod:`.decoder` (LM, block, LM) and
:mod:`.model` (the model, its flags and its registered architectures).
"""

from .config import PREFIX_STATES, PROMPT, SEP, CoConSetupError, default_cocon_layer
from .decoder import CoConDecoder
from .encoder import CoConEncoder
from .lm import load_frozen_lm
from .model import CoConModel, cocon_lm_architecture, cocon_lm_small_architecture

__all__ = [
    "SEP",
    "PROMPT",
    "PREFIX_STATES",
    "CoConSetupError",
    "default_cocon_layer",
    "load_frozen_lm",
    "CoConEncoder",
    "CoConDecoder",
    "CoConModel",
    "cocon_lm_architecture",
    "cocon_lm_small_architecture",
]
