#!/usr/bin/env python
"""Score generation outputs: see ``fairseq_knowgen/evaluation/cli.py`` or ``--help``."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fairseq_knowgen.evaluation.cli import main  # noqa: E402
from fairseq_knowgen.textio import cli_entry  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli_entry(main))
