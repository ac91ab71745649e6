"""Speed and memory of an architecture against fairseq's ``transformer`` of the same size.

``scripts/benchmark.py`` is the command line. Both models train and decode the same data
in separate worker processes (so each has its own peak RSS), interleaved A B B A ... so
that a slow period of the machine hits both, with one thread each (``OMP_NUM_THREADS=1``).
Reported ratios are arch / baseline: 1.0 is parity, higher is faster.

The profiles (task, criterion, data of each architecture) are in :mod:`benchmarks.profiles`.
"""

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

from .profiles import (  # noqa: F401  (PROFILES and the rest, for scripts/benchmark.py)
    BASELINE,
    BASELINE_PROFILE,
    COMPOSED,
    COMPOSED_FLAGS,
    COPY_CRITERION,
    PROFILES,
    REAL_SETS,
    SIDES,
    _function,
    baseline_profile,
    composed_profile,
    describe,
    make_data,
    make_synthetic_data,
    profile,
    real_pairs,
    size_args,
)


def build(prof: Dict, data: str, model_args: List[str], max_tokens: int = 2048, device: str = "cpu"):
    """``(task, model, criterion)`` of profile ``prof`` (:func:`profile`, :func:`baseline_profile`)
    on ``data`` (train and valid loaded), with ``model_args`` after the profile's own arguments."""
    from fairseq import options, tasks

    import fairseq_knowgen  # noqa: F401

    if "data_extra" in prof:
        model_args = _function(prof["data_extra"])(data) + list(model_args)
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            data,
            "--task",
            prof["task"],
            "--arch",
            prof["arch"],
            "--criterion",
            prof["criterion"],
            *(["--cpu"] if device == "cpu" else []),
            "--seed",
            "1",
            "--max-tokens",
            str(max_tokens),
            *prof["extra"],
            *model_args,
        ],
    )
    task = tasks.setup_task(args)
    task.load_dataset("train")
    task.load_dataset("valid")
    return task, task.build_model(args), task.build_criterion(args)


def worker(
    arch: str,
    data: str,
    model_args: List[str],
    updates: int,
    gen_sents: int,
    max_tokens: int,
    beam: int,
    gen_len: int = 20,
    baseline: bool = False,
    against: Optional[str] = None,
    device: str = "cpu",
) -> Dict:
    """Train ``arch`` (when ``baseline``: the model of :func:`baseline_profile` of ``arch`` and
    ``against``) ``updates`` steps and decode ``gen_sents`` valid sentences (unless the profile
    says ``generate: False``); return timings.
    Training goes through ``task.train_step``, so tasks that update more than one module per
    step (a discriminator) are timed whole."""
    import torch
    from fairseq import utils

    torch.set_num_threads(1)
    from fairseq.dataclass.configs import GenerationConfig

    prof = baseline_profile(arch, against) if baseline else profile(arch)
    task, model, criterion = build(prof, data, model_args, max_tokens, device)
    model.to(device)
    criterion.to(device)
    cuda = device == "cuda"

    def clock():  # the timed regions end when the device has finished (CUDA runs asynchronously)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    class Backward:  # the one optimizer method task.train_step calls
        @staticmethod
        def backward(loss):
            loss.backward()

    batches = task.get_batch_iterator(
        task.dataset("train"), max_tokens=max_tokens, seed=1, ignore_invalid_inputs=True
    ).next_epoch_itr(shuffle=True)
    batches = [utils.move_to_cuda(b) if cuda else b for b in batches]

    def step(sample, update_num):
        task.train_step(sample, model, criterion, Backward, update_num)
        opt.step()
        opt.zero_grad()
        return sample["ntokens"]

    model.train()
    for i in range(3):  # warm-up, not timed
        step(batches[i % len(batches)], i)
    words, t0 = 0, clock()
    for i in range(updates):
        words += step(batches[(i + 3) % len(batches)], i + 3)
    train_s = clock() - t0
    result = {
        "arch": prof["arch"],
        "profile": prof.get("name", prof["arch"]),
        "train_words": int(words),
        "train_s": train_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if cuda:
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    if not prof.get("generate", True):
        return result

    model.eval()
    # an untrained model would stop at once: fix the output length so both models decode
    # the same number of steps (a typical sentence length of the data sets here)
    generator = task.build_generator(
        [model], GenerationConfig(beam=beam, min_len=gen_len, max_len_a=0, max_len_b=gen_len)
    )
    gen_batches = list(
        task.get_batch_iterator(task.dataset("valid"), max_sentences=32, ignore_invalid_inputs=True).next_epoch_itr(
            shuffle=False
        )
    )
    gen_batches = [utils.move_to_cuda(b) if cuda else b for b in gen_batches]
    with torch.no_grad():
        task.inference_step(generator, [model], gen_batches[0])  # warm-up
        sents, t0 = 0, clock()
        for b in gen_batches:
            if sents >= gen_sents:
                break
            task.inference_step(generator, [model], b)
            sents += b["nsentences"]
        gen_s = clock() - t0
    result.update(gen_sents=sents, gen_s=gen_s)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def worker_core(opts) -> int:
    """The one core every worker runs on: ``--core``, else the first this process may use."""
    core = getattr(opts, "core", None)
    return min(os.sched_getaffinity(0)) if core is None else core


def run_worker_process(script: str, baseline: bool, opts) -> Dict:
    cmd = [
        sys.executable,
        script,
        "--worker",
        "--arch",
        opts.arch,
        "--data",
        opts.data,
        "--updates",
        str(opts.updates),
        "--gen-sents",
        str(opts.gen_sents),
        "--max-tokens",
        str(opts.max_tokens),
        "--beam",
        str(opts.beam),
        "--gen-len",
        str(opts.gen_len),
        "--layers",
        str(opts.layers),
        "--embed-dim",
        str(opts.embed_dim),
        "--heads",
        str(opts.heads),
    ]
    if opts.model_args:
        cmd += ["--model-args", opts.model_args]
    if opts.data_args:
        cmd += ["--data-args", json.dumps(opts.data_args)]
    if baseline:
        cmd += ["--baseline"]
    if getattr(opts, "against", None):
        cmd += ["--against", opts.against]
    cmd += ["--device", getattr(opts, "device", "cpu")]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    core = worker_core(opts)
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, preexec_fn=lambda: os.sched_setaffinity(0, {core})
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"benchmark worker ({'baseline of ' if baseline else ''}{opts.arch}) failed:\n{proc.stderr[-4000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def profile_data(opts):
    """Unless ``--data`` was given, make ``--arch``'s profile data in a temporary folder and set ``opts.data``,
    ``opts.data_args``; returns that folder (to clean up) or None. With ``--size`` a profile with its own data
    keeps its own (no vocabulary padding, no real set) but gets the preset's sizes (CoCon's frozen LM)."""
    if opts.data:
        return None
    kind = PROFILES[opts.arch].get("data", "triples")
    sized = getattr(opts, "size", None)
    if ":" in kind and sized:
        opts.vocab, opts.real = 0, None
    own_tmp = tempfile.TemporaryDirectory(prefix="knowgen-bench-")
    opts.data, opts.data_args = make_data(
        kind,
        own_tmp.name,
        opts.n_train,
        opts.n_valid,
        getattr(opts, "vocab", 0),
        getattr(opts, "real", None),
        (opts.layers, opts.embed_dim, opts.heads) if sized else None,
    )
    return own_tmp


def compare(script: str, opts) -> Dict:
    """Interleave workers A B B A (x rounds/2) and return the summary dict."""
    own_tmp = profile_data(opts)
    runs = {"arch": [], "base": []}
    order = []
    for r in range(opts.rounds):
        order += ["arch", "base"] if r % 2 == 0 else ["base", "arch"]
    for role in order:
        res = run_worker_process(script, role == "base", opts)
        runs[role].append(res)
        print(json.dumps(res), file=sys.stderr)
    if own_tmp is not None:
        own_tmp.cleanup()

    def rates(rs):
        gen = [r for r in rs if "gen_s" in r]
        return (
            sum(r["train_words"] for r in rs) / sum(r["train_s"] for r in rs),
            sum(r["gen_sents"] for r in gen) / sum(r["gen_s"] for r in gen) if gen else None,
            max(r["peak_rss_mb"] for r in rs),
        )

    base = baseline_profile(opts.arch, getattr(opts, "against", None))
    a_wps, a_sps, a_rss = rates(runs["arch"])
    b_wps, b_sps, b_rss = rates(runs["base"])
    train, gen = round_ratios(runs["arch"], runs["base"])
    out = {
        "arch": opts.arch,
        "baseline": base.get("name", base.get("arch", BASELINE)),
        # the median over rounds of arch / baseline measured in the same round
        "train_wps_ratio": round(median(train), 4),
        "generate_sents_per_s_ratio": round(median(gen), 4) if gen else None,
        "train_wps_ratio_range": [round(min(train), 4), round(max(train), 4)],
        "generate_sents_per_s_ratio_range": [round(min(gen), 4), round(max(gen), 4)] if gen else None,
        "peak_rss_mb": round(a_rss, 1),
        "baseline_peak_rss_mb": round(b_rss, 1),
        "train_wps": round(a_wps, 1),
        "baseline_train_wps": round(b_wps, 1),
        "generate_sents_per_s": round(a_sps, 3) if a_sps else None,
        "baseline_generate_sents_per_s": round(b_sps, 3) if b_sps else None,
        "beam": opts.beam,
        "rounds": opts.rounds,
        "core": worker_core(opts),
        "device": getattr(opts, "device", "cpu"),
    }
    if all("peak_cuda_mb" in r for r in runs["arch"] + runs["base"]):
        out["peak_cuda_mb"] = round(max(r["peak_cuda_mb"] for r in runs["arch"]), 1)
        out["baseline_peak_cuda_mb"] = round(max(r["peak_cuda_mb"] for r in runs["base"]), 1)
    return out


def saved_for_backward_bytes(model, criterion, sample) -> Dict[str, int]:
    """Bytes of one training step, counted from the tensors themselves: what autograd keeps for backward
    (every tensor packed by ``torch.autograd.graph.saved_tensors_hooks``, each storage once, parameters
    left out: they exist anyway), and the parameters with their gradients and Adam's two moments
    (4 x the trainable parameters, plus the frozen ones once). Exact on any device, unlike the process's
    peak RSS, which at 50,000 types is dominated by the output layer and the allocator."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: Dict[int, int] = {}

    def pack(t):
        if t.device.type != "meta":
            ptr = t.untyped_storage().data_ptr()
            if ptr not in params:
                seen[ptr] = t.untyped_storage().nbytes()
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _, _ = criterion(model, sample)
    loss.backward()
    model.zero_grad(set_to_none=True)
    nbytes = lambda ps: sum(p.numel() * p.element_size() for p in ps)  # noqa: E731
    trainable = nbytes(p for p in model.parameters() if p.requires_grad)
    frozen = nbytes(p for p in model.parameters() if not p.requires_grad)
    return {"saved_bytes": sum(seen.values()), "state_bytes": 4 * trainable + frozen}


def training_memory(opts) -> Dict:
    """``--memory``: :func:`saved_for_backward_bytes` of ``--arch`` and of its baseline on the same first
    training batch (``--max-tokens``), and their ratios."""
    import shlex

    import torch

    torch.manual_seed(1)
    own_tmp = profile_data(opts)
    out = {"arch": opts.arch, "max_tokens": opts.max_tokens}
    for role, prof in (("arch", profile(opts.arch)), ("baseline", baseline_profile(opts.arch, opts.against))):
        args = size_args(opts.layers, opts.embed_dim, opts.heads, sizes=prof.get("sizes", "seq2seq"))
        args += opts.data_args.get("arch" if role == "arch" else "baseline", [])
        if role == "arch":
            args += shlex.split(opts.model_args)
        task, model, crit = build(prof, opts.data, args, opts.max_tokens)
        sample = next(iter(task.get_batch_iterator(task.dataset("train"), max_tokens=opts.max_tokens, seed=1)
                           .next_epoch_itr(shuffle=False)))  # fmt: skip
        res = saved_for_backward_bytes(model, crit, sample)
        out[f"{role}_profile"] = prof.get("name", prof["arch"])
        out[f"{role}_saved_mb"] = round(res["saved_bytes"] / 2**20, 1)
        out[f"{role}_total_mb"] = round((res["saved_bytes"] + res["state_bytes"]) / 2**20, 1)
        out[f"{role}_ntokens"] = int(sample["ntokens"])
    if own_tmp is not None:
        own_tmp.cleanup()
    out["saved_ratio"] = round(out["arch_saved_mb"] / out["baseline_saved_mb"], 3)
    out["total_ratio"] = round(out["arch_total_mb"] / out["baseline_total_mb"], 3)
    return out


def median(xs: List[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def round_ratios(arch_runs: List[Dict], base_runs: List[Dict]) -> Tuple[List[float], List[float]]:
    """Per round, arch / baseline of training words per second and decoded sentences per second
    (round r pairs the r-th run of each: they ran next to each other, A B or B A)."""
    train, gen = [], []
    for a, b in zip(arch_runs, base_runs):
        train.append((a["train_words"] / a["train_s"]) / (b["train_words"] / b["train_s"]))
        if "gen_s" in a and "gen_s" in b:
            gen.append((a["gen_sents"] / a["gen_s"]) / (b["gen_sents"] / b["gen_s"]))
    return train, gen


# --- sizes users run, the whole table, and how cost grows with length

SIZE_PRESETS: Dict[str, Dict] = {
    # bart.base's depth with a 512-wide model (768 is bart.base's own width); CommonGen's real lengths
    "base": {"layers": 6, "embed_dim": 512, "heads": 8, "vocab": 50000, "rounds": 5},
}


def apply_size(opts, parser, repo: str):
    """``--size``: the preset's sizes and vocabulary where the command line left the defaults, and the real
    data sets of ``repo/../shared/data`` when ``--data`` is not given and that folder exists."""
    for key, value in SIZE_PRESETS[opts.size].items():
        if getattr(opts, key) in (None, parser.get_default(key)):
            setattr(opts, key, value)
    shared = os.path.join(repo, "..", "shared", "data")
    if opts.data is None and is_real_root(shared):
        opts.data = os.path.abspath(shared)


def is_real_root(path: str) -> bool:
    """A folder of real data sets (``shared/data``'s layout), not a binarized fairseq directory."""
    return any(os.path.isdir(os.path.join(path, name)) for name in REAL_SETS)


# the rows of ``--arch all``: every profile against its baseline, and the copy model against its peer
def table_rows() -> List[Tuple[str, Optional[str]]]:
    rows = [(name, None) for name in sorted(PROFILES) if name != BASELINE]
    return rows + [("copy_transformer", "transformer_pointer_generator")]


def print_table(script: str, opts):
    """One comparison per :func:`table_rows` row, printed as a markdown table (median and range over
    rounds), then the rows as one JSON line."""
    import copy

    results = []
    for arch, against in table_rows():
        row = copy.copy(opts)
        row.arch, row.against, row.data_args = arch, against, dict(opts.data_args)
        kind = PROFILES[arch].get("data", "triples")
        if ":" in kind:  # a profile with its own data: its own vocabulary and lengths
            row.vocab, row.real = 0, None
        try:
            results.append(compare(script, row))
        except RuntimeError as err:
            results.append({"arch": arch, "baseline": against or "-", "error": str(err).splitlines()[0]})
        print(json.dumps(results[-1]), file=sys.stderr)

    def cell(r, key):
        if r.get(key) is None:
            return "-"
        lo, hi = r[key + "_range"]
        return f"{r[key]:.2f} ({lo:.2f}-{hi:.2f})"

    print("| arch | baseline | train words/s ratio | decode sents/s ratio | peak RSS MB (baseline) |")
    print("|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['arch']} | {r['baseline']} | failed: {r['error']} | | |")
            continue
        rss = f"{r['peak_rss_mb']:.0f} ({r['baseline_peak_rss_mb']:.0f})"
        print(
            f"| {r['arch']} | {r['baseline']} | {cell(r, 'train_wps_ratio')} | "
            f"{cell(r, 'generate_sents_per_s_ratio')} | {rss} |"
        )
    print(json.dumps(results))


def grown_sample(sample: Dict, length: int, keep: int = 0) -> Dict:
    """``sample`` with every source ``length`` tokens long, no padding: each row's tokens (without
    its final EOS) from position ``keep`` on repeated to ``length - 1 - keep`` (the first ``keep``
    as they are: EKI's concepts and ``<sep>``), then EOS. Every ``B x S`` entry of the sample and its
    ``net_input`` (EKI's groups, distances and token labels) is gathered at the same positions."""
    import torch

    net_input = sample["net_input"]
    src = net_input["src_tokens"]
    bsz, src_len = src.shape
    lengths = net_input["src_lengths"]
    start = src_len - lengths  # left-padded: the first real position
    n = (lengths - 1 - keep).clamp_min(1)  # tokens that repeat
    j = torch.arange(length - 1 - keep)
    rep = start.unsqueeze(1) + keep + j.unsqueeze(0) % n.unsqueeze(1)
    head = start.unsqueeze(1) + torch.arange(keep).unsqueeze(0)
    index = torch.cat([head, rep, torch.full((bsz, 1), src_len - 1)], 1)  # B x length

    def gathered(d: Dict) -> Dict:
        return {
            k: v.gather(1, index) if torch.is_tensor(v) and v.shape == (bsz, src_len) and k in SOURCE_KEYS else v
            for k, v in d.items()
        }

    out = gathered(sample)
    out["net_input"] = dict(gathered(net_input), src_lengths=torch.full_like(lengths, length))
    return out


# the B x S entries of a sample that follow its source positions
SOURCE_KEYS = ("src_tokens", "src_group", "src_distance", "src_label")


def kbert_injected_sample(sample: Dict, dictionary, injected: int, seed: int = 1) -> Dict:
    """``sample`` (K-BERT, right-padded sentence trees) rebuilt with ``injected`` KG tokens per
    sentence: each row's trunk (its ``branch_ids == 0`` tokens) keeps its words, and ``injected / 2``
    two-token branches (predicate, object: words of the dictionary) hang on its first distinct words,
    as many per word as needed (at most ``injected / 2`` words; ``injected / 2`` at most the square of the
    dictionary's words). The trees go through the package's
    own :func:`~fairseq_knowgen.modules.sentence_tree.build_sentence_tree` and
    :func:`~fairseq_knowgen.data.kbert_dataset.flatten_trees`, so positions and visibility are the
    model's real ones."""
    import random

    import torch
    from fairseq.data import data_utils

    from fairseq_knowgen.data.kbert_dataset import flatten_trees
    from fairseq_knowgen.modules.knowledge_graph import KnowledgeGraph
    from fairseq_knowgen.modules.sentence_tree import build_sentence_tree

    net = sample["net_input"]
    rng = random.Random(seed)
    words = [dictionary[i] for i in range(dictionary.nspecial, len(dictionary))]
    special = {dictionary.bos(), dictionary.eos(), dictionary.pad()}
    rows = {k: [] for k in ("src_tokens", "soft_positions", "branch_ids", "mention_ids", "segment_ids")}
    for b in range(net["src_tokens"].size(0)):
        toks, br = net["src_tokens"][b].tolist(), net["branch_ids"][b].tolist()
        trunk = [dictionary[t] for t, k in zip(toks, br) if k == 0 and t not in special]
        subjects = list(dict.fromkeys(trunk))[: max(injected // 2, 1)]
        # (predicate, object) distinct per subject (the KG keeps a repeated branch once)
        first = rng.randrange(len(words))
        triples = [
            (
                subjects[i % len(subjects)],
                words[(first + i) % len(words)],
                words[(first + i // len(words)) % len(words)],
            )
            for i in range(injected // 2)
        ]
        per_subject = -(-(injected // 2) // len(subjects)) if injected else 1
        kg = KnowledgeGraph(triples, tokenize=str.split, max_entities=per_subject)
        tree = build_sentence_tree(trunk, kg if injected else None, once=True)
        ids, soft, branch, mention, _, _ = flatten_trees([tree], dictionary)
        for key, value in zip(rows, (ids, soft, branch, mention, [0] * len(ids))):
            rows[key].append(torch.as_tensor(value, dtype=torch.long))
    pad = {"src_tokens": dictionary.pad()}
    new = {k: data_utils.collate_tokens(v, pad.get(k, 0), left_pad=False) for k, v in rows.items()}
    new["src_lengths"] = torch.tensor([len(v) for v in rows["src_tokens"]])
    out = dict(sample, net_input=dict(net, **new))
    out["ntokens"] = int(new["src_tokens"].ne(dictionary.pad()).sum())
    return out


def cocon_grown_samples(sample: Dict, pad: int, content: int, prefix: int = 10) -> Tuple[Dict, Dict]:
    """CoCon's training and decoding batches with contents of ``content`` tokens: training, every
    sentence made ``prefix + content`` tokens long (its own tokens repeated, then ``</s>``; the
    criterion splits it at ``prefix``); decoding, the content alone as the source."""
    import torch

    net = sample["net_input"]
    src, lengths = net["src_tokens"], net["src_lengths"]
    eos = int(sample["target"][0, lengths[0]])

    def repeat(n):  # B x n: each row's tokens, repeated
        j = torch.arange(n)
        return src.gather(1, j[None] % lengths.clamp_min(1)[:, None])

    text = repeat(prefix + content)
    bsz = src.size(0)
    target = torch.cat([text, torch.full((bsz, 1), eos)], 1)
    prev = torch.cat([torch.full((bsz, 1), eos), text], 1)
    train = {
        "id": sample["id"],
        "nsentences": bsz,
        "ntokens": target.numel(),
        "net_input": {
            "src_tokens": text,
            "src_lengths": torch.full_like(lengths, prefix + content),
            "prev_output_tokens": prev,
        },
        "target": target,
    }
    decode = dict(
        train,
        net_input={"src_tokens": repeat(content), "src_lengths": torch.full_like(lengths, content)},
        target=None,
        ntokens=0,
    )
    assert not target.eq(pad).any()
    return train, decode


# method -> (profile, lengths, what the length is)
GROWTH: Dict[str, Tuple[str, List[int], str]] = {
    "copy": ("copy_transformer_small", [8, 32, 128, 512], "source length"),
    "eki": ("eki_transformer", [8, 32, 128, 512], "prototype length (after the concepts and <sep>)"),
    "kbert": ("kbert_small", [0, 8, 32, 128], "injected KG tokens per sentence (trunk as in the data)"),
    "cocon": ("cocon_lm", [5, 20, 80], "content length (training: a prefix of 10 tokens, then the content)"),
}


def growth(method: str, opts) -> Dict:
    """Time of one training step and of decoding (beam ``opts.beam``, ``opts.gen_len`` steps) of the same
    batch grown along :data:`GROWTH`'s length (sources: :func:`grown_sample`; K-BERT:
    :func:`kbert_injected_sample`, no decoding; CoCon: :func:`cocon_grown_samples`), median of 3."""
    import torch
    from fairseq.dataclass.configs import GenerationConfig

    torch.set_num_threads(1)
    os.sched_setaffinity(0, {worker_core(opts)})
    name, lengths, what = GROWTH[method]
    prof = profile(name)
    with tempfile.TemporaryDirectory(prefix="knowgen-growth-") as tmp:
        data, extra = make_data(prof.get("data", "triples"), tmp, 200, 40, getattr(opts, "vocab", 0))
        args = size_args(opts.layers, opts.embed_dim, opts.heads, sizes=prof.get("sizes", "seq2seq"))
        task, model, crit = build(prof, data, args + extra.get("arch", []), opts.max_tokens)
        sample = next(iter(task.get_batch_iterator(task.dataset("train"), max_sentences=16, seed=1).next_epoch_itr()))
    generator = None
    if prof.get("generate", True):
        generator = task.build_generator(
            [model], GenerationConfig(beam=opts.beam, min_len=opts.gen_len, max_len_a=0, max_len_b=opts.gen_len)
        )
    keep = 0
    if method == "eki":  # the concepts and <sep> of the shortest source
        sep = task.source_dictionary.index("<sep>")
        src = sample["net_input"]["src_tokens"]
        keep = int((src == sep).float().argmax(1).sub(src.size(1) - sample["net_input"]["src_lengths"]).min()) + 1
    rows = []
    for length in lengths:
        if method == "kbert":
            train_sample = decode_sample = kbert_injected_sample(sample, task.source_dictionary, length)
        elif method == "cocon":
            crit.prefix_len, crit.content_len, crit.len_jitter = 10, length, 0
            crit.max_content = max(crit.max_content, length)
            train_sample, decode_sample = cocon_grown_samples(sample, task.source_dictionary.pad(), length)
        else:
            train_sample = decode_sample = grown_sample(sample, length + keep + 1, keep)
        train, decode = [], []
        for _ in range(3):
            model.train()
            t0 = time.perf_counter()
            loss, _, _ = crit(model, train_sample)
            loss.backward()
            model.zero_grad()
            train.append(time.perf_counter() - t0)
            if generator is None:
                continue
            model.eval()
            with torch.no_grad():
                t0 = time.perf_counter()
                task.inference_step(generator, [model], decode_sample)
                decode.append(time.perf_counter() - t0)
        row = {"length": length, "train_ms": 1e3 * median(train)}
        if decode:
            row["decode_ms"] = 1e3 * median(decode)
        if method == "kbert":
            row["tokens_per_sentence"] = train_sample["ntokens"] / sample["nsentences"]
        rows.append(row)
    return {"method": method, "profile": name, "length": what, "sentences": int(sample["nsentences"]), "rows": rows}


def print_growth(res: Dict):
    """The rows of :func:`growth` as a Markdown table (K-BERT: the tokens per tree instead of decoding), then
    the JSON."""
    kbert = res["method"] == "kbert"
    print(f"{res['method']} ({res['profile']}, {res['sentences']} sentences): time against {res['length']}")
    if kbert:
        print("| injected tokens | tokens per tree | train step ms | train ms per tree token x 1000 |")
    else:
        print("| length | train step ms | decode ms | train ms / length | decode ms / length |")
    print("|---|---|---|---|" + ("" if kbert else "---|"))
    for r in res["rows"]:
        n, dec = r["length"], r.get("decode_ms")
        if kbert:
            per = 1e3 * r["train_ms"] / (r["tokens_per_sentence"] * res["sentences"])
            print(f"| {n} | {r['tokens_per_sentence']:.1f} | {r['train_ms']:.0f} | {per:.1f} |")
            continue
        cells = [f"{r['train_ms']:.0f}", "-" if dec is None else f"{dec:.0f}"]
        cells += [f"{r['train_ms'] / n:.2f}", "-" if dec is None else f"{dec / n:.2f}"]
        print(f"| {n} | " + " | ".join(cells) + " |")
    print(json.dumps(res))
