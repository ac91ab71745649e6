#!/usr/bin/env python
"""One markdown results table from the recipes' score files.

Every recipe writes ``RUN_DIR/SPLIT[.SUFFIX].scores.json`` (``scripts/evaluate.py --json-out``:
``{"name": {metric: value}}``). A row names one or more run folders (one per seed: the cell
is then ``mean ± std`` over them, with the sample standard deviation); a column is
``SPLIT:METRIC`` (or ``SPLIT.SUFFIX:METRIC`` for e.g. constrained decoding, ``valid.cons``)::

    python scripts/results_table.py \\
        --row "transformer=work/webnlg/runs/transformer-800" \\
        --row "copy force (seeds 1, 2)=work/webnlg/runs/copy-force,work/webnlg/runs/copy-force-s2" \\
        --col "dev BLEU=valid:bleu4" --col "held-out entities=heldout:entity_recall"

A missing file gives ``-`` in its cell, so a table can be printed while runs still go on.
"""

import argparse
import json
import os
import statistics
import sys
from typing import List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fairseq_knowgen.textio import DataError, cli_entry  # noqa: E402


def labelled(spec: str, what: str):
    if "=" not in spec:
        raise DataError(f"--{what}", 0, f"{spec!r}: expected LABEL=VALUE")
    label, value = spec.split("=", 1)
    return label.strip(), value.strip()


def read_metric(run_dir: str, column: str) -> Optional[float]:
    if ":" not in column:
        raise DataError("--col", 0, f"{column!r}: expected SPLIT:METRIC")
    split, metric = column.rsplit(":", 1)
    path = os.path.join(run_dir, f"{split}.scores.json")
    if not os.path.exists(path):
        return None
    try:
        scores = json.load(open(path))
    except json.JSONDecodeError as e:
        raise DataError(path, e.lineno, f"not JSON ({e.msg})")
    values = next(iter(scores.values()), {}) if scores else {}
    value = values.get(metric)
    return None if value is None else float(value)


def cell(values: List[Optional[float]], digits: int) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    if len(got) == 1:
        return f"{got[0]:.{digits}f}"
    return f"{statistics.mean(got):.{digits}f} ± {statistics.stdev(got):.{digits}f}"


def table(rows, cols, digits: int = 2) -> str:
    lines = ["| system | " + " | ".join(label for label, _ in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for label, dirs in rows:
        cells = [cell([read_metric(d, col) for d in dirs], digits) for _, col in cols]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--row", action="append", required=True, help="LABEL=RUN_DIR[,RUN_DIR of another seed ...]")
    p.add_argument("--col", action="append", required=True, help="LABEL=SPLIT:METRIC")
    p.add_argument("--digits", type=int, default=2)
    opts = p.parse_args(argv)
    rows = [(label, [d for d in value.split(",") if d]) for label, value in (labelled(r, "row") for r in opts.row)]
    cols = [labelled(c, "col") for c in opts.col]
    print(table(rows, cols, opts.digits))


if __name__ == "__main__":
    cli_entry(main)
