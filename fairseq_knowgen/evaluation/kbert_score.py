"""Moved to ``scripts/kbert_score.py``: it loads and runs a model, so it is a tool, not a metric.

``python -m fairseq_knowgen.evaluation.kbert_score ARGS`` still runs that script, with the same
command line, until ``examples/kbert/run.sh`` calls ``python scripts/kbert_score.py``; then this
file goes. Nothing may import from it.
"""

import os
import runpy

if __name__ == "__main__":
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "kbert_score.py")
    runpy.run_path(script, run_name="__main__")
else:
    raise ImportError("fairseq_knowgen.evaluation.kbert_score moved to scripts/kbert_score.py")
