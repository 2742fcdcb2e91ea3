"""A notebook saved against the previous release still runs for one release: each old name
(kit/_renamed.py) gives the same object as its new name with a FutureWarning naming the new one at
the learner's line, a removed name fails saying what to call instead (under `from m import x` too),
a moved module still imports, and none of it shows in dir(), __all__ or a signature. A result dict's
old key (a check_* result's, Layout.as_dict()'s) reads its new key with a FutureWarning, and the dict
is otherwise the same to ==, json.dumps and pickle. Every table entry must point at a live name or
key, so the table cannot rot."""
from __future__ import annotations

import importlib
import inspect
import json
import pickle
import re
import sys
import warnings
from typing import Iterator

import pytest

from kit import _renamed
from kit._renamed import ATTRIBUTES, KEYWORDS, MOVED, MOVED_AWAY, REMOVED, RENAMED, resolve

GOES = "the old name goes away in the next release"
RENAMED_ENTRIES = sorted((m, old, new) for m, names in RENAMED.items() for old, new in names.items())
REMOVED_ENTRIES = sorted((m, old, new) for m, names in REMOVED.items() for old, (new, _) in names.items())


@pytest.fixture(autouse=True)
def _forget_old_modules() -> Iterator[None]:
    # importing an old path leaves it in sys.modules and on its parent package: later imports would not
    # warn again, and other tests would see an attribute that is not there in a fresh kernel
    yield
    for old in MOVED:
        if sys.modules.pop(old, None) is not None:
            parent, _, leaf = old.rpartition(".")
            vars(sys.modules[parent]).pop(leaf, None)


def _old_module(name: str):
    with warnings.catch_warnings():  # the moved modules' own import warning is tested below
        warnings.simplefilter("ignore", FutureWarning)
        return importlib.import_module(name)


@pytest.mark.parametrize("module,old,new", RENAMED_ENTRIES)
def test_an_old_name_warns_and_is_the_new_names_object(module, old, new):
    obj = resolve(new)  # the new name lives: the table cannot rot
    mod = _old_module(module)
    assert old not in vars(mod), f"{module}.{old} is a real name again: drop its table entry"
    with pytest.warns(FutureWarning) as caught:
        got = getattr(mod, old)
    assert got is obj
    said = str(caught[0].message)
    assert f"{module}.{old}" in said and new.replace(":", ".") in said and GOES in said
    assert caught[0].filename == __file__  # the learner's line, not the kit's


@pytest.mark.parametrize("module,old,new", RENAMED_ENTRIES)
def test_from_old_import_works_and_old_names_stay_out_of_dir_and_all(module, old, new):
    mod = _old_module(module)
    assert old not in dir(mod) and old not in getattr(mod, "__all__", ())  # tab completion offers new names only
    namespace: dict = {}
    with pytest.warns(FutureWarning, match=GOES):
        exec(f"from {module} import {old}", namespace)
    assert namespace[old] is resolve(new)


def test_from_a_lazy_package_import_old_warns_once_at_the_learners_line():
    # `from package import name` asks the package twice (importlib's hasattr, then the import itself):
    # both warnings name the same line, so Python's default filter shows one
    code = compile("from kit.experiments import ring_allreduce_s\n", "learner_cell.py", "exec")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        exec(code, {"__name__": "learner_cell"})
    ours = [w for w in caught if GOES in str(w.message)]
    assert [(w.filename, w.lineno, w.category) for w in ours] == [("learner_cell.py", 1, FutureWarning)]


@pytest.mark.parametrize("module,old,new", REMOVED_ENTRIES)
def test_a_removed_name_says_what_to_call_instead(module, old, new):
    replacement = resolve(new)  # the name the message points at lives
    mod = _old_module(module)
    leaf = new.rpartition(":")[2]
    with pytest.raises(AttributeError, match=f"{module}.{old} was removed in this release") as raised:
        getattr(mod, old)
    assert leaf in str(raised.value)
    assert not hasattr(mod, old) and old not in dir(mod)
    # CPython drops a module __getattr__'s AttributeError message under `from m import x`: ImportError keeps it
    with pytest.raises(ImportError, match=f"{module}.{old} was removed in this release") as raised:
        exec(f"from {module} import {old}", {})
    assert leaf in str(raised.value) and replacement is not None


def test_a_removed_name_in_milliseconds_says_the_unit_changed():
    with pytest.raises(ImportError, match=r"link_allreduce_s\(link, nbytes, world_size\) \* 1e3: it gives seconds"):
        exec("from kit.experiments import predict_allreduce_ms", {})


def test_a_name_that_never_was_is_a_plain_attribute_error():
    import kit.experiments
    import kit.experiments.theory.links as links

    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        kit.experiments.no_such_name  # noqa: B018
    assert not hasattr(links, "no_such_name")


@pytest.mark.parametrize("old,new", sorted(MOVED.items()))
def test_a_moved_module_imports_warns_and_gives_the_new_modules_objects(old, new):
    target = importlib.import_module(new)
    with pytest.warns(FutureWarning, match=f"{old} (moved to|was renamed) {new}; {GOES}"):
        mod = importlib.import_module(old)
    public = getattr(target, "__all__", [n for n in vars(target) if not n.startswith("_")])
    assert public and all(getattr(mod, n) is getattr(target, n) for n in public)
    assert dir(mod) == dir(target)
    namespace: dict = {}
    exec(f"from {old} import {public[0]}", namespace)
    assert namespace[public[0]] is getattr(target, public[0])


def test_from_a_package_import_a_moved_module_works():
    from kit.experiments.parallel import tensor

    with pytest.warns(FutureWarning, match="kit.experiments.strategies.tensor_parallel was renamed"):
        from kit.experiments.strategies import tensor_parallel
    assert tensor_parallel.check_tp is tensor.check_tp
    # a name that left the module for another one still answers, naming where it went
    with pytest.warns(FutureWarning) as caught:
        from kit.experiments.strategies.mesh import fsdp_over
    assert fsdp_over is resolve("kit.experiments.parallel.mesh:apply_fsdp")
    assert [str(w.message).partition(";")[0] for w in caught] == [
        "kit.experiments.strategies.mesh moved to kit.experiments.parallel.mesh",
        "kit.experiments.strategies.mesh.fsdp_over was renamed kit.experiments.parallel.mesh.apply_fsdp"]


@pytest.mark.parametrize("old,entry", sorted(MOVED_AWAY.items()))
def test_a_module_moved_without_an_alias_says_where_it_went(old, entry):
    new, _ = entry
    assert callable(resolve(new))
    with pytest.raises(ModuleNotFoundError, match=f"{old} was moved in this release") as raised:
        importlib.import_module(old)
    assert new.partition(":")[0] in str(raised.value)
    from kit.widgets import plan_panel  # the documented import still gives the function, not a module

    assert callable(plan_panel) and not inspect.ismodule(plan_panel)


def _instances():
    from kit.experiments import cluster_spec
    from kit.experiments.theory.layout_memory import ParallelConfig
    from kit.experiments.theory.models import MODELS
    from kit.experiments.theory.plan import layout_of

    pc = ParallelConfig(tp=2, pp=2, dp=2, micro_batches=4, zero=1)
    return {"ParallelConfig": pc, "Layout": layout_of(MODELS["gpt2"], cluster_spec(), pc, 1024)}


@pytest.mark.parametrize("cls,old,new", sorted((c, o, n) for c, t in ATTRIBUTES.items() for o, n in t.items()))
def test_an_old_attribute_warns_and_reads_the_new_one(cls, old, new):
    owner = resolve(cls)
    obj = _instances()[owner.__name__]
    assert isinstance(obj, owner)
    want = obj
    for part in new.split("."):
        want = getattr(want, part)  # the new path lives
    with pytest.warns(FutureWarning, match=f"{owner.__name__}.{old} was renamed {owner.__name__}.{new}") as caught:
        assert getattr(obj, old) == want
    assert caught[0].filename == __file__
    assert old not in dir(obj)
    with pytest.raises(AttributeError):
        obj.no_such_attribute  # noqa: B018


def test_the_old_keyword_is_accepted_with_a_warning_and_hidden_from_the_signature():
    from kit.experiments.theory.layout_memory import ParallelConfig

    for where, table in KEYWORDS.items():
        params = inspect.signature(resolve(where)).parameters
        assert all(new in params and old not in params for old, new in table.items()), where
    with pytest.warns(FutureWarning, match=r"ParallelConfig\(microbatches=...\) was renamed") as caught:
        pc = ParallelConfig(pp=2, microbatches=8)
    assert caught[0].filename == __file__
    assert pc == ParallelConfig(pp=2, micro_batches=8)
    with pytest.raises(TypeError, match="pass micro_batches= only"):
        ParallelConfig(microbatches=2, micro_batches=2)


def test_a_knob_built_the_last_releases_way_still_builds_with_a_warning():
    """Knob lost its `default` field (it reads ExperimentConfig's); before this shim Knob(..., default=x)
    raised TypeError and Knob(name, label, kind, options, x) made x the sweep parser, failing later."""
    import warnings

    from kit.widgets.knobs import Knob, parse_values

    now = Knob("batch_size", "batch per rank", "steps", (16, 32), int, "rows per rank")
    said = r"Knob\(default=...\) was removed in this release: the panel starts at ExperimentConfig's default"
    for old in (lambda: Knob("batch_size", "batch per rank", "steps", (16, 32), 32, int, "rows per rank"),
                lambda: Knob("batch_size", "batch per rank", "steps", (16, 32), parse=int, help="rows per rank",
                             default=32)):
        with pytest.warns(FutureWarning, match=said) as caught:
            knob = old()
        assert caught[0].filename == __file__  # the learner's line
        assert knob == now and knob.default == 32 and parse_values(knob, "16, 32") == [16, 32]
    assert "default" not in inspect.signature(Knob).parameters
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # today's way never warns, a callable in the old place is the parser
        assert Knob("batch_size", "batch per rank", "steps", (16, 32), int, "rows per rank") == now


def test_the_moved_module_finder_is_installed_once():
    _renamed.install()
    _renamed.install()
    assert sum(bool(getattr(f, "kit_renamed", False)) for f in sys.meta_path) == 1


# -- result keys: a check_* result and Layout.as_dict() answer the previous release's keys ---------------
def _check_result():
    from kit.experiments.parallel.reference import check_result

    bytes_ = {"tp/all_reduce": {"calls": 4}}
    return check_result({"weights": 3e-7, "loss": 5e-8}, bytes_, dict(bytes_), weights_moved=0.25, impl="hand", tp=2,
                        losses=[4.1, 3.9], ref_losses=[4.1, 3.9])


def _results():
    return {"check_*()": _check_result(), "Layout.as_dict()": _instances()["Layout"].as_dict()}


@pytest.mark.parametrize("kind,old,new", sorted((k, o, n) for k, t in _renamed.KEYS.items() for o, n in t.items()))
def test_an_old_result_key_warns_and_reads_the_new_one(kind, old, new):
    result = _results()[kind]
    want = result
    for part in new.split("."):
        want = want[part]  # the new path lives in what the kit returns: the table cannot rot
    assert old not in result, f"{kind} has {old!r} again: drop its table entry"
    path = "".join(f'["{k}"]' for k in new.split("."))
    with pytest.warns(FutureWarning, match=re.escape(f'{kind}["{old}"] was renamed {kind}{path}; {GOES}')) as caught:
        assert result[old] == want
    assert caught[0].filename == __file__  # the learner's line
    with pytest.warns(FutureWarning):
        assert result.get(old) == want
    assert old not in result and old not in list(result) and old not in json.loads(json.dumps(result))


def test_a_result_with_old_keys_is_the_same_plain_dict_to_json_equality_in_get_and_pickle():
    for kind, result in _results().items():
        plain = dict(result)
        assert type(plain) is dict and result == plain and plain == result and repr(result) == repr(plain)
        assert json.dumps(result, sort_keys=True) == json.dumps(plain, sort_keys=True)  # results files unchanged
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a new key, `in` and .get of an unknown key never warn
            assert all(result.get(k) is plain[k] and k in result for k in plain)
            assert result.get("no_such_key", "dflt") == "dflt" and "no_such_key" not in result
        back = pickle.loads(pickle.dumps(result))  # how a rank's result reaches the kernel
        assert back == plain and type(back) is type(result)
        old = next(iter(_renamed.KEYS[kind]))
        with pytest.warns(FutureWarning, match=re.escape(kind)):
            back[old]  # noqa: B018  (still answers after the trip)


def test_an_unknown_key_is_a_plain_key_error_and_an_old_key_this_result_never_had_too():
    result = _check_result()
    with pytest.raises(KeyError) as raised:
        result["no_such_key"]  # noqa: B018
    assert raised.value.args == ("no_such_key",)
    from kit.experiments.parallel.reference import check_result

    attention = check_result({"out": 1e-7, "grad_q": 2e-7}, {}, {})  # check_ring_attention's shape: no weights
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(KeyError) as raised:
            attention["weights_max_abs_diff"]  # noqa: B018
        assert raised.value.args == ("weights_max_abs_diff",) and attention.get("weights_max_abs_diff") is None


def test_a_removed_result_key_says_what_to_read_instead(monkeypatch):
    # no key of this release lacks a one-to-one replacement; the table's other half, for the next that does
    monkeypatch.setitem(_renamed.REMOVED_KEYS, "check_*()", {"old_total": 'read res["diffs"] and sum its values'})
    said = 'check_*()["old_total"] was removed in this release; read res["diffs"]'
    with pytest.raises(KeyError, match=re.escape(said)):
        _check_result()["old_total"]  # noqa: B018
