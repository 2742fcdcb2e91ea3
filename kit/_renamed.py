"""Names and result keys this release renamed, moved or removed (one word, one meaning, across the kit), kept
working for one release.

A learner's notebook saved against the previous release still calls the old names. Each one works
and warns with the new name (a FutureWarning: Jupyter shows it by default), or, where no name maps
one to one (a unit changed, a class folded into another), fails saying what to call instead. The
next release deletes the tables (kit/_renamed_tables.py, re-exported here) and the hooks that read
them (grep `kit._renamed`).

The hooks, none of which adds a name to dir(), __all__ or tab completion:
- a module `__getattr__` (PEP 562): the lazy packages get it through kit/_lazy.py, other modules
  with one line, `__getattr__ = _renamed.renamed_getattr(__name__)`;
- a finder (`install`, from kit/__init__.py) for the modules that moved: `import old` gives a
  module that forwards to the new one;
- `renamed_attributes` for a class's old attributes, `renamed_keywords` for old keyword arguments,
  `removed_keywords` for a class's removed ones (taken, unused, with a warning);
- `RenamedKeys` for the old keys of a result dict a learner reads (KEYS): a dict whose `__missing__`
  answers them, the same dict to ==, `in`, iteration, repr, json.dumps and pickle.
docs/architecture.md ("Renamed in this release") is the table in prose.
"""
from __future__ import annotations

import functools
import importlib
import importlib.machinery
import operator
import os
import sys
import warnings
from types import FrameType, ModuleType
from typing import Any, Callable

from kit._renamed_tables import (ATTRIBUTES, KEYS, KEYWORDS, MOVED, MOVED_AWAY, REMOVED, REMOVED_KEYS,
                                REMOVED_KEYWORDS, RENAMED)

__all__ = ["RENAMED", "REMOVED", "MOVED", "MOVED_AWAY", "ATTRIBUTES", "KEYWORDS", "resolve", "old_attribute",
           "renamed_getattr", "renamed_attributes", "renamed_keywords", "install", "KEYS", "REMOVED_KEYS",
           "RenamedKeys", "REMOVED_KEYWORDS", "removed_keywords"]

_GOES = "the old name goes away in the next release"
_SKIP = (os.path.join(os.path.dirname(__file__), "_lazy.py"), __file__)


def _dotted(target: str) -> str:
    return target.replace(":", ".")


def resolve(target: str) -> Any:
    """The object "module:name" names (a lazy package's name loads on this first use)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _learners_frame() -> tuple[FrameType | None, int]:
    """The first frame outside this module, kit/_lazy.py and importlib's bootstrap, and the
    stacklevel that names it from `_warn` (3.12's warnings skip_file_prefixes, by hand; warnings
    itself already steps over importlib's frames without counting them)."""
    f, level = sys._getframe(2), 2  # 0: here, 1: _warn or _missing
    while f is not None:
        if f.f_code.co_filename in _SKIP:
            level += 1
        elif not _importlib(f):
            break
        f = f.f_back
    return f, level


def _importlib(f: FrameType) -> bool:
    name = f.f_code.co_filename  # warnings' own test (_is_internal_frame): frozen or not
    return "importlib" in name and "_bootstrap" in name


def _warn(text: str) -> None:
    # the learner's line, so that "default" shows it once per line: `from package import old` asks twice
    # (importlib's hasattr, then the import), from the same line
    warnings.warn(f"{text}; {_GOES}", FutureWarning, stacklevel=_learners_frame()[1])


def _said(old: str, new: str) -> str:
    moved = old.rpartition(".")[2] == new.rpartition(".")[2]
    return f"{old} {'moved to' if moved else 'was renamed'} {new}"


def _missing(message: str) -> Exception:
    """AttributeError, or ImportError under `from module import name`: CPython's IMPORT_FROM turns a
    module __getattr__'s AttributeError into a bare "cannot import name" and drops the message
    (ceval.c import_from); any other exception reaches the learner as it is."""
    import opcode  # here, not at `import kit`: only a removed name needs it

    frame = _learners_frame()[0]
    if frame is not None and frame.f_code.co_code[frame.f_lasti] == opcode.opmap["IMPORT_FROM"]:
        return ImportError(message)
    return AttributeError(message)


def old_attribute(module: str, name: str) -> Any:
    """What `module.name` is when `name` is not (or no longer) there."""
    __tracebackhide__ = True  # IPython and pytest show the learner's line and the message, not this frame
    if name in RENAMED.get(module, {}):
        target = RENAMED[module][name]
        _warn(_said(f"{module}.{name}", _dotted(target)))
        return resolve(target)
    if name in REMOVED.get(module, {}):
        _, instead = REMOVED[module][name]
        raise _missing(f"{module}.{name} was removed in this release; {instead}")
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


def renamed_getattr(module: str) -> Callable[[str], Any]:
    """The module `__getattr__` of a module that lost names: `__getattr__ = renamed_getattr(__name__)`."""

    def __getattr__(name: str) -> Any:
        __tracebackhide__ = True
        return old_attribute(module, name)

    return __getattr__


def renamed_attributes(cls: str) -> Callable[[Any, str], Any]:
    """A class's `__getattr__` that answers its old attributes (ATTRIBUTES[cls]) with a warning."""
    table, short = ATTRIBUTES[cls], cls.rpartition(":")[2]

    def __getattr__(self: Any, name: str) -> Any:
        if name not in table:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        _warn(f"{short}.{name} was renamed {short}.{table[name]}")
        return functools.reduce(getattr, table[name].split("."), self)

    return __getattr__


def renamed_keywords(where: str) -> Callable[[Any], Any]:
    """Decorate a function, or a class (after @dataclass), to accept its old keywords (KEYWORDS[where])."""
    table, short = KEYWORDS[where], where.rpartition(":")[2]

    def decorate(fn: Any) -> Any:
        target = fn.__init__ if isinstance(fn, type) else fn

        @functools.wraps(target)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in table.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{short}() got {old}= and {new}=: pass {new}= only (the new name)")
                    _warn(f"{short}({old}=...) was renamed {short}({new}=...)")
                    kwargs[new] = kwargs.pop(old)
            return target(*args, **kwargs)

        if isinstance(fn, type):
            fn.__init__ = call
            return fn
        return call

    return decorate


def removed_keywords(where: str) -> Callable[[type], type]:
    """Decorate a class (after @dataclass) to take, and drop with a warning, keywords that this release
    removed (REMOVED_KEYWORDS[where]), by name or in their old positional place."""
    table, short = REMOVED_KEYWORDS[where], where.rpartition(":")[2]

    def decorate(cls: type) -> type:
        target = cls.__init__

        @functools.wraps(target)
        def call(self: Any, *args: Any, **kwargs: Any) -> None:
            for old, (place, now) in table.items():
                given = old in kwargs
                kwargs.pop(old, None)
                if not given and len(args) > place and not callable(args[place]):
                    args, given = args[:place] + args[place + 1:], True
                if given:
                    _warn(f"{short}({old}=...) was removed in this release: {now}")
            target(self, *args, **kwargs)

        cls.__init__ = call  # type: ignore[misc]
        return cls

    return decorate


class RenamedKeys(dict):
    """A result dict (`kind`: a key of KEYS, or a kind with no renamed keys, such as a run record) that
    answers its old keys once its own keys miss; to everything else (==, `in`, iteration, repr,
    json.dumps, pickle) it is the same dict."""

    def __init__(self, kind: str, result: dict[str, Any]) -> None:
        super().__init__(result)
        self._kind = kind

    def __missing__(self, key: Any) -> Any:
        __tracebackhide__ = True
        if key in REMOVED_KEYS.get(self._kind, {}):
            raise KeyError(f'{self._kind}["{key}"] was removed in this release; {REMOVED_KEYS[self._kind][key]}')
        if key not in KEYS.get(self._kind, {}):
            raise KeyError(key)
        path = KEYS[self._kind][key].split(".")
        try:
            value = functools.reduce(operator.getitem, path, self)
        except (KeyError, TypeError):  # this result never had it (one attention's check has no weights)
            raise KeyError(key) from None
        _warn(f'{self._kind}["{key}"] was renamed {self._kind}' + "".join(f'["{k}"]' for k in path))
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self or key not in KEYS.get(self._kind, {}):
            return dict.get(self, key, default)
        try:
            return self[key]
        except KeyError:
            return default


class _MovedLoader:
    """Makes the old module a view of the new one: every name is the new module's own object."""

    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a plain module, filled below

    def exec_module(self, module: ModuleType) -> None:
        old, new = module.__name__, importlib.import_module(self.new)
        _warn(_said(old, self.new))

        def __getattr__(name: str) -> Any:
            if name in RENAMED.get(old, {}) or name in REMOVED.get(old, {}):
                return old_attribute(old, name)
            return getattr(new, name)

        module.__doc__ = f"Moved to {self.new} ({_GOES})."
        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        module.__dir__ = lambda: dir(new)  # type: ignore[method-assign]


class _MovedFinder:
    """Finds the old paths of moved modules (consulted after the real finders, so only for names
    no file answers)."""
    kit_renamed = True

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in MOVED:
            return importlib.machinery.ModuleSpec(fullname, _MovedLoader(MOVED[fullname]))
        if fullname in MOVED_AWAY:
            raise ModuleNotFoundError(f"{fullname} was moved in this release: {MOVED_AWAY[fullname][1]}",
                                      name=fullname)
        return None


def install() -> None:
    """Put the finder on sys.meta_path once (kit/__init__.py; a reload of this module adds none)."""
    if not any(getattr(f, "kit_renamed", False) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
