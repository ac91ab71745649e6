#!/usr/bin/env python
"""Scores of CoCon's outputs (``examples/cocon/run.sh`` stage 7) and the two README tables.

``score``: every ``GEN_DIR/{SET}.{SYSTEM}.out`` (fairseq-generate output, BPE'd, no
``--remove-bpe``) with its input ``INPUTS/{SET}[.prompt].src``. The prompt that fairseq forced at
the start of a hypothesis is removed before scoring (it is the input, not the output). Then:

- ``SET = cg`` (CommonGen dev concept sets): concept coverage (the package's lemma coverage,
  :func:`fairseq_knowgen.evaluation.metrics.concept_coverage`), perplexity under the judge LM,
  distinct-1/2, repeated trigrams (:func:`~fairseq_knowgen.evaluation.metrics.repeated_ngram_rate`);
- ``SET = htK`` (contents of K tokens from held-back text): BLEU-4 of the output against its
  content (sacrebleu, :func:`~fairseq_knowgen.evaluation.metrics.bleu4`), content coverage (the
  same lemma coverage as for concept sets, with the content's distinct words as the concepts, less
  punctuation and bm25s's English stop words: :func:`content_words`), judge perplexity, distinct-1/2/3.
  BLEU against a content the output should not copy verbatim sits near 0 for every system; content
  coverage counts the content's words the output does use.

Judge perplexity = exp(summed NLL / tokens) over all outputs: each output's tokens (BPE) scored
after ``</s>`` and its prompt, the prompt of ``SET.src`` (the same for every system, so the
prompted LM's content is not part of the condition) and not itself scored; the final ``</s>`` is
scored unless ``--fixed-len`` says the outputs have a fixed length (no ``</s>`` generated). Without
prompts an output is scored as its own sentence (``</s>`` w_1..w_n ``</s>``). Distinct-n = distinct
n-grams / n-grams over all outputs (Li et al., 2016), on the package's word tokens.

``gap``: the dev losses of training runs over their updates (the ``valid`` lines of each ``RUN/train.log``) as a
JSON file and a plot of the gap L_null - L_self (bits per token): how much the block's content helps::

    python scripts/cocon_score.py gap --logs RUN1/train.log RUN2/train.log --json-out gap.json --plot gap.png

``table``: the ``scores.json`` of several runs (and the references' judge perplexity) as two
Markdown tables and a JSON file; ``--plot`` draws coverage against judge perplexity of the CoCon
rows as tau varies (matplotlib)::

    python scripts/cocon_score.py score --gen-dir RUN/gen --inputs GEN --judge JUDGE.pt \\
        --concepts RAW/commongen/valid.concepts --contents-dir GEN --json-out RUN/scores.json
    python scripts/cocon_score.py table --scores RUN1/scores.json RUN2/scores.json \\
        --judge JUDGE.pt --refs-bpe BPE/cg.ref.txt --out-md OUT/table.md --plot docs/cocon_coverage_ppl.png
"""

import argparse
import glob
import json
import math
import os
import re
import sys
from collections import Counter
from typing import Dict, List, Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fairseq_knowgen.evaluation import metrics  # noqa: E402
from fairseq_knowgen.evaluation.report import format_table, normalize, read_hypotheses  # noqa: E402
from fairseq_knowgen.textio import DataError, atomic_write, cli_entry, read_lines  # noqa: E402

_OUT = re.compile(r"^(cg|ht\d+)\.(.+)\.out$")


def prompt_of(source: str) -> str:
    """The prompt of a decoding input (what follows ``<prompt>``; empty without one)."""
    return source.split("<prompt>", 1)[1].strip() if "<prompt>" in source.split() else ""


def strip_prompt(hyp: str, source: str) -> str:
    """The hypothesis without the prompt fairseq forced at its start (``<prompt> ...`` in the source)."""
    if "<prompt>" not in source.split():
        return hyp
    prompt = source.split("<prompt>", 1)[1].split()
    toks = hyp.split()
    return " ".join(toks[len(prompt) :]) if toks[: len(prompt)] == prompt else hyp


def content_words(content: str) -> List[str]:
    """The words of a (detokenised) content that content coverage looks for in the output: its distinct
    (lower-cased) tokens in order, less stop words (bm25s's English list) and tokens without a letter or digit."""
    from bm25s.stopwords import STOPWORDS_EN

    stop = set(STOPWORDS_EN)
    words = [t for t in metrics.tokenize(content) if t not in stop and re.search(r"\w", t)]
    return list(dict.fromkeys(words))


def distinct_n(hyps: Sequence[str], n: int) -> float:
    """Distinct n-grams / all n-grams over the corpus (0-100)."""
    grams = Counter()
    total = 0
    for h in hyps:
        toks = metrics.tokenize(h)
        g = [tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)]
        grams.update(g)
        total += len(g)
    return 100.0 * len(grams) / total if total else 0.0


class Judge:
    """A fairseq ``transformer_lm`` checkpoint scoring token sequences (its ``dict.txt`` beside it)."""

    def __init__(self, path: str, dict_path: str = None):
        import torch
        from fairseq import checkpoint_utils
        from fairseq.data import Dictionary
        from fairseq.tasks.language_modeling import LanguageModelingTask

        import fairseq_knowgen  # noqa: F401

        if not os.path.isfile(path):
            raise DataError(path, 0, "judge LM checkpoint not found")
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
        self.dict = Dictionary.load(dict_path or os.path.join(os.path.dirname(os.path.abspath(path)), "dict.txt"))
        task = LanguageModelingTask(state["cfg"].task, self.dict)
        self.model = task.build_model(state["cfg"].model)
        self.model.load_state_dict(state["model"])
        self.model.eval()
        self.torch = torch

    def nll(self, lines: Sequence[str], batch: int = 64, prefixes: Sequence[str] = None, final_eos: bool = True):
        """(summed NLL in nats, number of tokens scored) of each line after ``</s>`` and its prefix
        (not scored), with a final ``</s>`` scored when ``final_eos``."""
        torch = self.torch
        d = self.dict
        total, count = 0.0, 0
        maxpos = self.model.decoder.max_positions()
        prefixes = prefixes or [""] * len(lines)
        for i in range(0, len(lines), batch):
            rows = []
            for x, pre in zip(lines[i : i + batch], prefixes[i : i + batch]):
                p = d.encode_line(pre, add_if_not_exist=False, append_eos=False).long()
                s = d.encode_line(x, add_if_not_exist=False, append_eos=final_eos).long()
                rows.append((p, s[: maxpos - 1 - len(p)]))
            L = max(len(p) + len(s) for p, s in rows)
            inp = torch.full((len(rows), L), d.pad(), dtype=torch.long)
            tgt = torch.full((len(rows), L), d.pad(), dtype=torch.long)
            for b, (p, s) in enumerate(rows):
                full = torch.cat([p, s])
                inp[b, 0] = d.eos()
                inp[b, 1 : len(full)] = full[:-1]
                tgt[b, len(p) : len(full)] = s  # the prefix is the condition, not scored
            with torch.no_grad():
                logits = self.model(inp)[0].float()
                lp = torch.nn.functional.cross_entropy(
                    logits.transpose(1, 2), tgt, ignore_index=d.pad(), reduction="sum"
                )
            total += float(lp)
            count += int(tgt.ne(d.pad()).sum())
        return total, count

    def ppl(self, lines: Sequence[str], prefixes: Sequence[str] = None, final_eos: bool = True) -> float:
        total, count = self.nll(lines, prefixes=prefixes, final_eos=final_eos)
        return math.exp(total / max(count, 1))


def score_file(
    path, source_path, judge, concepts=None, contents=None, pieces=None, prompts=None, fixed_len=False
) -> Dict[str, float]:
    """``pieces``: GPT-2 BPE outputs (:class:`fairseq_knowgen.prep.cocon.Gpt2Pieces`) are decoded
    to text; by default subword-nmt's ``@@`` joins are undone. ``prompts``: the judge's condition
    per output (module docstring); ``fixed_len``: no final ``</s>`` scored."""
    sources = read_lines(source_path, "CoCon input")
    hyps_bpe = read_hypotheses(path)
    if len(hyps_bpe) != len(sources):
        raise DataError(path, 0, f"{len(hyps_bpe)} hypotheses for {len(sources)} inputs in {source_path}")
    hyps_bpe = [strip_prompt(h, s) for h, s in zip(hyps_bpe, sources)]
    hyps = [pieces.text(h.split()) if pieces else normalize(h) for h in hyps_bpe]
    out = {"n": len(hyps)}
    if concepts is not None:
        out["coverage"] = metrics.concept_coverage(hyps, concepts)
    if contents is not None:
        out["bleu_content"] = metrics.bleu4(hyps, [[c] for c in contents])
        out["content_coverage"] = metrics.concept_coverage(hyps, [content_words(c) for c in contents])
    if judge is not None:
        out["judge_ppl"] = judge.ppl(hyps_bpe, prefixes=prompts, final_eos=not fixed_len)
    for n in (1, 2, 3):
        out[f"dist{n}"] = distinct_n(hyps, n)
    out.update(metrics.repeated_ngram_rate(hyps, 3))
    out["len"] = sum(len(metrics.tokenize(h)) for h in hyps) / max(len(hyps), 1)
    return out


def cmd_score(a):
    judge = Judge(a.judge) if a.judge else None
    from fairseq_knowgen.prep.cocon import Gpt2Pieces

    pieces = Gpt2Pieces(a.gpt2_bpe) if a.gpt2_bpe else None
    concepts = [c.split("|") for c in read_lines(a.concepts, "concepts")] if a.concepts else None
    results = {}
    for path in sorted(glob.glob(os.path.join(a.gen_dir, "*.out"))):
        m = _OUT.match(os.path.basename(path))
        if not m:
            continue
        kind, system = m.groups()
        prompt = "prompt" in system.split("-")
        src = os.path.join(a.inputs, f"{kind}{'.prompt' if prompt else ''}.src")
        prompts = [prompt_of(x) for x in read_lines(os.path.join(a.inputs, f"{kind}.src"), "CoCon input")]
        fixed = {"prompts": prompts, "fixed_len": a.fixed_len > 0}
        if kind == "cg":
            res = score_file(path, src, judge, concepts=concepts, pieces=pieces, **fixed)
        else:
            contents_path = os.path.join(a.contents_dir or a.inputs, f"{kind}.content")
            contents = read_lines(contents_path, "contents")
            n_inputs = len(read_lines(src, "CoCon input"))
            if len(contents) != n_inputs:
                raise DataError(contents_path, 0, f"{len(contents)} contents for {n_inputs} inputs in {src}")
            res = score_file(path, src, judge, contents=contents, pieces=pieces, **fixed)
        results[f"{kind}/{system}"] = res
        print(json.dumps({"run": a.name, "set": kind, "system": system, **res}))
    with atomic_write(a.json_out) as f:
        json.dump({"name": a.name, "results": results}, f, indent=1)


def cmd_table(a):
    rows1, rows2, seen = {}, {}, {}
    for path in a.scores:
        with open(path) as f:
            d = json.load(f)
        if d["name"] in seen:  # a copied run folder: its rows would silently hide the other's
            raise DataError(path, 0, f"run name {d['name']!r} is also the name in {seen[d['name']]}: rename one")
        seen[d["name"]] = path
        for key, res in d["results"].items():
            kind, system = key.split("/", 1)
            # the plain/prompted LM rows are the same for every run (the frozen LM): keep the first
            name = system if system.startswith("lm") else f"{d['name']}/{system}"
            if kind == "cg":
                rows1.setdefault(name, {k: res[k] for k in res if k != "dist3"})
            else:
                rows2.setdefault(f"{kind} {name}", res)

    def order(name):  # ht5 before ht10 before ht20
        m = re.match(r"^ht(\d+) ", name)
        return (int(m.group(1)) if m else 0, name)

    rows2 = {k: rows2[k] for k in sorted(rows2, key=order)}
    if a.judge and a.refs_bpe:
        judge = Judge(a.judge)
        refs = read_lines(a.refs_bpe, "BPE'd references")
        rows1["references"] = {"judge_ppl": judge.ppl(refs)}
    md = "### CommonGen dev concept sets as content\n\n" + format_table(rows1)
    md += "\n\n### Contents from held-back text (the paper's set-up)\n\n" + format_table(rows2) + "\n"
    with atomic_write(a.out_md) as f:
        f.write(md)
    with atomic_write(os.path.splitext(a.out_md)[0] + ".json") as f:
        json.dump({"commongen": rows1, "heldout": rows2}, f, indent=1)
    print(md)
    if a.plot:
        plot(rows1, a.plot)


_VALID = re.compile(r"\| valid on .*\| loss_self ([0-9.]+) \| loss_null ([0-9.]+) .*\| num_updates (\d+)")


def dev_gaps(log_path: str) -> List[List[float]]:
    """``[update, L_self, L_null, gap]`` of every validation in a fairseq-train log (a resumed run's repeats of an
    update keep the last)."""
    points = {}
    for line in read_lines(log_path, "training log"):
        m = _VALID.search(line)
        if m:
            s_, n_, u = float(m.group(1)), float(m.group(2)), int(m.group(3))
            points[u] = [u, s_, n_, round(n_ - s_, 4)]
    if not points:
        raise DataError(log_path, 0, "no validation line with loss_self and loss_null: not a cocon training log")
    return [points[u] for u in sorted(points)]


def cmd_gap(a):
    runs = {os.path.basename(os.path.dirname(os.path.abspath(p))): dev_gaps(p) for p in a.logs}
    with atomic_write(a.json_out) as f:
        json.dump(runs, f, indent=1)
    for name, pts in runs.items():
        print(name, " ".join(f"{int(u)}:{g:.3f}" for u, _, _, g in pts))
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for name, pts in sorted(runs.items()):
            ax.plot([p[0] for p in pts], [p[3] for p in pts], "o-", ms=3, label=name)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xlabel("update")
        ax.set_ylabel("dev L_null - L_self (bits per token)")
        ax.set_title("How much the content helps, over training")
        ax.legend(fontsize=7)
        fig.tight_layout()
        with atomic_write(a.plot, "wb") as f:
            fig.savefig(f, format="png", dpi=120)
        print(f"plot -> {a.plot}")


def plot(rows: Dict[str, Dict[str, float]], path: str):
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.6))
    runs: Dict[str, List] = {}
    for name, r in rows.items():
        m = re.match(r"^(.*)/tau([-0-9.]+)$", name)
        if m and "coverage" in r and "judge_ppl" in r:
            runs.setdefault(m.group(1), []).append((float(m.group(2)), r["judge_ppl"], r["coverage"]))
    for run, pts in sorted(runs.items()):
        pts.sort()
        ax.plot([p[1] for p in pts], [p[2] for p in pts], "o-", label=f"CoCon {run}")
        for tau, x, y in pts:
            ax.annotate(f"τ={tau:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    for name, marker in (("lm", "s"), ("lm-prompt", "^")):
        if name in rows and "coverage" in rows[name]:
            ax.plot([rows[name]["judge_ppl"]], [rows[name]["coverage"]], marker, label=name)
    ax.set_xlabel("judge perplexity (lower is more fluent)")
    ax.set_ylabel("concept coverage (%)")
    ax.set_title("CoCon on CommonGen dev: content bias τ")
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"plot -> {path}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("score")
    s.add_argument("--gen-dir", required=True, help="folder of SET.SYSTEM.out files")
    s.add_argument("--inputs", required=True, help="folder of the decoding inputs SET[.prompt].src")
    s.add_argument("--contents-dir", help="folder of htK.content (default: --inputs)")
    s.add_argument("--concepts", help="CommonGen valid.concepts ('|'-separated)")
    s.add_argument("--judge", help="judge transformer_lm checkpoint (dict.txt beside it)")
    s.add_argument("--name", default="cocon")
    s.add_argument("--gpt2-bpe", metavar="DIR", help="outputs in GPT-2 BPE ids: decoded (DIR: encoder.json, vocab.bpe)")
    s.add_argument("--fixed-len", type=int, default=0, help="N > 0: the outputs are N tokens after their prompt "
                   "(fairseq-generate --cocon-fixed-len N): no final </s> scored")
    s.add_argument("--json-out", required=True)
    g = sub.add_parser("gap")
    g.add_argument("--logs", nargs="+", required=True, help="RUN/train.log of cocon trainings")
    g.add_argument("--json-out", required=True)
    g.add_argument("--plot", help="PNG of the dev gap over the updates")
    t = sub.add_parser("table")
    t.add_argument("--scores", nargs="+", required=True)
    t.add_argument("--judge")
    t.add_argument("--refs-bpe", help="BPE'd first references of CommonGen dev (their judge perplexity)")
    t.add_argument("--out-md", required=True)
    t.add_argument("--plot", help="PNG of coverage against judge perplexity as tau varies")
    a = p.parse_args(argv)
    {"score": cmd_score, "gap": cmd_gap, "table": cmd_table}[a.cmd](a)


if __name__ == "__main__":
    cli_entry(main)
