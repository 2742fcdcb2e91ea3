"""A cell's source made into lines of an exported script: what `%dist export` does to each cell.

Indenting a `--ranks` cell (code lines only, never the inside of a multi-line string; lines end where
Python ends them, at a lone carriage return too; a form feed in the indentation is honoured), guarding
its own `init_process_group(...)`, finding `destroy_process_group()`, taking out its `from __future__` imports
(hoisted to the script's top), and writing any text that is not code as comment lines nothing can
break out of. Pure text (ast and tokenize); notebook/scripts.py puts the pieces together.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize

__all__ = ["one_line", "commented", "indented", "guard_init", "destroys", "split_future", "names_in"]


def one_line(text: str) -> str:
    """`text` with every character that could end a comment line or break the source (line breaks of
    any kind, NUL, other controls) written as an escape: what follows stays inside the comment."""
    return "".join(c if c.isprintable() or c == "\t" else ascii(c)[1:-1] for c in text)


def commented(text: str) -> str:
    """Every line of `text` as a comment, whatever line breaks it holds."""
    return "\n".join("# " + one_line(line) for line in text.rstrip("\n").split("\n"))


def _string_lines(source: str) -> set[int]:
    """1-based numbers of the lines that continue a multi-line string: indenting them would change it."""
    inside: set[int] = set()
    starts: list[int] = []  # Python >= 3.12 tokenizes f-strings in pieces
    fstart, fend = getattr(tokenize, "FSTRING_START", -1), getattr(tokenize, "FSTRING_END", -1)
    try:  # newline=None: lines end at \r, \r\n and \n, as Python counts them
        for tok in tokenize.generate_tokens(io.StringIO(source, newline=None).readline):
            if tok.type == fstart:
                starts.append(tok.start[0])
            elif tok.type == fend and starts:
                inside.update(range(starts.pop() + 1, tok.end[0] + 1))
            elif tok.type == tokenize.STRING:
                inside.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):  # not Python (it would not compile anyway): indent every line
        return set()
    return inside


def _lines(source: str) -> list[str]:
    """Lines as Python counts them: ended by \n, \r\n or a lone \r (str.splitlines also breaks at form
    feeds, U+2028 and others, which Python's tokenizer does not)."""
    return re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+", source)


def _indent(line: str) -> str:
    """The line one level deeper. A form feed in the indentation resets Python's column count, so the
    part up to the last one is dropped (it counts for nothing) before the four spaces go in."""
    lead = len(line) - len(line.lstrip(" \t\x0c"))
    cut = line.rfind("\x0c", 0, lead) + 1
    return "    " + line[cut:]


def indented(source: str) -> str:
    """The cell one level deeper (a `--ranks` block), its multi-line strings left as they are."""
    strings = _string_lines(source)
    return "".join(line if i in strings or not line.strip() else _indent(line)
                   for i, line in enumerate(_lines(source), start=1))


def _calls(tree: ast.AST, name: str) -> list[ast.Expr]:
    """Statements that are a call of `name` (`dist.name(...)`, `torch.distributed.name(...)`, `name(...)`)."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and name in (getattr(node.value.func, "attr", None), getattr(node.value.func, "id", None))]


def guard_init(source: str) -> str:
    """`dist.init_process_group(...)` statements run only where no default group exists: in the kit the
    group exists before every cell and the call is skipped (with a note); under torchrun the script's
    header made it, and a second call would raise "trying to initialize the default process group twice"."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    lines = _lines(source)
    for node in sorted(_calls(tree, "init_process_group"), key=lambda n: -n.lineno):
        line = lines[node.lineno - 1]
        lead = len(line) - len(line.lstrip(" \t\x0c"))
        if node.col_offset != len(line[:lead].encode()):  # not the first statement on its line: left as it is
            continue
        func = node.value.func  # type: ignore[attr-defined]
        owner = ast.get_source_segment(source, func.value) if isinstance(func, ast.Attribute) else None
        guard = f"if not {owner or 'torch.distributed'}.is_initialized(): "
        lines[node.lineno - 1] = (f"{line[:lead]}# the kit skips this call while its group exists; so does this:\n"
                                  f"{line[:lead]}{guard}{line[lead:]}")
    return "".join(lines)


def destroys(source: str) -> bool:
    """Whether the cell calls `destroy_process_group()` (the script makes the group again after it)."""
    try:
        return bool(_calls(ast.parse(source), "destroy_process_group"))
    except SyntaxError:
        return False


def split_future(source: str) -> tuple[list[str], str]:
    """The names a cell imports from __future__, and the cell without those statements."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return [], source
    lines, names = _lines(source), []
    for node in reversed(tree.body):
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            names[:0] = [a.name for a in node.names]
            span = "".join(lines[node.lineno - 1:node.end_lineno])
            rest = span.replace(ast.get_source_segment(source, node) or "", "pass", 1)
            lines[node.lineno - 1:node.end_lineno] = [] if rest.strip().strip(";").strip() == "pass" else [rest]
    return names, "".join(lines)



def names_in(source: str) -> set[str]:
    """The names a cell reads or writes (none when it is not Python)."""
    try:
        return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    except SyntaxError:
        return set()
