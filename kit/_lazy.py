"""Lazy package exports (PEP 562): `import kit.x` stays cheap, names load on first use."""
from __future__ import annotations

import importlib
from typing import Any, Callable

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` that imports `names[attr]` (a module path) on first access."""

    def __getattr__(attr: str) -> Any:
        if attr in names:
            return getattr(importlib.import_module(names[attr]), attr)
        raise AttributeError(f"module {package!r} has no attribute {attr!r}")

    return __getattr__
