"""The `%dist` actions, written once: what each takes (its words and flags, as its usage shows them) and what
it does. The usage line, `%dist help` and the one parser of every action's words read this table, so the
help lists exactly the flags the parser accepts."""
from __future__ import annotations

import re
from typing import NamedTuple

from IPython.core.error import UsageError

__all__ = ["ACTIONS", "Action", "USAGE", "help_text", "parse", "usage"]


class Action(NamedTuple):
    words: str  # what it takes besides flags: "", "NAME...", "FILE.py", "[FILE]"
    flags: tuple[str, ...]  # as the usage shows them: "--world-size N" (required), "[--host H]", "[--force]"
    what: str  # what it does, for `%dist help`

    def valued(self) -> set[str]:
        """The flags that take a value (`--port P`)."""
        return {f for group in self.flags for f in re.findall(r"(--[a-z-]+) [A-Z]", group)}

    def switches(self) -> set[str]:
        """The flags that take none (`[--force]`)."""
        return {f for group in self.flags for f in re.findall(r"(--[a-z-]+)(?:\]| \||$)", group)}


_RANKS = "[--ranks L]"
ACTIONS: dict[str, Action] = {
    "status": Action("", (), "state, backend, pid and memory of each rank"),
    "restart": Action("", ("[--gpus N | --cpus N]", "[--pg-timeout S]", "[--threads T]"),
                      "fresh ranks (every variable on them is lost)"),
    "shutdown": Action("", (), "stop the ranks and free their memory"),
    "where": Action("", (_RANKS,), "each rank's current line, stack and recent collectives (while a cell runs, "
                                   "its second interrupt prints the same)"),
    "push": Action("NAME...", (_RANKS,), "copy kernel variables to the ranks"),
    "pull": Action("NAME...", (_RANKS,), "copy rank variables into the kernel, as {rank: value} (one value with "
                                         "--ranks N)"),
    "export": Action("FILE.py", ("[--force]",), "the cells run so far as a script for torchrun"),
    "attach": Action("", ("--world-size N", "[--host H]", "[--port P]", "[--key-file F]", "[--timeout S]"),
                     "wait for ranks torchrun starts on other machines (prints the command to run there)"),
    "slurm-script": Action("[FILE]", ("--nodes N", "[--gpus-per-node G]", "[--host H]", "[--port P]",
                                      "[--key-file F]", "[--force]"),
                           "an sbatch script that starts those torchrun ranks"),
}


def usage(action: str) -> str:
    """`attach --world-size N [--host H] ...`: the action as its usage and `%dist help` show it."""
    return " ".join(w for w in (action, ACTIONS[action].words, *ACTIONS[action].flags) if w)


USAGE = "usage: %dist " + " | ".join(usage(a) for a in ACTIONS)


def help_text() -> str:
    lines = ["%dist ACTION, where ACTION is one of:"]
    for action, spec in ACTIONS.items():
        lines += [f"  %dist {usage(action)}", f"      {spec.what}"]
    lines.append("A cell runs on the ranks with `%%distributed` (its flags: `%%distributed --help`).")
    return "\n".join(lines)


def parse(action: str, words: list[str]) -> tuple[list[str], dict[str, str], set[str]]:
    """An action's words (after the action) as its names, its flags' values and the switches given;
    `--flag=value` reads as `--flag value`. A flag the action does not take, or one without its value: UsageError
    with the action's usage."""
    spec = ACTIONS[action]
    valued, switches = spec.valued(), spec.switches()
    words = [part for w in words for part in (w.split("=", 1) if w.startswith("--") and "=" in w else [w])]
    names: list[str] = []
    flags: dict[str, str] = {}
    given: set[str] = set()
    i = 0
    while i < len(words):
        word = words[i]
        if word in switches:
            given.add(word)
        elif word in valued:
            if i + 1 >= len(words):
                raise UsageError(f"{word} needs a value. usage: %dist {usage(action)}")
            flags[word] = words[i + 1]
            i += 1
        elif word.startswith("--"):
            raise UsageError(f"unknown flag(s) [{word!r}] for `%dist {action}`. usage: %dist {usage(action)}")
        else:
            names.append(word)
        i += 1
    return names, flags, given
