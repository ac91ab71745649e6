"""Models of fairseq-knowgen; importing this package registers them with fairseq."""

from . import copy_transformer, dimattn, eki  # noqa: F401
from . import kbert, kbert_transformer  # noqa: F401  (K-BERT)
from . import pretrained_encoder  # noqa: F401  (--encoder-pretrained; transformer_pretrained_encoder)
from . import cocon  # noqa: F401  (CoCon)
from . import fairseq_pointer_generator  # noqa: F401  (fairseq's transformer_pointer_generator, the copy peer)
