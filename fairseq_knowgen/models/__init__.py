"""Models of fairseq-knowgen; importing this package registers them with fairseq."""

from . import copy_transformer, dimattn, eki  # noqa: F401
