"""fairseq-knowgen: knowledge and content control for neural text generation.

Importing this package (``--user-dir fairseq_knowgen``) registers every model,
architecture, criterion and task it defines with fairseq, and lets torch's weights-only
loader read fairseq checkpoints (see :mod:`fairseq_knowgen.checkpoint_compat`).
"""

from . import checkpoint_compat  # noqa: F401  (must run before any checkpoint is read)
from . import exact_resume  # noqa: F401  (a resumed run trains on the batches of an uninterrupted one)
from . import clean_exit  # noqa: F401  (no abort at exit from fairseq's prefetch thread)
from . import criterions, models, tasks  # noqa: F401

__version__ = "0.1.0"
