"""Byte units, one definition each: MiB and GiB are binary (2**20, 2**30 bytes), as torch.cuda's memory
statistics and `nvidia-smi` count them. A leaf: imports nothing, so any module, kernel or rank side, reads it."""
from __future__ import annotations

__all__ = ["MIB", "GIB"]

MIB = float(2**20)
GIB = float(2**30)
