"""Refusals for strategy="accelerate" that need to know the backend or the installed packages.

Pure Python: the kernel calls this before any rank starts work (api._cluster_for via
beyond_config.check_backend). It looks for Accelerate with importlib.util.find_spec, which
finds the package without importing it (importing accelerate would import torch).
"""
from __future__ import annotations

import importlib.util
from typing import Any

__all__ = ["check_accelerate", "INSTALL_HINT"]

INSTALL_HINT = ('pip install "distributed-kit[accelerate]" (or: pip install accelerate -c <(echo torch==$(python -c '
                '"import torch; print(torch.__version__.split(\'+\')[0])")) so pip keeps your torch)')


def check_accelerate(cfg: Any, backend: str, error: type[Exception]) -> None:
    if cfg.precision == "fp16" and backend != "nccl":
        # Accelerate itself refuses: "fp16 mixed precision requires a device in (xpu, cuda, ...)".
        raise error("Accelerate refuses mixed_precision='fp16' on CPU ranks (it needs a GPU for fp16's "
                    "GradScaler); use precision='bf16' (Accelerate's CPU autocast) or 'fp32'")
    if importlib.util.find_spec("accelerate") is None:
        raise error(f"strategy='accelerate' needs Hugging Face Accelerate, which is not installed; {INSTALL_HINT}")
