"""``scripts/benchmark.py``'s composed configurations (``--arch BASE+METHOD[+METHOD]``): each
profile resolves, builds its model with the composed modules (copy head, diminishing attention
with EKI's position indicator where both meet) and the matching criterion, is measured against
BASE with the methods off, and one tiny worker step trains and decodes. The expectations are the
table of issue 11 item 6, written here by hand, not read from the profiles."""

import json

import pytest
from conftest import run_cli, tiny_model
from fairseq.criterions import CRITERION_REGISTRY

from benchmarks import harness as benchmarking
from fairseq_knowgen.models.eki import DiminishingPositionIndicatorAttention
from fairseq_knowgen.modules.copy_generator import CopyGenerator
from fairseq_knowgen.modules.diminishing_attention import DiminishingMultiheadAttention
from fairseq_knowgen.modules.position_indicator import PositionIndicatorAttention

PIA, DIM, PLAIN = PositionIndicatorAttention.__name__, DiminishingMultiheadAttention.__name__, "MHA"
BOTH = DiminishingPositionIndicatorAttention.__name__
SIZES = tiny_model(layers=2, dim=16, heads=2)
# name: (data fixture, fairseq arch, criterion, baseline, baseline criterion, copy head?,
#        cross-attention of the 2 decoder layers: EKI's position indicator is in all layers by default,
#        diminishing attention in the last (with --copy: the copy layer, by default the last))
EXPECTED = {
    "eki_transformer+copy": (
        "eki_bin",
        "eki_transformer",
        "eki_force_copy",
        "eki_transformer",
        "eki_label_smoothed_cross_entropy",
        True,
        [PIA, PIA],
    ),
    "eki_transformer+dimattn": (
        "eki_bin",
        "eki_transformer",
        "eki_label_smoothed_cross_entropy",
        "eki_transformer",
        "eki_label_smoothed_cross_entropy",
        False,
        [PIA, BOTH],
    ),
    "eki_transformer+copy+dimattn": (
        "eki_bin",
        "eki_transformer",
        "eki_force_copy",
        "eki_transformer",
        "eki_label_smoothed_cross_entropy",
        True,
        [PIA, BOTH],
    ),
    "copy_transformer_small+dimattn": (
        "tiny_bin",
        "copy_transformer_small",
        "force_copy",
        "copy_transformer_small",
        "force_copy",
        True,
        [PLAIN, DIM],
    ),
}


def layer_kinds(model):
    kinds = []
    for layer in model.decoder.layers:
        a = layer.encoder_attn
        kinds.append(PLAIN if type(a).__module__.startswith("fairseq.") else type(a).__name__)
    return kinds


def test_every_composed_configuration_has_a_profile():
    assert sorted(benchmarking.COMPOSED) == sorted(EXPECTED)
    for name in EXPECTED:
        assert name in benchmarking.PROFILES
    # the plain profiles the composed ones extend are unchanged: no composed flag leaked into them
    assert benchmarking.PROFILES["eki_transformer"]["extra"] == ["--eki-scaling-dim", "64"]
    assert benchmarking.PROFILES["eki_transformer"]["criterion"] == "eki_label_smoothed_cross_entropy"
    assert benchmarking.PROFILES["copy_transformer_small"]["extra"] == []


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_composed_profile_builds_its_model_and_its_baseline(request, name):
    data, arch, criterion, base, base_criterion, copy_head, kinds = EXPECTED[name]
    data_dir = str(request.getfixturevalue(data))
    prof = benchmarking.profile(name)
    assert (prof["name"], prof["arch"], prof["criterion"]) == (name, arch, criterion)

    task, model, crit = benchmarking.build(prof, data_dir, SIZES, max_tokens=200)
    assert isinstance(crit, CRITERION_REGISTRY[criterion])
    assert isinstance(getattr(model.decoder, "copy_generator", None), CopyGenerator) == copy_head
    assert layer_kinds(model) == kinds
    for layer in model.decoder.layers:
        if isinstance(layer.encoder_attn, DiminishingMultiheadAttention):
            assert layer.encoder_attn.dim_type == "dydim"
    if name.startswith("eki_"):
        assert model.encoder.scaling is not None  # the base profile's --eki-scaling-dim 64 is kept
        assert model.encoder.scaling.fc1.out_features == 64

    # the baseline: the base model on the same task and data, every composed method off
    base_prof = benchmarking.baseline_profile(name)
    assert (base_prof["name"], base_prof["arch"], base_prof["criterion"]) == (base, base, base_criterion)
    assert base_prof["task"] == prof["task"]
    _, base_model, base_crit = benchmarking.build(base_prof, data_dir, SIZES, max_tokens=200)
    assert isinstance(base_crit, CRITERION_REGISTRY[base_criterion])
    assert not any(isinstance(m, DiminishingMultiheadAttention) for m in base_model.modules())
    assert hasattr(base_model.decoder, "copy_generator") == name.startswith("copy_transformer")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_composed_profile_trains_and_decodes_one_step(request, name):
    data = str(request.getfixturevalue(EXPECTED[name][0]))
    run = dict(updates=1, gen_sents=1, max_tokens=200, beam=2, gen_len=3)
    res = benchmarking.worker(name, data, SIZES, **run)
    assert (res["profile"], res["arch"]) == (name, EXPECTED[name][1])
    assert res["train_words"] > 0 and res["gen_sents"] >= 1
    base = benchmarking.worker(name, data, SIZES, baseline=True, **run)
    assert (base["profile"], base["arch"]) == (EXPECTED[name][3], EXPECTED[name][3])


def test_against_names_a_composed_profile():
    prof = benchmarking.baseline_profile("eki_transformer", against="eki_transformer+copy")
    assert (prof["name"], prof["arch"], prof["criterion"]) == (
        "eki_transformer+copy",
        "eki_transformer",
        "eki_force_copy",
    )
    assert "--copy" in prof["extra"]


def test_benchmark_cli_measures_a_composed_configuration_against_its_base(eki_bin):
    args = ["--updates", "1", "--gen-sents", "1", "--beam", "2", "--gen-len", "3", "--max-tokens", "200"]
    args += ["--layers", "1", "--embed-dim", "16", "--heads", "2", "--rounds", "1", "--data", eki_bin]
    proc = run_cli("scripts/benchmark.py", "--arch", "eki_transformer+copy+dimattn", *args)
    runs = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    assert sorted(r["profile"] for r in runs) == ["eki_transformer", "eki_transformer+copy+dimattn"]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (summary["arch"], summary["baseline"]) == ("eki_transformer+copy+dimattn", "eki_transformer")
    assert summary["train_wps_ratio"] > 0 and summary["generate_sents_per_s_ratio"] > 0
    # --help lists every composed configuration with its baseline
    help_text = " ".join(run_cli("scripts/benchmark.py", "--help").stdout.split())
    for name, expected in EXPECTED.items():
        assert f"{name} = --arch {expected[1]}" in help_text and f"(vs {expected[3]})" in help_text


def test_unknown_composed_name_is_refused():
    proc = run_cli("scripts/benchmark.py", "--arch", "eki_transformer+nothing", "--quick", check=False)
    assert proc.returncode == 2 and "invalid choice: 'eki_transformer+nothing'" in proc.stderr


def test_vocab_pads_the_synthetic_dictionary_to_a_real_size(tmp_path):
    """--vocab N: the synthetic set's joined dictionary (a few hundred types) becomes N entries, so that costs
    growing with the vocabulary show (the copy head's full mixture hid behind ~300 types)."""
    from fairseq.data import Dictionary

    plain, _ = benchmarking.make_data("triples", str(tmp_path / "plain"), 60, 10)
    padded, _ = benchmarking.make_data("triples", str(tmp_path / "padded"), 60, 10, vocab=1000)
    n_plain = len(Dictionary.load(f"{plain}/dict.src.txt"))
    assert n_plain < 1000 and len(Dictionary.load(f"{padded}/dict.src.txt")) == 1000
    with pytest.raises(ValueError, match="synthetic data only"):
        benchmarking.make_data(
            "fairseq_knowgen.prep.cocon:make_benchmark_data", str(tmp_path / "c"), 10, 10, vocab=1000
        )
