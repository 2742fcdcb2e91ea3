"""The lab bench control panel (ipywidgets 7.7 and 8; no ipympl, no jupyter-ui-poll).

    from kit.widgets import lab_bench
    bench = lab_bench()      # last expression of a cell: the panel shows
    bench.records            # the finished runs, as `kit.run/2` dicts (docs/measuring.md)

Importing `kit.widgets` is cheap; ipywidgets and matplotlib load when a bench is built.
Workers never import this package.
"""
from __future__ import annotations


from kit._lazy import lazy_dir, lazy_getattr

__all__ = ["lab_bench", "LabBench", "KNOBS", "Knob", "prediction_panel", "PredictionPanel", "plan_panel",
           "PlanPanel"]

_LAZY = {"lab_bench": "kit.widgets.bench", "LabBench": "kit.widgets.bench",
         "KNOBS": "kit.widgets.knobs", "Knob": "kit.widgets.knobs",
         "prediction_panel": "kit.widgets.predict_panel", "PredictionPanel": "kit.widgets.predict_panel",
         "plan_panel": "kit.widgets.planner", "PlanPanel": "kit.widgets.planner"}


__getattr__ = lazy_getattr(__name__, _LAZY)
__dir__ = lazy_dir(globals(), _LAZY)
