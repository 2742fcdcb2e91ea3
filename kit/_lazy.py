"""Lazy package exports (PEP 562): `import kit.x` stays cheap, names load on first use."""
from __future__ import annotations

import importlib
from typing import Any, Callable

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` that imports `names[attr]` on first access. A value is a module path
    (the attribute of the same name), "module:name" (exported under another name), or "module:"
    (the module itself)."""

    def __getattr__(attr: str) -> Any:
        if attr in names:
            module, _, name = names[attr].partition(":")
            mod = importlib.import_module(module)
            return mod if names[attr].endswith(":") else getattr(mod, name or attr)
        raise AttributeError(f"module {package!r} has no attribute {attr!r}")

    return __getattr__
