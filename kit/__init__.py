"""distributed-kit: run, measure and compare distributed PyTorch from Jupyter cells.

`import kit` is cheap: it imports neither torch, IPython, ipywidgets nor matplotlib.
Workers import `kit` too, so nothing here may pull a front-end library in.
"""
from __future__ import annotations

from typing import Any

from kit import _renamed
from kit._lazy import lazy_dir, lazy_getattr

_renamed.install()  # the old paths of moved modules import for one release (kit/_renamed.py)

__version__ = "0.1.0"
__all__ = [
    "Cluster",
    "LaunchConfig",
    "CellResult",
    "KitError",
    "CellError",
    "current_cluster",
    "attach_command",
    "load_ipython_extension",
    "unload_ipython_extension",
    "__version__",
    "experiments",
    "plots",
    "widgets",
]

_LAZY = {
    "Cluster": "kit.engine.cluster",
    "CellResult": "kit.engine.cluster",
    "LaunchConfig": "kit.config",
    "KitError": "kit.errors",
    "CellError": "kit.errors",
    "attach_command": "kit.engine.attach",  # the torchrun line that attaches other machines' ranks (%dist attach)
    # the learner's packages, so `import kit` then `kit.widgets.plan_panel()` (and completing `kit.widgets.`)
    # works; each is itself lazy, so this imports no torch, ipywidgets or matplotlib
    "experiments": "kit.experiments:",
    "plots": "kit.plots:",
    "widgets": "kit.widgets:",
}


__getattr__ = lazy_getattr(__name__, _LAZY)
__dir__ = lazy_dir(globals(), _LAZY)


def current_cluster() -> Any:
    """The ranks `%%distributed` started in this kernel (None if none), to share with experiments."""
    import sys

    magics = sys.modules.get("kit.notebook.magics")  # never import IPython just to ask
    return magics.get_cluster() if magics is not None else None


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext kit`: register the `%%distributed` and `%dist` magics (idempotent)."""
    from kit.notebook.magics import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext kit`: remove the magics and stop the workers this kernel started (when the cell ends)."""
    from kit.notebook.magics import unload

    unload(ipython)
