"""A keyword (or config key) nobody defined: name the one meant. One mechanism for every public entry.

Python says only "got an unexpected keyword argument 'repeat'"; the kit's public functions and its
config say which name was meant (`closest`) and list them all. Pure text, imports nothing of the kit.
"""
from __future__ import annotations

import difflib
import functools
import inspect
from typing import Any, Callable, Iterable, Mapping, TypeVar

__all__ = ["closest", "unknown_keywords_message", "names_unknown_keywords", "passes_keywords_to"]

F = TypeVar("F", bound=Callable[..., Any])
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def closest(word: str, names: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The name `word` most likely misspells (difflib's similarity ratio >= `cutoff`), or None."""
    match = difflib.get_close_matches(word, list(names), n=1, cutoff=cutoff)
    return match[0] if match else None


def unknown_keywords_message(function: str, unknown: Iterable[str], names: list[str],
                             near: Mapping[str, str] | None = None) -> str:
    """`function() has no keyword repeat= (did you mean repeats=?); its keywords: ...`. `near`: a keyword
    spelt as elsewhere -> what to write instead (used when what it names is one of `names`)."""
    hints = []
    for k in sorted(unknown):
        instead = (near or {}).get(k, "")
        meant = closest(k, names)
        hint = instead if instead.split("=")[0] in names else (f"{meant}=" if meant else "")
        hints.append(f"{k}= (did you mean {hint}?)" if hint else f"{k}=")
    return f"{function}() has no keyword {', '.join(hints)}; its keywords: {', '.join(names)}"


def names_unknown_keywords(fn: F | None = None, *, near: Mapping[str, str] | None = None) -> Any:
    """Decorate a public function so a keyword it does not have raises TypeError naming the one meant
    (`near`: a keyword spelt as elsewhere -> what to write instead, as in `unknown_keywords_message`).
    Acts only on such a call (a set difference before the call); the signature, docstring and tab
    completion stay the function's own (functools.wraps: inspect.signature follows __wrapped__), so the
    function declares no `**kwargs` it would refuse anyway. `@names_unknown_keywords` or
    `@names_unknown_keywords(near={...})`."""
    if fn is None:
        return functools.partial(names_unknown_keywords, near=near)
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        raise TypeError(f"{fn.__name__} takes **kwargs: every keyword binds, there is none to name")
    names = [n for n, p in params.items() if p.kind in _NAMED]

    @functools.wraps(fn)
    def checked(*args: Any, **kw: Any) -> Any:
        unknown = kw.keys() - set(names)
        if unknown:
            # from None: the caller's line is the cause, not this wrapper
            raise TypeError(unknown_keywords_message(fn.__name__, unknown, names, near)) from None
        return fn(*args, **kw)

    return checked


def passes_keywords_to(target: Callable[..., Any], *, near: Mapping[str, str] | None = None) -> Callable[[F], F]:
    """Decorate a function whose `**kw` all go on to `target` (a class: its `__init__`), so that help(), `?`
    and IPython's completion (jedi's too: IPython 7.34 and 8) list target's keywords and defaults instead of
    `**kw`. The defaults stay written once, in target: the signature (a `__signature__`, which inspect, pydoc
    and jedi read) is the function's own named parameters, then target's as keyword-only, each with target's
    default, so a change to target shows at once. A keyword neither takes raises TypeError naming the one
    meant, as `names_unknown_keywords` does, before target is called. `@passes_keywords_to(PlanPanel)`."""

    def decorate(fn: F) -> F:
        own = inspect.signature(fn)
        kept = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        if len(kept) == len(own.parameters):
            raise TypeError(f"{fn.__qualname__} takes no **kwargs: there is nothing to pass on")
        taken = {p.name for p in kept}
        passed = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in inspect.signature(target).parameters.values()
                  if p.name not in taken and p.kind in _NAMED]
        signature = own.replace(parameters=kept + passed)
        title = fn.__qualname__.removesuffix(".__init__")  # Cluster(), not Cluster.__init__()
        names = [p.name for p in signature.parameters.values() if p.kind in _NAMED and p.name != "self"]

        @functools.wraps(fn)
        def checked(*args: Any, **kw: Any) -> Any:
            unknown = kw.keys() - set(names)
            if unknown:
                raise TypeError(unknown_keywords_message(title, unknown, names, near)) from None
            return fn(*args, **kw)

        checked.__signature__ = signature  # type: ignore[attr-defined]
        return checked  # type: ignore[return-value]

    return decorate
