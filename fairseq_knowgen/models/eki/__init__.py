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

The package, as fairseq's ``models/transformer/``: :mod:`.config` (the flags, their defaults and checks),
:mod:`.encoder`, :mod:`.decoder`, :mod:`.model` (the models and their registered architectures).
"""

from .config import EKI_DEFAULTS, EKI_UNCOPYABLE, NEW_PARAMETER_PREFIXES, add_eki_args, eki_defaults
from .decoder import DiminishingPositionIndicatorAttention, EKICopyDecoder, EKIDecoder
from .encoder import EKIBertEncoder, EKIEncoder, EKIEncoderMixin
from .model import (
    EKIBARTModel,
    EKIMixin,
    EKITransformerModel,
    eki_bart_base_architecture,
    eki_bart_large_architecture,
    eki_transformer_architecture,
)

__all__ = [
    "EKI_DEFAULTS",
    "EKI_UNCOPYABLE",
    "NEW_PARAMETER_PREFIXES",
    "add_eki_args",
    "eki_defaults",
    "EKIEncoder",
    "EKIEncoderMixin",
    "EKIBertEncoder",
    "EKIDecoder",
    "EKICopyDecoder",
    "DiminishingPositionIndicatorAttention",
    "EKIMixin",
    "EKITransformerModel",
    "EKIBARTModel",
    "eki_transformer_architecture",
    "eki_bart_base_architecture",
    "eki_bart_large_architecture",
]
