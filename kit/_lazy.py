"""Lazy package exports (PEP 562): `import kit.x` stays cheap, names load on first use.

A package gives its public names as a dict and gets back the module `__getattr__` that imports
them and the `__dir__` that lists them: tab completion (IPython's, with jedi on or off) asks
`dir()`, and a name that only `__getattr__` knows would never be offered. Completion itself
imports nothing (`_asked_by_completion`).
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any, Callable

from kit._renamed import old_attribute

__all__ = ["lazy_getattr", "lazy_dir"]


def lazy_getattr(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` that imports `names[attr]` on first access. A value is a module path
    (the attribute of the same name), "module:name" (exported under another name), or "module:"
    (the module itself). A name this release renamed or removed is kit/_renamed.py's to answer."""

    def __getattr__(attr: str) -> Any:
        if attr in names:
            module, _, name = names[attr].partition(":")
            is_package = names[attr].endswith(":")  # a lazy package itself: cheap to import, by design
            if not is_package and module not in sys.modules and _asked_by_completion():
                raise AttributeError(attr)  # still offered (dir lists it); typed once it is imported
            mod = importlib.import_module(module)
            return mod if is_package else getattr(mod, name or attr)
        return old_attribute(package, attr)  # AttributeError for a name that never was

    return __getattr__


def _asked_by_completion() -> bool:
    """Whether the `__getattr__` that calls this was called by jedi (IPython's completer) probing a name
    for its type. That probe would import the name's module, and a rank-side one imports torch: 2.5-6 s
    on the first Tab, which JupyterLab (its providerTimeout, 1 s) drops, so the learner saw no list at
    all, and the kernel grew by torch's ~190 MiB. Unimported names go unprobed: offered, typed 'instance'."""
    try:
        caller = sys._getframe(2)  # 0: here, 1: __getattr__, 2: whoever called getattr/hasattr
    except ValueError:  # called from C with no Python frame above
        return False
    return str(caller.f_globals.get("__name__", "")).startswith("jedi.")


def lazy_dir(namespace: dict[str, Any], names: dict[str, str]) -> Callable[[], list[str]]:
    """A module `__dir__`: the public names (`__all__`, the lazy names, subpackages already imported)
    and the underscored ones, not the module's own imports (`annotations`, `Any`, these helpers):
    tab completion lists dir(), and those are nothing a learner can use."""
    prefix = namespace["__name__"] + "."

    def __dir__() -> list[str]:
        own = {n for n, v in namespace.items()
               if n.startswith("_") or (isinstance(v, ModuleType) and v.__name__.startswith(prefix))}
        return sorted(own | set(namespace.get("__all__", ())) | set(names))

    return __dir__
