"""Models of fairseq-knowgen; importing this package registers them with fairseq."""
from . import dimattn  # noqa: F401
