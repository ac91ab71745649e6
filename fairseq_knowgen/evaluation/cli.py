"""``python scripts/evaluate.py``: score system outputs against one or more references.

Examples::

    # fairseq-generate output, CommonGen-style references (JSON list per line), concepts
    python scripts/evaluate.py --hyp gen.out --refs dev.refs.jsonl --src dev.src \\
        --concepts-from-src --detok moses
    # several systems at once, appended as rows of one table
    python scripts/evaluate.py --hyp a.out b.out --name base dimattn --refs r0.txt r1.txt
"""

import argparse
import json
import sys

from ..textio import DataError, atomic_write, check_writable, read_lines
from .report import evaluate_outputs, format_table, normalize, read_hypotheses, read_references


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hyp", nargs="+", required=True, help="fairseq-generate output or plain hypothesis file(s)")
    p.add_argument("--name", nargs="+", help="system names for the table (default: file names)")
    p.add_argument(
        "--refs",
        nargs="+",
        required=True,
        help="line-aligned reference files (one per reference slot), or one .jsonl of lists",
    )
    p.add_argument("--src", help="source (input) file, one line per input: enables copy and novelty metrics")
    p.add_argument(
        "--concepts-from-src",
        action="store_true",
        help="the source lines are space-separated concepts (CommonGen): report coverage",
    )
    p.add_argument("--concepts", help="file of concepts per input, separated by '|' (multi-word concepts)")
    p.add_argument("--entities", help="file of source entities per input, separated by '|' (WebNLG)")
    p.add_argument(
        "--bpe",
        default="subword_nmt",
        choices=["subword_nmt", "none"],
        help="subword scheme to undo on hypotheses and references",
    )
    p.add_argument(
        "--detok",
        default="none",
        choices=["moses", "none"],
        help="Moses-detokenize hypotheses, references and sources before scoring",
    )
    p.add_argument("--repeat-n", type=int, default=3, help="n of the repeated n-gram rate")
    p.add_argument("--novel-n", type=int, default=2, help="n of the novel n-gram ratio")
    p.add_argument("--no-cider", action="store_true", help="skip CIDEr-D")
    p.add_argument("--json-out", help="also write the scores as JSON here (written atomically)")
    return p


def main(argv=None):
    """The command line; returns its exit status (2: bad input, named ``path:line``)."""
    parser = get_parser()
    args = parser.parse_args(argv)
    if args.name and len(args.name) != len(args.hyp):
        parser.error("--name needs one name per --hyp file")
    try:
        if args.json_out:  # before scoring, which can take minutes
            check_writable(args.json_out)
        rows = run(args)
        print(json.dumps(rows))
        print(format_table(rows))
        if args.json_out:
            with atomic_write(args.json_out) as f:
                json.dump(rows, f, indent=1)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def run(args):
    names = args.name or args.hyp
    bpe = None if args.bpe == "none" else args.bpe
    detok = None if args.detok == "none" else args.detok
    refs = [[normalize(r, bpe, detok) for r in rs] for rs in read_references(args.refs)]
    sources = concepts = None
    if args.src:
        src_lines = read_lines(args.src, "source")
        _check_count(args.src, len(src_lines), len(refs), args.refs[0])
        sources = [normalize(s, bpe, detok) for s in src_lines]
        if args.concepts_from_src:
            concepts = [s.split() for s in sources]
    if args.concepts:
        lines = read_lines(args.concepts, "concepts")
        _check_count(args.concepts, len(lines), len(refs), args.refs[0])
        concepts = [[c.strip() for c in x.split("|") if c.strip()] for x in lines]
    entities = None
    if args.entities:
        lines = read_lines(args.entities, "entities")
        _check_count(args.entities, len(lines), len(refs), args.refs[0])
        entities = [[c.strip() for c in x.split("|") if c.strip()] for x in lines]
    rows = {}
    for name, path in zip(names, args.hyp):
        hyps = [normalize(h, bpe, detok) for h in read_hypotheses(path)]
        _check_count(path, len(hyps), len(refs), args.refs[0])
        rows[name] = evaluate_outputs(
            hyps, refs, sources, concepts, entities, args.repeat_n, args.novel_n, not args.no_cider
        )
    return rows


def _check_count(path, n, n_refs, ref_path):
    if n != n_refs:
        raise DataError(
            path, min(n, n_refs) + 1, f"{n} inputs here but {n_refs} in {ref_path} (the files must be aligned)"
        )


if __name__ == "__main__":
    sys.exit(main())
