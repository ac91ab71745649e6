"""Shared evaluation for every recipe: reading outputs, metrics, and the report table."""

from .metrics import (  # noqa: F401
    bleu4,
    cider_d,
    concept_coverage,
    copy_precision_recall,
    coverage_entropy,
    entity_copy,
    novel_ngram_ratio,
    repeated_ngram_rate,
    rouge_l,
)
from .report import evaluate_outputs, format_table  # noqa: F401
