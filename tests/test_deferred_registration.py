"""The package registers its fairseq components once torch is imported, in any import order, and never half-way
through an import; the text tools, which never import torch, do not import it (fairseq_knowgen.compat.deferred_registration).
Each case runs in a fresh interpreter: the import order is what is tested."""

import subprocess
import sys

import pytest
from conftest import ROOT

REGISTERED = (
    "from fairseq.models import ARCH_MODEL_REGISTRY; from fairseq.tasks import TASK_REGISTRY; "
    "from fairseq.criterions import CRITERION_REGISTRY; "
    "assert 'eki_transformer' in ARCH_MODEL_REGISTRY and 'kbert_base' in ARCH_MODEL_REGISTRY; "
    "assert 'eki_generation' in TASK_REGISTRY and 'cocon_generation' in TASK_REGISTRY; "
    "assert 'eki_label_smoothed_cross_entropy' in CRITERION_REGISTRY; "
    "import argparse, torch.serialization; assert argparse.Namespace in torch.serialization.get_safe_globals()"
)


def run_python(code):
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize(
    "imports",
    [
        "import fairseq; import fairseq_knowgen",  # fairseq-train --user-dir fairseq_knowgen
        "import fairseq_knowgen; import fairseq",
        "import fairseq_knowgen; import torch",
        "import torch; import fairseq_knowgen",
        "import fairseq_knowgen; fairseq_knowgen.models",  # an attribute, before anything imported torch
        # a module of the package that imports torch (and fairseq) first: registering in the middle of its import
        # would import it again, half-done (ImportError: partially initialized module)
        "from fairseq_knowgen.models.copy_transformer import placeholder_mask",
        "import fairseq_knowgen.prep.kbert",  # a prep module that needs fairseq's Dictionary
        "from fairseq_knowgen.compat.checkpoint_compat import read_checkpoint",
    ],
)
def test_every_import_order_registers_everything(imports):
    run_python(f"{imports}\n{REGISTERED}")


def test_the_text_tools_import_neither_torch_nor_fairseq():
    tools = [
        "fairseq_knowgen.prep.commongen", "fairseq_knowgen.prep.constraints", "fairseq_knowgen.prep.retrieval",
        "fairseq_knowgen.prep.webnlg", "fairseq_knowgen.prep.entities", "fairseq_knowgen.prep.placeholders",
        "fairseq_knowgen.prep.position_markers", "fairseq_knowgen.prep.cocon", "fairseq_knowgen.evaluation.cli",
    ]  # fmt: skip
    out = run_python(f"import sys\nimport {', '.join(tools)}\nprint(sorted({{'torch', 'fairseq'}} & set(sys.modules)))")
    assert out.strip() == "[]", out
