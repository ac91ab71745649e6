"""Checkpoint converters and loaders for released models: one module per source format."""
