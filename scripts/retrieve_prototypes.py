#!/usr/bin/env python
"""Retrieve a prototype sentence per concept set: see fairseq_knowgen/prep/retrieval.py or --help."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fairseq_knowgen.prep.retrieval import main  # noqa: E402
from fairseq_knowgen.textio import cli_entry  # noqa: E402

if __name__ == "__main__":
    cli_entry(main)
