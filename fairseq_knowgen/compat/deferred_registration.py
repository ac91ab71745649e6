"""Register the package's fairseq components only once torch is imported, between imports.

Registering at import would import fairseq (and torch) at once, ~4 s on a CPU machine, also for the text tools
that need neither: ``python -m fairseq_knowgen.prep.constraints``, ``scripts/retrieve_prototypes.py``,
``scripts/evaluate.py``. A recipe's data stages start a dozen of them. The registration (the models, tasks and
criterions, and torch's weights-only allow-list) runs

- at once, when torch is already imported (``fairseq-train --user-dir fairseq_knowgen`` imports fairseq first);
- else right after the first import of torch completes, by whatever imports it (fairseq, a converter, a test), but
  never in the middle of the import of fairseq or of one of this package's modules: it waits until the outermost
  of those is done, so that no module is registered half-imported (a module of this package that imports torch
  would otherwise start the registration, which imports that same module again).

A text tool that never imports torch never registers anything and starts in a fraction of a second.
"""

import importlib.abc
import importlib.util
import sys
from typing import Callable


class _RegisterBetweenImports(importlib.abc.MetaPathFinder):
    """A finder that finds nothing itself. For torch, fairseq and this package's modules it takes the spec the
    other finders give and wraps the loader's ``exec_module``, counting the imports in progress; when the count
    drops to 0 with torch imported, it calls ``register`` once and leaves ``sys.meta_path``."""

    def __init__(self, package: str, register: Callable[[], None]):
        self.package, self.register = package, register
        self.in_progress = 0
        self.done = False

    def watches(self, fullname: str) -> bool:
        return fullname in ("torch", "fairseq") or fullname.startswith(self.package + ".")

    def find_spec(self, fullname, path=None, target=None):
        if self.done or not self.watches(fullname):
            return None
        spec = self._spec_from_the_other_finders(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def counted_exec_module(module):
            self.in_progress += 1
            try:
                exec_module(module)
            finally:
                self.in_progress -= 1
            self.register_if_due()

        spec.loader.exec_module = counted_exec_module
        return spec

    def _spec_from_the_other_finders(self, fullname, path, target):
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    return spec
        return None

    def register_if_due(self):
        if self.done or self.in_progress or "torch" not in sys.modules:
            return
        self.done = True
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self.register()


def register_once_torch_is_imported(package: str, register: Callable[[], None]) -> None:
    """Call ``register()`` now if torch is imported, else once the first import of torch is complete and no
    import of fairseq or of ``package``'s modules is in progress (see the module docstring)."""
    watch = _RegisterBetweenImports(package, register)
    sys.meta_path.insert(0, watch)
    watch.register_if_due()
