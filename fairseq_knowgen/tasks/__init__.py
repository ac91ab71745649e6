"""Tasks of fairseq-knowgen (imported for registration)."""

from . import eki_generation, translation_constrained  # noqa: F401
from . import kbert  # noqa: F401  (K-BERT)
from . import cocon_generation  # noqa: F401  (CoCon)
from . import kbert_translation  # noqa: F401  (K-BERT generation)
