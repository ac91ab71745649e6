"""Every name this package registers maps to this package's class (fairseq keeps the first
registration of a name silently, so a clash would hide our class)."""

import os
import subprocess
import sys

import pytest
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

import fairseq_knowgen  # noqa: F401

OUR_ARCHS = {
    "transformer_dimattn": "DimAttnTransformerModel",
    "bart_dimattn_base": "DimAttnBARTModel",
    "bart_dimattn_large": "DimAttnBARTModel",
    "copy_transformer": "CopyTransformerModel",
    "copy_transformer_small": "CopyTransformerModel",
    "eki_transformer": "EKITransformerModel",
    "eki_bart_base": "EKIBARTModel",
    "eki_bart_large": "EKIBARTModel",
    "kbert_base": "KBertModel",
    "kbert_small": "KBertModel",
    "kbert_transformer": "KBertTransformerModel",
    "transformer_pretrained_encoder": "PretrainedEncoderTransformerModel",
    "cocon_lm": "CoConModel",
    "cocon_lm_small": "CoConModel",
}
OUR_MODEL_NAMES = {"transformer_dimattn", "bart_dimattn", "copy_transformer", "eki_transformer"}
OUR_MODEL_NAMES |= {"eki_bart", "transformer_pretrained_encoder"}
OUR_CRITERIONS = {
    "force_copy": "ForceCopyCriterion",
    "eki_label_smoothed_cross_entropy": "EKILabelSmoothedCrossEntropyCriterion",
    "kbert_tagging": "KBertTaggingCriterion",
    "cocon": "CoConCriterion",
    "eki_force_copy": "EKIForceCopyCriterion",
}
OUR_TASKS = {"eki_generation": "EKIGenerationTask", "translation_constrained": "TranslationConstrainedTask"}
OUR_TASKS.update({"kbert_classification": "KBertClassificationTask", "kbert_tagging": "KBertTaggingTask"})
OUR_TASKS["cocon_generation"] = "CoConGenerationTask"
OUR_TASKS["kbert_translation"] = "KBertTranslationTask"


@pytest.mark.parametrize("arch,cls", sorted(OUR_ARCHS.items()))
def test_arch_maps_to_our_class(arch, cls):
    model = ARCH_MODEL_REGISTRY[arch]
    assert model.__module__.startswith("fairseq_knowgen.") and model.__name__ == cls


def test_every_registered_model_of_ours_is_listed():
    ours = {a for a, m in ARCH_MODEL_REGISTRY.items() if m.__module__.startswith("fairseq_knowgen.")}
    assert ours == set(OUR_ARCHS)
    assert all(m.__module__.startswith("fairseq_knowgen.") for n, m in MODEL_REGISTRY.items() if n in OUR_MODEL_NAMES)


@pytest.mark.parametrize("name,cls", sorted(OUR_CRITERIONS.items()))
def test_criterion_maps_to_our_class(name, cls):
    from fairseq.criterions import CRITERION_REGISTRY

    crit = CRITERION_REGISTRY[name]
    assert crit.__module__.startswith("fairseq_knowgen.") and crit.__name__ == cls


def test_user_dir_path_works_from_anywhere(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "fairseq_knowgen.user_dir"], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert os.path.isfile(os.path.join(out, "__init__.py"))
    assert os.path.samefile(out, os.path.dirname(fairseq_knowgen.__file__))


@pytest.mark.parametrize("name,cls", sorted(OUR_TASKS.items()))
def test_task_maps_to_our_class(name, cls):
    from fairseq.tasks import TASK_REGISTRY

    task = TASK_REGISTRY[name]
    assert task.__module__.startswith("fairseq_knowgen.") and task.__name__ == cls
