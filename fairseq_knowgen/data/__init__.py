"""Datasets of fairseq-knowgen."""
