"""Code run around a module's import, without importing anything first: a meta path finder that finds nothing itself
asks the others (`find_wrapped`) and wraps the loader they give (kubetf_trainer.phases times TensorFlow's import,
kubetf_trainer.autoreport patches Keras' `fit` once its module ran)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any

# around(module, run): calls run() (the module's own code) and does what it does before and after.
Around = Callable[[Any, Callable[[], None]], None]


def find_wrapped(
    asking: object, fullname: str, path: Any, target: Any, around: Around
) -> importlib.machinery.ModuleSpec | None:
    """The spec the finders other than `asking` give for `fullname`, its loader wrapped so `around` runs its code;
    None when none finds it or its loader cannot be wrapped (no `exec_module`)."""
    for finder in sys.meta_path:
        if finder is asking or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
            break
    else:
        return None
    if spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return None
    spec.loader = _AroundLoader(spec.loader, around)
    return spec


class _AroundLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, around: Around):
        self._loader = loader
        self._around = around

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._around(module, lambda: self._loader.exec_module(module))

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self._loader, name)
