"""The Flags sections of ``docs/methods/*.md``, built from today's code.

    .venv/bin/python dev/flag_tables.py           # rewrite each page's tables between its markers
    .venv/bin/python dev/flag_tables.py --check   # exit 1, naming each page whose tables differ from the code

For each component a page documents (a model and its registered archs, a task, a criterion, an optimizer) the
tables list every flag the package adds, read from fairseq's argparse as ``fairseq-train --help`` builds it:

- a model: the options its ``add_args`` adds beyond its fairseq parent's ``add_args``; the default is the value
  after the arch function (fairseq's ``ARCH_CONFIG_REGISTRY``) on a command line that gives none of them, per arch
  where the archs differ. An option the arch function leaves unset because it only matters with another flag (the
  copy head's and diminishing attention's, filled when the decoder is built) shows the value it gets with that
  flag (:data:`CONDITIONAL`);
- a task, criterion or optimizer: the fields its dataclass config declares in this package (a field redeclared
  over fairseq's counts; one that reads a fairseq option, ``II("...")``, does not), with the field's default.

Each page holds its tables between :data:`BEGIN` and :data:`END`; the text around them is the page's own.
``tests/test_flag_tables.py`` runs the check, and compares every default a help text states with the code's.
"""

import argparse
import dataclasses
import difflib
import os
import re
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN = "<!-- flag tables: written by dev/flag_tables.py from the code; change the code's help texts, not these -->"
END = "<!-- end of the flag tables -->"
INTRO = (
    "Every flag the package adds, with its default: for a model the value after the arch function on a command "
    "line without it (per arch where they differ), for a task, criterion or optimizer the dataclass field's. "
    "`unset`: the flag has no value of its own until given (its help says what is used instead). Flags inherited "
    "from fairseq are not repeated; `fairseq-train --user-dir fairseq_knowgen --task T --arch A --criterion C "
    "--help` shows these with the rest."
)


def load_registries():
    """Import fairseq and the package (which registers its components) and return fairseq's registries."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    import torch  # noqa: F401  (the package registers its components once torch is imported)
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.optim import OPTIMIZER_DATACLASS_REGISTRY
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    import fairseq_knowgen  # noqa: F401
    from fairseq_knowgen import criterions, models, optim, tasks  # noqa: F401

    return {
        "model": MODEL_REGISTRY,
        "arch_model": ARCH_MODEL_REGISTRY,
        "arch_config": ARCH_CONFIG_REGISTRY,
        "task": TASK_DATACLASS_REGISTRY,
        "criterion": CRITERION_DATACLASS_REGISTRY,
        "optimizer": OPTIMIZER_DATACLASS_REGISTRY,
    }


def ours(obj) -> bool:
    return obj.__module__.split(".")[0] == "fairseq_knowgen"


# ---------------------------------------------------------------- models


def model_parser(cls) -> argparse.ArgumentParser:
    """The model's options as fairseq adds them: a group whose options without a default stay out of the args."""
    parser = argparse.ArgumentParser(add_help=False)
    cls.add_args(parser.add_argument_group("Model-specific configuration", argument_default=argparse.SUPPRESS))
    return parser


def own_model_actions(cls) -> List[argparse.Action]:
    """The options ``cls.add_args`` adds beyond the ``add_args`` of its nearest fairseq ancestor that has one."""
    parent = next((b for b in cls.__mro__[1:] if "add_args" in vars(b) and not ours(b)), None)
    inherited = set()
    if parent is not None:
        inherited = {s for a in model_parser(parent)._actions for s in a.option_strings}
    return [a for a in model_parser(cls)._actions if a.option_strings and not set(a.option_strings) & inherited]


def conditional_defaults() -> Dict[str, Tuple[List[str], Callable]]:
    """dest -> (the flag that brings the option into use, the function the model fills it with then).

    The arch functions leave these unset: the copy head's options matter only with ``--copy`` (``eki_*``), the
    ``--dimattn-*`` options only with ``--dimattn-type`` (``copy_transformer``, ``eki_*``; ``--dimattn-g2`` only
    with ``dydim``). The models fill them with these functions when they build their decoder."""
    from fairseq_knowgen.models.copy_transformer import copy_defaults
    from fairseq_knowgen.models.dimattn import dimattn_defaults

    dim, dydim = ["--dimattn-type", "dim"], ["--dimattn-type", "dydim"]
    return {
        "copy_layer": (["--copy"], copy_defaults),
        "copy_heads": (["--copy"], copy_defaults),
        "copy_alpha": (["--copy"], copy_defaults),
        "dimattn_g": (dim, dimattn_defaults),
        "dimattn_g2": (dydim, dimattn_defaults),
        "dimattn_layers": (dim, dimattn_defaults),
    }


CONDITIONAL = None  # filled by conditional_defaults() on first use (it imports the package)


def resolve_model_args(reg, arch: str, argv: Sequence[str] = ()) -> argparse.Namespace:
    """The args of ``--arch arch`` with ``argv`` given: the model's parser, then the arch function."""
    cls = reg["arch_model"][arch]
    args = model_parser(cls).parse_args(list(argv))
    reg["arch_config"][arch](args)
    return args


def model_default(reg, arch: str, dest: str) -> Tuple[Any, Optional[List[str]]]:
    """(default of ``dest`` under ``arch``, None) or, for an option filled only with another flag,
    (its value with that flag, that flag's argv). ``argparse.SUPPRESS`` stands for unset."""
    global CONDITIONAL
    if CONDITIONAL is None:
        CONDITIONAL = conditional_defaults()
    value = getattr(resolve_model_args(reg, arch), dest, None)
    if value is None and dest in CONDITIONAL:
        argv, fill = CONDITIONAL[dest]
        args = resolve_model_args(reg, arch, argv)
        fill(args)
        return getattr(args, dest, None), argv
    return value, None


# ---------------------------------------------------------------- dataclass configs


def dataclass_actions(cfg_cls) -> Dict[str, argparse.Action]:
    """dest -> argparse action, as fairseq builds a config's options."""
    from fairseq.dataclass.utils import gen_parser_from_dataclass

    parser = argparse.ArgumentParser(add_help=False)
    gen_parser_from_dataclass(parser, cfg_cls())
    return {a.dest: a for a in parser._actions}


def own_fields(cfg_cls) -> List[Tuple[str, Any]]:
    """(name, default) of the fields a package class of ``cfg_cls``'s hierarchy declares, in field order; fields
    that read a fairseq option (``II("...")``) left out."""
    declared = {n for b in cfg_cls.__mro__ if ours(b) for n in vars(b).get("__annotations__", {})}
    instance = cfg_cls()
    out = []
    for f in dataclasses.fields(cfg_cls):
        # ``data``: the positional DATA of every fairseq task (fairseq's own config class has no field for it)
        if f.name.startswith("_") or f.name == "data" or f.name not in declared:
            continue
        default = instance._get_default(f.name)
        if isinstance(default, str) and default.startswith("${"):
            continue
        out.append((f.name, default))
    return out


# ---------------------------------------------------------------- rendering


def code(value: Any) -> str:
    if value is argparse.SUPPRESS or value is None:
        return "unset"
    if hasattr(value, "value") and not isinstance(value, (int, float, str)):  # an Enum
        value = value.value
    return f"`{value}`"


def cell(text: Optional[str]) -> str:
    """A table cell: one line, ``|`` escaped, ``<`` escaped so that ``<unk>`` shows as text, not as an HTML tag."""
    return re.sub(r"<(?=[A-Za-z/])", r"\\<", " ".join((text or "").split()).replace("|", "\\|"))


def flag_cell(action: argparse.Action) -> str:
    if not action.option_strings:  # fairseq's positional DATA
        return f"`{action.dest}` (positional)"
    name = max(action.option_strings, key=len)
    if action.choices:
        name += " {" + ",".join(str(c) for c in action.choices) + "}"
    return f"`{cell(name)}`"


def model_table(reg, names: Sequence[str]) -> List[str]:
    """One table of the models ``names``: their flags in order (the first model's, then those only later ones
    add), each flag's default per arch; a flag some of the models lack says which (``not `bart_dimattn```)."""
    classes = [reg["model"][n] for n in names]
    archs = [a for cls in classes for a, m in reg["arch_model"].items() if m is cls]
    own = {n: {tuple(a.option_strings) for a in own_model_actions(c)} for n, c in zip(names, classes)}
    actions, seen = [], set()
    for cls in classes:
        for action in own_model_actions(cls):
            if tuple(action.option_strings) not in seen:
                seen.add(tuple(action.option_strings))
                actions.append(action)
    models = ", ".join(f"`{n}`" for n in names)
    lines = [f"### model {models} (`--arch` {', '.join(f'`{a}`' for a in archs)})", ""]
    lines += ["| flag | default | meaning |", "|---|---|---|"]
    for action in actions:
        lacking = [n for n in names if tuple(action.option_strings) not in own[n]]
        with_it = [a for a in archs if reg["arch_model"][a] not in [reg["model"][n] for n in lacking]]
        values = [model_default(reg, arch, action.dest) for arch in with_it]
        if isinstance(action, argparse._StoreTrueAction):  # absent from the args: off
            values = [(False if v is None else v, argv) for v, argv in values]
        first, argv = values[0]
        text = code(first) + (f" with `{' '.join(argv)}`" if argv else "")
        others = [f"`{a}`: {code(v)}" for a, (v, _) in zip(with_it, values) if v != first]
        others += [f"not `{n}`" for n in lacking]
        if others:
            text += f" ({', '.join(others)})"
        lines.append(f"| {flag_cell(action)} | {text} | {cell(action.help)} |")
    return lines + [""]


def config_table(reg, kind: str, name: str, note: str = "") -> List[str]:
    cfg_cls = reg[kind][name]
    actions = dataclass_actions(cfg_cls)
    lines = [f"### {kind} `{name}`", ""]
    if note:
        lines += [note, ""]
    lines += ["| flag | default | meaning |", "|---|---|---|"]
    for field_name, default in own_fields(cfg_cls):
        action = actions[field_name]
        lines.append(f"| {flag_cell(action)} | {code(default)} | {cell(action.help)} |")
    return lines + [""]


KBERT_ADAM_NOTE = (
    "fairseq's `adam` (decoupled weight decay) with no weight decay on 1-D tensors (biases, LayerNorm): the authors' "
    "BertAdam settings (`fairseq_knowgen/optim/kbert_adam.py`). Not with `--fp16`'s flat parameters: use "
    "`--fp16-no-flatten-grads`, `--memory-efficient-fp16` or `--amp`."
)

# page -> its components: ("model", model names sharing one table) or (kind, registered name[, note])
PAGES: Dict[str, List[tuple]] = {
    "docs/methods/dimattn.md": [
        ("model", ("transformer_dimattn", "bart_dimattn")),
        ("task", "translation_constrained"),
    ],
    "docs/methods/force_copy.md": [("model", ("copy_transformer",)), ("criterion", "force_copy")],
    "docs/methods/eki.md": [
        ("model", ("eki_transformer", "eki_bart")),
        ("task", "eki_generation"),
        ("criterion", "eki_label_smoothed_cross_entropy"),
        ("criterion", "eki_force_copy"),
    ],
    "docs/methods/kbert.md": [
        ("model", ("kbert",)),
        ("model", ("kbert_transformer",)),
        ("task", "kbert_classification"),
        ("task", "kbert_tagging"),
        ("task", "kbert_translation"),
        ("optimizer", "kbert_adam", KBERT_ADAM_NOTE),
        ("criterion", "kbert_tagging"),
    ],
    "docs/methods/cocon.md": [("model", ("cocon_lm",)), ("task", "cocon_generation"), ("criterion", "cocon")],
    "docs/methods/pretrained_encoder.md": [("model", ("transformer_pretrained_encoder",))],
}


def tables(reg, page: str) -> str:
    lines = [BEGIN, "", INTRO, ""]
    for spec in PAGES[page]:
        if spec[0] == "model":
            lines += model_table(reg, spec[1])
        else:
            lines += config_table(reg, *spec)
    return "\n".join(lines + [END])


def replace_between_markers(text: str, new: str, page: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{page}: no flag-table markers (put the lines\n{BEGIN}\n{END}\nunder its '## Flags')")
    return text[:start] + new + text[end + len(END) :]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs from the code")
    opts = parser.parse_args(argv)
    reg = load_registries()
    differ = []
    for page in PAGES:
        path = os.path.join(ROOT, page)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new = replace_between_markers(text, tables(reg, page), page)
        if new == text:
            continue
        differ.append(page)
        if opts.check:
            diff = difflib.unified_diff(text.splitlines(), new.splitlines(), page, "from the code", lineterm="", n=0)
            print("\n".join(list(diff)[:40]))
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
    if opts.check and differ:
        print(f"flag tables differ from the code in: {', '.join(differ)} (run: .venv/bin/python dev/flag_tables.py)")
        return 1
    if not opts.check:
        print(f"rewrote {len(differ)} page(s): {', '.join(differ) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
