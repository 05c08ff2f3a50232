"""The raw-RQ counterpart of ``bench.noop``. No Django import: RQ's workers load it as is."""

from __future__ import annotations


def noop(i: int) -> None:
    return None
