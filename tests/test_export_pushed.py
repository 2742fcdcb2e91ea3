"""`%dist export` writes what `%dist push` sent, where it was sent: literals as assignments, anything else as a
line that stops the script there, naming the value. Before, the script had none of them: a cell using a pushed
`lr` failed under torchrun with NameError (tests/test_export.py runs such a script under torchrun)."""
from __future__ import annotations

import pytest

from kit.notebook.pushed import push_record
from kit.notebook.scripts import CellRecord, export_script


def _run(text: str) -> dict:
    """The script's cells, without its process group: what they assign."""
    body = text[text.index("# ---"):text.index("if dist.is_initialized():")]
    ns = {"rank": 0}
    exec(compile(body, "train.py", "exec"), ns)
    return ns


def test_pushed_literals_become_assignments_in_the_order_they_came() -> None:
    values = {"lr": 0.05, "steps": 20, "name": "it's \"quoted\"", "cfg": {"a": [1, 2.5, (3, None)]},
              "gone": float("nan"), "big": float("-inf"), "flag": True}
    cells = [CellRecord("In [1]", "x = 1", "--cpus 2", True),
             push_record("In [2]", list(values), values, None, " ".join(values)),
             CellRecord("In [3]", "y = lr * steps", "", True)]
    text = export_script(cells, "train.py", 2)
    assert "# --- In [2] (%dist push lr steps name cfg gone big flag): the values the kernel sent then ---\n" \
           "lr = 0.05\nsteps = 20\n" in text
    assert text.index("lr = 0.05") < text.index("y = lr * steps")
    ns = _run(text)
    assert ns["y"] == 1.0 and ns["name"] == values["name"] and ns["cfg"] == values["cfg"] and ns["flag"] is True
    assert ns["gone"] != ns["gone"] and ns["big"] == float("-inf")


def test_a_pushed_value_a_script_cannot_hold_stops_it_there_naming_it() -> None:
    class Model:
        pass
    values = {"lr": 0.1, "model": Model(), "table": list(range(5000))}
    rec = push_record("In [4]", ["lr", "model", "table"], values, (0,), "lr model table --ranks 0")
    assert rec.unwritable == ("model", "table")  # an object; a literal too long to be a setting
    text = export_script([rec], "train.py", 2)
    assert "if rank in (0,):\n    lr = 0.1\n    raise NameError(" in text
    with pytest.raises(NameError, match=r"^model came from the kernel by `%dist push` \(In \[4\]\): a Model, which "
                                        r"a script cannot hold as a literal; define model here"):
        _run(text)
    # a replaced push (`%dist restart` after it) is left out like its cells: the new ranks never had it
    rec.replaced = True
    assert "# lr = 0.1" in export_script([rec], "train.py", 2)


def test_a_long_pushed_value_is_never_written_out_and_parsed_to_find_it_too_long(monkeypatch) -> None:
    """A pushed list of a million numbers: before, its repr (megabytes) was built and parsed back whole, after
    the push, in the kernel (the parser's nodes take many times the text: a risk in a 1 GiB notebook), only to
    be found too long for a script."""
    import ast

    from kit.notebook import pushed

    parsed: list[int] = []
    real = ast.literal_eval

    def literal_eval(text: str) -> object:
        parsed.append(len(text))
        if len(text) > pushed.PUSH_LITERAL_MAX_CHARS:
            raise AssertionError(f"parsed {len(text):,} characters")
        return real(text)

    monkeypatch.setattr(pushed.ast, "literal_eval", literal_eval)
    values = {"big": list(range(1_000_000)), "nested": [[0] * 3000] * 4, "lr": 0.05}
    rec = push_record("In [2]", list(values), values, None, "big nested lr")
    assert rec.unwritable == ("big", "nested") and "lr = 0.05" in rec.source and parsed == [4]
    assert "big came from the kernel by `%dist push` (In [2]): a list, too long to write into a script (over 10,000 " \
           "characters); define big here" in rec.source


def test_a_cell_using_display_runs_as_a_script() -> None:
    """`display(x)` works in a cell (the ranks define it: shown in the notebook); the script had no `display`,
    so it stopped there with NameError under torchrun. Now it prints the objects; a cell's own import wins."""
    cells = [CellRecord("In [1]", "x = 2\ndisplay(x * 21)", "--cpus 2", True)]
    text = export_script(cells, "train.py", 2)
    assert "def display(*objs, **kwargs):" in text
    body = text[text.index("def display"):text.index("if dist.is_initialized():")]
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(body, "train.py", "exec"), {"rank": 0})
    assert out.getvalue() == "42\n"
    assert "def display" not in export_script([CellRecord("In [1]", "print(1)", "", True)], "train.py", 2)


def test_exports_reply_names_as_assignments_only_the_values_the_script_assigns(tmp_path, capsys) -> None:
    """The export's reply names as assignments only the pushed values the script assigns ("the pushed lr"): a
    value that is not a Python literal (w) is said apart, with where the script stops, never listed as assigned."""
    from types import SimpleNamespace

    from kit.notebook.scale_out import run_scale_out

    values = {"lr": 0.05, "w": object()}
    magics = SimpleNamespace(cluster=None, history=[push_record("In [1]", list(values), values, None, "lr w"),
                                                    CellRecord("In [2]", "y = lr", "", True)])
    run_scale_out(magics, "export", [str(tmp_path / "train.py")], {}, False)
    said = capsys.readouterr().out
    assert "1 of 1 cell(s) and the pushed lr as assignments;" in said, said
    assert ". w is not a Python literal: the script stops where it is pushed, saying so; define it there" in said
