"""Criterions of fairseq-knowgen (imported for registration)."""

from . import eki_label_smoothed_cross_entropy, force_copy  # noqa: F401
from . import kbert_tagging  # noqa: F401  (K-BERT)
from . import cocon  # noqa: F401  (CoCon)
