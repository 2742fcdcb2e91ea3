"""Which knobs a configuration uses, so the lab bench shows only those (one thing at a time).

Why a table beside the knob table: a knob that the chosen strategy ignores (DDP's bucket size
under FSDP) or refuses (PowerSGD without DDP, a straggler without a parameter server) is noise
on the panel, and a hidden knob keeps its default so it can never make a run invalid. The
strategies listed for each knob are the ones whose code reads it (kit/experiments) and whose
config accepts it (ExperimentConfig and beyond_config); tests/test_widgets.py checks the latter.
"""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, Mapping

from kit.experiments.choices import GLOBAL_BATCH, HAND_WRITTEN, KNOB_OWNERS, MESH_DIMS, MODEL_SIZES, STRATEGIES
from kit.experiments.config_parallel import split_fits, tp_size

__all__ = ["USED_BY", "NEEDS", "IMPLIED", "shown", "config_values", "batch_label", "narrow_mesh_menu",
           "fitting_model_size"]

_NOT_HAND_WRITTEN = tuple(s for s in STRATEGIES if s not in HAND_WRITTEN)

# knob -> the strategies that use it (a knob not listed applies to every strategy): the config's
# KNOB_OWNERS, and the knobs that the hand-written parallelisms fix (they split heads, sequence or
# experts of the gpt, written for fp32: IMPLIED) and the mesh's owners
USED_BY: dict[str, tuple[str, ...]] = {
    **KNOB_OWNERS,
    "workload": _NOT_HAND_WRITTEN,
    "precision": _NOT_HAND_WRITTEN,
    "activation_checkpointing": _NOT_HAND_WRITTEN,
    "mesh": tuple(MESH_DIMS),  # tp (dp x tp, fsdp x tp), pipeline (pp x dp) and fsdp (dp x fsdp)
}
# knob -> (another knob, the value it needs): PowerSGD's settings matter only with PowerSGD on
NEEDS: dict[str, tuple[str, Any]] = {
    "powersgd_rank": ("compression", "powersgd"),
    "start_powerSGD_iter": ("compression", "powersgd"),
    "virtual_stages": ("schedule", "interleaved_1f1b"),
}

# strategy -> values a hidden knob must take for it (single is one process: world_size=1)
IMPLIED: dict[str, dict[str, Any]] = {**{s: {"world_size": 1} for s in STRATEGIES
                                         if s not in KNOB_OWNERS["world_size"]},
                                      **{s: {"workload": "gpt", "precision": "fp32", "activation_checkpointing": False}
                                         for s in HAND_WRITTEN}}


def shown(knob: str, values: Mapping[str, Any]) -> bool:
    """True when the configuration in `values` (knob -> value) uses `knob`."""
    strategy = values.get("strategy")
    if strategy is not None and strategy not in USED_BY.get(knob, (strategy,)):
        return False
    if knob == "world_size" and values.get("mesh") and shown("mesh", values):
        return False  # the mesh's product is the world size
    if knob in NEEDS:
        other, wanted = NEEDS[knob]
        return values.get(other) == wanted and shown(other, values)
    return True


def config_values(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration to run: the knobs in use as set, the others at their defaults (or what the
    strategy implies), so a knob left set under another strategy cannot make this run invalid."""
    implied = IMPLIED.get(values.get("strategy"), {})
    out = {k: v if shown(k, values) else implied.get(k, defaults[k]) for k, v in values.items()}
    if out.get("mesh"):
        out["world_size"] = math.prod(out["mesh"].values())
    return out


def batch_label(strategy: Any) -> str:
    """What batch_size means for this strategy (ExperimentConfig.global_batch_size): the pipeline and
    the strategies that split the model read one batch together (a mesh's dp splits it), the others
    each read batch_size samples."""
    return "batch (global)" if strategy in GLOBAL_BATCH else "batch per rank"


def narrow_mesh_menu(control: Any, all_options: list[tuple[str, Any]], strategy: Any) -> None:
    """Offer only the meshes this strategy composes (tp: dp x tp, fsdp x tp; pipeline: pp x dp), so the
    menu never holds a choice the run would refuse; a mesh that no longer fits falls back to none."""
    opts = [(lb, v) for lb, v in all_options
            if not isinstance(v, dict) or tuple(v) in MESH_DIMS.get(strategy, ())]
    if list(control.options) != opts:
        keep = control.value if any(v == control.value for _, v in opts) else opts[0][1]
        control.options = opts
        control.value = keep


def fitting_model_size(values: Mapping[str, Any]) -> str | None:
    """The smallest model_size whose heads and hidden size the configuration's tp/sp split divides,
    when the chosen one does not (config_parallel.split_fits says which); None when it fits or none does."""
    strategy, size = values.get("strategy"), values.get("model_size")
    if size not in MODEL_SIZES or not values.get("world_size"):
        return None
    ranks = tp_size(SimpleNamespace(mesh=values.get("mesh") or None, world_size=values["world_size"]))
    if split_fits(strategy, size, ranks):
        return None
    return next((s for s in MODEL_SIZES if split_fits(strategy, s, ranks)), None)
