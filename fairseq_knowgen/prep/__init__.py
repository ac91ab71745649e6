"""Data preparation for the recipes in ``examples/`` (raw data set files -> text for fairseq)."""
