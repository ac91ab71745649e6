"""The model packages ``fairseq_knowgen.models.eki`` and ``fairseq_knowgen.models.cocon`` (config, encoder,
decoder, model, as fairseq's ``models/transformer/``): every registered arch maps to the package's class, the
package exports what other modules import from it, and a checkpoint of each arch, written as fairseq-train writes
it (``cfg`` and weights), loads through fairseq's loader into the same weights and the same outputs. Checkpoints
store the config and the weights, never a module path, so one written before the split loads as before."""

import pytest
import torch
from checkpoint_helpers import save_checkpoint
from conftest import TINY_BART, TINY_MODEL
from helpers import build_task_and_model, first_batch
from test_cocon import LINES, cocon_data  # noqa: F401  (the fixture: binarized sentences and an untrained LM)

EKI_ARCHS = {"eki_transformer": TINY_MODEL, "eki_bart_base": TINY_BART, "eki_bart_large": TINY_BART}
COCON_ARCHS = ("cocon_lm", "cocon_lm_small")


def test_every_arch_maps_to_the_package():
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_knowgen  # noqa: F401

    for arch in EKI_ARCHS:
        assert ARCH_MODEL_REGISTRY[arch].__module__ == "fairseq_knowgen.models.eki.model", arch
    for arch in COCON_ARCHS:
        assert ARCH_MODEL_REGISTRY[arch].__module__ == "fairseq_knowgen.models.cocon.model", arch


def test_the_packages_export_what_others_import():
    from fairseq_knowgen.models import cocon, eki

    for name in ("eki_defaults", "add_eki_args", "DiminishingPositionIndicatorAttention", "EKITransformerModel"):
        assert name in eki.__all__ and hasattr(eki, name)
    for name in ("SEP", "PROMPT", "CoConSetupError", "default_cocon_layer", "CoConModel"):
        assert name in cocon.__all__ and hasattr(cocon, name)


def reloaded(model, args, path):
    from fairseq import checkpoint_utils

    save_checkpoint(model, args, path)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(path)])
    return models[0].eval(), task


def same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return set(sa) == set(sb) and all(torch.equal(v, sb[k]) for k, v in sa.items())


@pytest.mark.parametrize("arch", sorted(EKI_ARCHS))
def test_eki_checkpoint_loads_into_the_same_model(arch, eki_bin, tmp_path):
    task, model, args = build_task_and_model(eki_bin, arch, *EKI_ARCHS[arch], task="eki_generation")
    model.eval()
    again, _ = reloaded(model, args, tmp_path / "checkpoint.pt")
    assert type(again) is type(model) and same_weights(model, again)
    net_input = first_batch(task)["net_input"]
    with torch.no_grad():
        assert torch.equal(model(**net_input)[0], again(**net_input)[0])


@pytest.mark.parametrize("arch", COCON_ARCHS)
def test_cocon_checkpoint_loads_into_the_same_model(arch, cocon_data, tmp_path):  # noqa: F811
    data, lm = cocon_data
    extra = ["--cocon-lm-path", lm, "--cocon-zero-init", "0", *LINES]
    _, model, args = build_task_and_model(data, arch, *extra, task="cocon_generation")
    model.eval()
    again, _ = reloaded(model, args, tmp_path / "checkpoint.pt")
    assert type(again) is type(model) and same_weights(model, again)
    src, prev = torch.tensor([[4, 5, 6]]), torch.tensor([[2, 7, 8, 9]])
    with torch.no_grad():
        assert torch.equal(model(src, None, prev)[0], again(src, None, prev)[0])
