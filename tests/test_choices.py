"""choices.py's strategy groups hold each fact about a strategy once; these tests catch a strategy
added to one place and forgotten in another (docs/architecture.md, "Adding a strategy")."""
from __future__ import annotations

import dataclasses
import re

import pytest

from kit.experiments import choices
from kit.experiments.config import INTERCONNECTS, ExperimentConfig, ExperimentConfigError
from kit.experiments.strategies import registry
from kit.experiments.theory.local_time import LOCAL_STRATEGIES
from kit.experiments.theory.parallel_memory import PARALLEL_KINDS

GROUPS = {name: getattr(choices, name) for name in ("ONE_PROCESS", "SHARDS_DATA", "STAGED", "SHARDED", "MODEL_SPLIT",
                                                     "HAND_WRITTEN", "SPLITS_WEIGHTS", "SPLITS_SEQUENCE", "GLOBAL_BATCH",
                                                     "RANK0_SERVES", "NEEDS_TWO_RANKS", "GRAD_ACCUM", "VIRTUAL_LINK",
                                                     "DDP_BUCKETS")}


def test_every_group_names_only_strategies_the_config_has() -> None:
    """A renamed or misspelt strategy in a group would silently leave it out of that behaviour."""
    named = {**GROUPS, "MESH_DIMS": tuple(choices.MESH_DIMS), "DEFAULT_STRATEGY": (choices.DEFAULT_STRATEGY,),
             **{f"KNOB_OWNERS[{k!r}]": v for k, v in choices.KNOB_OWNERS.items()}}
    stray = {name: sorted(set(members) - set(choices.STRATEGIES)) for name, members in named.items()}
    assert not {k: v for k, v in stray.items() if v}
    fields = {f.name for f in dataclasses.fields(ExperimentConfig)}
    assert set(choices.KNOB_OWNERS) <= fields


def test_the_groups_agree_with_the_classes_that_run_them() -> None:
    """registry.py says which class runs a strategy; choices.py what the config and theory know about it.
    A strategy added to one and not the other fails here, before any rank would."""
    assert set(registry.STRATEGY_CLASSES) == set(choices.STRATEGIES)
    assert set(registry.HAND_PARTS) == set(choices.HAND_WRITTEN)
    assert PARALLEL_KINDS is choices.HAND_WRITTEN  # one copy: the memory formulas' kinds are the group itself
    assert {s for s, where in registry.STRATEGY_CLASSES.items() if where.startswith("hand_parallel:")} \
        == set(choices.HAND_WRITTEN)
    assert set(registry.ON_A_MESH) == set(choices.MESH_DIMS)
    assert set(registry.WITH_COMPRESSION) == set(choices.KNOB_OWNERS["compression"])
    assert set(LOCAL_STRATEGIES) <= set(choices.STRATEGIES)


def _base(strategy: str) -> dict:
    """A config of `strategy` the config accepts with every knob at its default."""
    kw: dict = {"strategy": strategy, "world_size": 1 if strategy not in choices.KNOB_OWNERS["world_size"] else 2}
    if strategy in choices.HAND_WRITTEN:
        kw["workload"] = "gpt"
    ExperimentConfig(**kw)
    return kw


# A value other than the default for each knob a strategy must own; `with` is what it needs beside it.
SETTINGS: dict[str, tuple[dict, dict]] = {
    "bucket_cap_mb": ({"bucket_cap_mb": 5.0}, {}),
    "grad_accum_steps": ({"grad_accum_steps": 2}, {}),
    "interconnect": ({"interconnect": next(iter(INTERCONNECTS))}, {}),
    "find_unused_parameters": ({"find_unused_parameters": True}, {}),
    "compression": ({"compression": "fp16"}, {}),
    "powersgd_rank": ({"powersgd_rank": 2}, {"compression": "powersgd"}),
    "start_powerSGD_iter": ({"start_powerSGD_iter": 5}, {"compression": "powersgd"}),
    "reshard_after_forward": ({"reshard_after_forward": False}, {}),
    "ps_mode": ({"ps_mode": "async"}, {}),
    "straggler_ms": ({"straggler_ms": 5.0}, {}),
    "micro_batches": ({"micro_batches": 2}, {}),
    "schedule": ({"schedule": "1f1b"}, {}),
    "virtual_stages": ({"virtual_stages": 2}, {"schedule": "interleaved_1f1b"}),
    "zigzag": ({"zigzag": False}, {}),
    "experts": ({"experts": 8}, {}),
    "top_k": ({"top_k": 1}, {}),
    "world_size": ({"world_size": 2}, {}),
}
# The knobs config_rules refuses away from their owners (the others are ignored there, as torch ignores them).
REFUSED_ELSEWHERE = {"grad_accum_steps", "interconnect", "find_unused_parameters", "compression", "powersgd_rank",
                     "start_powerSGD_iter", "reshard_after_forward", "ps_mode", "straggler_ms", "virtual_stages",
                     "world_size"}


def test_every_owned_knob_has_a_setting_here() -> None:
    assert set(SETTINGS) == set(choices.KNOB_OWNERS)


@pytest.mark.parametrize("knob", sorted(SETTINGS))
def test_a_knob_is_accepted_by_its_owners_and_refused_where_the_rules_restrict_it(knob: str) -> None:
    """KNOB_OWNERS against the config: each owner takes the knob, and a restricted knob set under any
    other strategy is refused with a message that names an owner."""
    value, beside = SETTINGS[knob]
    for strategy in choices.STRATEGIES:
        kw = {**_base(strategy), **beside, **value}
        if strategy in choices.KNOB_OWNERS[knob]:
            ExperimentConfig(**kw)
        elif knob in REFUSED_ELSEWHERE:
            with pytest.raises(ExperimentConfigError) as e:
                ExperimentConfig(**kw)
            if knob != "world_size":  # a strategy that takes no world size: "set world_size=1"
                assert any(re.search(rf"\b{s}\b", str(e.value)) for s in choices.KNOB_OWNERS[knob]), str(e.value)
