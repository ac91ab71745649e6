"""The package's imports point down (STYLE.md: tasks and criterions, then models, then modules,
then the text utilities), read from the source with ``ast`` so that a function-local import
counts too:

    textio, text  <-  modules, convert  <-  data, prep, evaluation  <-  models  <-  criterions, tasks

Prep and evaluation share their tokenization and entity matcher through ``fairseq_knowgen.text``:
neither imports the other, and data (what models read) imports neither. A bare ``import
fairseq_knowgen`` inside a command-line entry point registers the plugin, as ``--user-dir`` does;
it is no dependency on a layer and is not counted."""

import ast
import os

from conftest import ROOT

PACKAGE = "fairseq_knowgen"

# component (first name below the package) -> layer; a component imports its own layer or lower
LAYERS = {
    "textio": 0,
    "text": 0,
    "compat": 0,  # fairseq patches (checkpoint loading, exact resume, clean exit, interactive input, n-gram block)
    "modules": 1,
    "convert": 1,  # checkpoint loaders that models call
    "optim": 1,  # optimizers registered with fairseq (kbert_adam)
    "demo_data": 1,
    "checkpoint_average": 1,
    "data": 2,
    "prep": 2,
    "evaluation": 2,
    "analysis": 2,
    "models": 3,
    "criterions": 4,
    "tasks": 4,
    "user_dir": 5,
    "<package>": 5,
}
# imports within one layer that would make two ideas depend on each other
SIDEWAYS_FORBIDDEN = {("data", "prep"), ("data", "evaluation"), ("prep", "evaluation"), ("evaluation", "prep")}


def _component(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<package>"


def package_imports(root=os.path.join(ROOT, PACKAGE)):
    """(importing module, imported module, line) for every import of the package by itself,
    relative imports resolved."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            module = os.path.relpath(path[:-3], os.path.dirname(root)).replace(os.sep, ".")
            if f == "__init__.py":
                module = module[: -len(".__init__")]
            package = module if f == "__init__.py" else module.rsplit(".", 1)[0]
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    if node.module:
                        targets = [".".join(base + [node.module])]
                    else:  # from . import x: x is a module of the package
                        targets = [".".join(base + [a.name]) for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    targets = [node.module]
                else:
                    continue
                for t in targets:
                    if t.startswith(PACKAGE + ".") or (t == PACKAGE and node.col_offset == 0):
                        out.append((module, t, node.lineno))
    return out


def layering_violations(imports):
    bad = []
    for src, dst, line in imports:
        a, b = _component(src), _component(dst)
        if a == b:
            continue
        ok = LAYERS[b] <= LAYERS[a] and (a, b) not in SIDEWAYS_FORBIDDEN
        if not ok:
            bad.append(f"{src} (line {line}) imports {dst}")
    return sorted(bad)


def test_every_component_has_a_layer():
    comps = {_component(m) for imp in package_imports() for m in imp[:2]}
    assert comps - set(LAYERS) == set(), "place the new component in LAYERS"


def test_imports_point_down():
    imports = package_imports()
    assert len(imports) > 50  # the walk found the package
    assert layering_violations(imports) == []


def test_an_upward_import_is_caught(tmp_path):
    """The checker itself: the two upward imports this layering replaced are found, and a model
    that imports a task; a CLI's registration of the plugin is not counted."""
    pkg = tmp_path / PACKAGE
    for sub in ("prep", "evaluation", "data", "models"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "text.py").write_text("")
    (pkg / "prep" / "retrieval.py").write_text("from ..evaluation.metrics import lemma\nfrom ..text import tokenize\n")
    (pkg / "evaluation" / "metrics.py").write_text("def f():\n    from ..prep.entities import EntityMatcher\n")
    (pkg / "data" / "eki.py").write_text("from fairseq_knowgen.prep import common\n")
    (pkg / "models" / "m.py").write_text("from ..tasks.t import T\n\n\ndef main():\n    import fairseq_knowgen\n")
    bad = layering_violations(package_imports(str(pkg)))
    assert bad == [
        "fairseq_knowgen.data.eki (line 1) imports fairseq_knowgen.prep",
        "fairseq_knowgen.evaluation.metrics (line 2) imports fairseq_knowgen.prep.entities",
        "fairseq_knowgen.models.m (line 1) imports fairseq_knowgen.tasks.t",
        "fairseq_knowgen.prep.retrieval (line 1) imports fairseq_knowgen.evaluation.metrics",
    ]
