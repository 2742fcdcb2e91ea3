"""The lab bench's knob table: one declarative row per experiment knob.

Why a table: the panel's controls, the sweep menu and the parsing of typed sweep values all
come from these rows, so a new knob (say a gradient-compression hook) is one more `Knob(...)`
line here, with no change to the panel's code. Rows whose name `ExperimentConfig` does not
have are left out, so the table may run ahead of the engine.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from kit import _renamed

__all__ = ["Knob", "KNOBS", "parse_values", "make_control", "control_value", "config_defaults",
           "experiments_attr",
           "INTERCONNECT_FALLBACK"]

# A dropdown whose value is None shows as empty in ipywidgets 8, so "no value" (e.g. no
# virtual interconnect) travels through the control as this string.
NONE = "none"

# Shown when kit.experiments exposes no preset list; names the engine does not know are
# rejected by ExperimentConfig's validation, and the panel shows that message.
INTERCONNECT_FALLBACK: tuple[str, ...] = ("ethernet_1g", "ethernet_10g", "ethernet_100g",
                                          "pcie4", "nvlink")


def experiments_attr(name: str) -> Any:
    """`kit.experiments.<name>`, also found in `kit.experiments.config` (where it is defined)."""
    import importlib

    for mod in ("kit.experiments", "kit.experiments.config"):
        try:
            value = getattr(importlib.import_module(mod), name, None)
        except ImportError:
            value = None
        if value is not None:
            return value
    raise ImportError(f"kit.experiments has no {name!r} yet")


def _interconnects() -> list[Any]:
    """None (real loopback, no injected delay) plus the engine's link presets."""
    try:
        presets = list(experiments_attr("INTERCONNECTS"))
    except ImportError:
        presets = list(INTERCONNECT_FALLBACK)
    return [None, *presets]


def _choices(name: str) -> Callable[[], Sequence[Any]]:
    """A knob's choice list, read from kit.experiments.config when the panel is built (the lists
    are defined once, beside the config's rules)."""
    return lambda: tuple(experiments_attr(name))


@_renamed.removed_keywords("kit.widgets.knobs:Knob")  # Knob(..., default=...) of the last release, one release
@dataclass(frozen=True)
class Knob:
    """One experiment knob: its config name, how it is shown and how sweep values parse.

    Args:
        name: the `ExperimentConfig` field.
        label: what the panel calls it (with a unit when it has one).
        kind: "choice" (dropdown), "steps" (a slider over fixed values) or "flag" (checkbox).
        options: the allowed values, or a function returning them (looked up when the panel
            is built, e.g. link presets from the engine).
        default: (read-only) `ExperimentConfig`'s default for the field (read from its dataclass fields,
            so the panel starts where a config left alone starts; one copy of each default). The last
            release's `Knob(..., default=...)` still constructs, with a FutureWarning; the value is unused.
        parse: turns one comma-separated token of the sweep field into a value.
        help: tooltip text: what the knob changes, in one line.
    """

    name: str
    label: str
    kind: str
    options: Sequence[Any] | Callable[[], Sequence[Any]] = ()
    parse: Callable[[str], Any] = str
    help: str = ""
    sweepable: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def default(self) -> Any:
        return config_defaults()[self.name]

    def choices(self) -> list[Any]:
        return list(self.options() if callable(self.options) else self.options)


def config_defaults() -> dict[str, Any]:
    """Every `ExperimentConfig` field's default, by name (a field without one is absent)."""
    import dataclasses

    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            for f in dataclasses.fields(experiments_attr("ExperimentConfig"))
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}


def _bool(tok: str) -> bool:
    low = tok.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{tok!r} is not true/false")


def _opt_str(tok: str) -> str | None:
    return None if tok.strip().lower() in ("none", "off", "") else tok.strip()


def _num(tok: str) -> float:
    return float(tok)


KNOBS: tuple[Knob, ...] = (
    Knob("strategy", "strategy", "choice", _choices("STRATEGIES"),
         help="how the work is split across ranks"),
    Knob("workload", "model", "choice", _choices("WORKLOADS"),
         help="which model trains"),
    Knob("model_size", "model size", "choice", _choices("MODEL_SIZES"),
         help="parameters per model: tiny runs fastest, base shows memory effects"),
    Knob("world_size", "world size (ranks)", "steps", (1, 2, 3, 4, 6, 8), int,
         help="processes (ranks); on 2 cores, more than 2 ranks share cores"),
    Knob("mesh", "mesh", "choice", _choices("MESHES"), str,
         help="tp: dp x tp or fsdp x tp; pipeline: pp x dp (torch's init_device_mesh; world size = the product)",
         sweepable=False),
    Knob("batch_size", "batch per rank", "steps", (4, 8, 16, 32, 64, 128, 256), int,
         help="samples each rank reads per step; pipeline, tp, sp, cp and meshes: the whole batch (a mesh's dp splits it)"),
    Knob("precision", "precision", "choice", _choices("PRECISIONS"),
         help="autocast dtype for forward and backward"),
    Knob("bucket_cap_mb", "bucket size (MiB)", "steps", (0.25, 1.0, 5.0, 25.0, 100.0),
         _num, help="DDP gradient bucket cap: fewer, larger all-reduces vs earlier overlap"),
    Knob("grad_accum_steps", "grad accumulation", "steps", (1, 2, 4, 8), int,
         help="micro-steps per optimizer step; all-reduce only on the last (no_sync)"),
    Knob("micro_batches", "pipeline: micro-batches", "steps", (1, 2, 4, 8, 16), int,
         help="pipeline: the batch is cut into m micro-batches; bubble (p-1)/(m+p-1)"),
    Knob("schedule", "pipeline: schedule", "choice", _choices("SCHEDULES"),
         help="pipeline: GPipe (all forwards, then backwards), 1F1B (less memory), interleaved 1F1B (v chunks per rank)"),
    Knob("virtual_stages", "chunks per rank (v)", "steps", (1, 2, 3), int,
         help="interleaved 1F1B: rank r holds stages r, r+p, ...; bubble (p-1)/(v m+p-1), v times the messages"),
    Knob("activation_checkpointing", "activation checkpointing", "flag", (), _bool,
         help="recompute activations in backward: less memory, more compute"),
    Knob("interconnect", "virtual interconnect", "choice", _interconnects, _opt_str,
         help="adds alpha + bytes/beta delay per bucket (emulated link); none = loopback"),
    Knob("reshard_after_forward", "FSDP: reshard after fwd", "flag", (), _bool,
         help="fsdp: free gathered params after forward (ZeRO-3) or keep them to backward (ZeRO-2-like)"),
    Knob("compression", "grad compression", "choice", _choices("COMPRESSIONS"),
         help="DDP comm hook: fp16/bf16 halve the bytes (bf16 needs NCCL), PowerSGD sends low-rank P, Q"),
    Knob("powersgd_rank", "PowerSGD rank", "steps", (1, 2, 4, 8, 16), int,
         help="rank r of PowerSGD's approximation: bytes r(n+m) per n x m gradient"),
    Knob("start_powerSGD_iter", "PowerSGD warm-up", "steps", (2, 5, 10, 50, 100), int,
         help="plain all-reduce for this many steps before compressing"),
    Knob("ps_mode", "param server mode", "choice", _choices("PS_MODES"),
         help="param_server: wait for every worker's gradient (sync) or apply each on arrival (async)"),
    Knob("straggler_ms", "straggler delay (ms)", "steps", (0.0, 10.0, 50.0, 100.0, 200.0), _num,
         help="param_server: rank 1 sleeps this long every step"),
    Knob("zigzag", "cp: zig-zag split", "flag", (), _bool,
         help="cp: rank r holds chunks r and 2t-1-r (equal causal work) instead of one contiguous chunk"),
    Knob("experts", "ep: experts", "steps", (2, 4, 8, 16), int,
         help="ep: experts per MoE layer, split evenly over the ranks"),
    Knob("top_k", "ep: experts per token", "steps", (1, 2), int,
         help="ep: top-k routing (Switch: 1, GShard: 2)"),
    Knob("dataset", "dataset", "choice", _choices("DATASETS"),
         help="samples in RAM, or read from a np.memmap file through the OS page cache"),
    Knob("steps", "measured steps", "steps", (5, 10, 20, 50, 100), int,
         help="steps to time after warm-up", sweepable=False),
)


def parse_values(knob: Knob, text: str) -> list[Any]:
    """Typed values from a sweep field such as "1, 5, 25"; raises ValueError with the token."""
    tokens = [t.strip() for t in text.replace(";", ",").split(",")]
    tokens = [t for t in tokens if t]
    if not tokens:
        raise ValueError(f"give the values of {knob.label} to sweep, comma separated, e.g. "
                         f"{', '.join(str(c) for c in knob.choices()[:3]) or 'true, false'}")
    out = []
    for tok in tokens:
        try:
            out.append(knob.parse(tok))
        except ValueError:
            raise ValueError(f"{tok!r} is not a valid value for {knob.label}") from None
    return out


def _fmt(value: Any, knob: str = "") -> str:
    if value is None:
        return "none (one dimension)" if knob == "mesh" else "none (real loopback)"
    if isinstance(value, dict):  # a mesh: {"dp": 2, "tp": 2} -> "dp2 x tp2"
        return " x ".join(f"{k}{v}" for k, v in value.items())
    return f"{value:g}" if isinstance(value, float) else str(value)


def control_value(value: Any) -> Any:
    """A control's value as the config wants it (the NONE option back to None)."""
    return None if value == NONE else value


def make_control(knob: Knob, default: Any) -> Any:
    """The ipywidgets control for a knob (core widgets that exist in ipywidgets 7.7 and 8)."""
    import ipywidgets as w

    # 165 px holds the longest label ("FSDP: reshard after fwd") in JupyterLab's font; two columns
    # of 360 px fit the notebook's default width beside the file browser (tests/test_browser.py)
    style = {"description_width": "165px"}
    layout = w.Layout(width="360px")
    if knob.kind == "flag":
        ctl = w.Checkbox(value=bool(default), description=knob.label, indent=True,
                         style=style, layout=layout)
        return _tip(ctl, knob.help)
    choices = knob.choices()
    if default not in choices:
        choices = [default, *choices]
    options = [(_fmt(c, knob.name), NONE if c is None else c) for c in choices]
    default = NONE if default is None else default
    if knob.kind == "steps":
        ctl = w.SelectionSlider(options=options, value=default, description=knob.label,
                                continuous_update=False, style=style, layout=layout)
    else:
        ctl = w.Dropdown(options=options, value=default, description=knob.label, style=style,
                         layout=layout)
    return _tip(ctl, knob.help)


def _tip(ctl: Any, text: str) -> Any:
    # ipywidgets 8 renamed description_tooltip to tooltip (the old name warns there).
    ctl.set_trait("tooltip" if ctl.has_trait("tooltip") else "description_tooltip", text)
    return ctl
