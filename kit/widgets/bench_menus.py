"""The lab bench's menus follow the configuration: shown knobs, the sweep menu, the mesh menu.

Why: a knob the chosen strategy ignores is noise, and a menu entry the run would refuse is a trap;
relevance.py says which knobs a configuration uses, this mixin keeps the panel in step with it.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from kit.widgets.knobs import control_value
from kit.widgets.relevance import batch_label, fitting_model_size, narrow_mesh_menu, shown

__all__ = ["BenchMenus"]


class BenchMenus:
    """Which controls `LabBench` shows, and what its sweep menu offers."""

    controls: dict[str, Any]
    knobs: Sequence[Any]
    columns: tuple[Any, Any]
    sweep_knob: Any
    sweep_values: Any
    _meshes: list[tuple[str, Any]]
    _sweep_wanted: str | None
    values: Callable[[], dict[str, Any]]
    make_config: Callable[..., Any]
    _say: Callable[..., None]
    _suggested: str | None = None  # the sweep values the kit filled in (re-suggested while the learner kept them)

    def visible(self) -> list[str]:
        """The knobs shown for the current configuration, in the panel's order."""
        raw = {name: control_value(c.value) for name, c in self.controls.items()}
        return [name for name in self.controls if shown(name, raw)]

    def _arrange(self) -> None:
        """Two columns of the shown controls; the sweep menu offers only those."""
        names = self.visible()
        if "batch_size" in self.controls:  # per rank for ddp, the whole batch for a pipeline or tp
            self.controls["batch_size"].description = batch_label(self.controls["strategy"].value)
        if self._meshes:
            narrow_mesh_menu(self.controls["mesh"], self._meshes, self.controls["strategy"].value)
        self._fit_model_size()
        half = (len(names) + 1) // 2
        self.columns[0].children = [self.controls[n] for n in names[:half]]
        self.columns[1].children = [self.controls[n] for n in names[half:]]
        self._sweep_menu(names)
        if self._suggested is not None and self.sweep_values.value == self._suggested:  # not typed: follow the config
            self._suggested = self.sweep_values.value = self._suggestion(self.sweep_knob.value)

    def _fit_model_size(self) -> None:
        """tp/sp (or a tp mesh) over ranks that cannot split the chosen model's heads: move to the
        smallest model size the split accepts, and say so, rather than leave a choice the run refuses."""
        if "model_size" not in self.controls:
            return
        values = self.values()
        new = fitting_model_size(values)
        if new is None:
            return
        old = values["model_size"]
        self.controls["model_size"].value = new  # runs _arrange again, which finds it fits
        self._say(f"Model size changed from {old} to {new}: {values['strategy']} splits the attention heads and hidden "
                  f"size over its ranks, and {old}'s do not divide evenly.")

    def _sweep_menu(self, names: list[str]) -> None:
        """Offer the shown sweepable knobs; a knob hidden by a strategy switch comes back with it."""
        options = [(self.controls[k.name].description, k.name) for k in self.knobs if k.sweepable and k.name in names]
        if list(self.sweep_knob.options) == options:
            return
        before, typed = self.sweep_knob.value, self.sweep_values.value
        wanted = self._sweep_wanted if self._sweep_wanted in names else before
        keep = wanted if wanted in names else options[0][1]
        if before not in names:
            self._sweep_wanted = before
        self.sweep_knob.options = options  # resets the value, which suggests new sweep values
        self.sweep_knob.value = keep
        if keep == self._sweep_wanted:
            self._sweep_wanted = None
        if keep == before:
            self.sweep_values.value = typed  # same knob: keep what the learner typed

    def _suggest_values(self, change: Mapping[str, Any]) -> None:
        self._suggested = self.sweep_values.value = self._suggestion(change["new"])

    def _suggestion(self, name: str) -> str:
        """Up to 4 of the knob's choices that the current configuration accepts: a sweep is refused as a
        whole when one value is (ddp's world size 1 was offered, and the sweep refused)."""
        knob = next(k for k in self.knobs if k.name == name)
        opts = list(knob.choices() or [False, True])
        fine = [v for v in opts if self._accepts(name, v)] or opts
        return ", ".join("none" if v is None else str(v) for v in fine[:4])

    def _accepts(self, name: str, value: Any) -> bool:
        try:
            self.make_config(**{name: value})
        except ValueError:
            return False
        except Exception:  # the panel is still being built: the run will judge
            return True
        return True
