"""Bulk work: thousands of objects made at once, with Python's cycle collector paused.

A scheduling pass over 10,000 pending Jobs, `gctl apply` of 10,000 manifests or `gctl get -o
yaml` of 10,000 Jobs makes hundreds of thousands of container objects that live until the work
ends. Every few hundred allocations start a collection, and the older generations' walk the
whole growing heap again and again: a third to a half of such work went there. The objects die
by reference counting; the few cycles the work makes wait until it ends. So only bounded work
runs paused: never a wait, a watch or a daemon's loop.
"""

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cycle collector off for the block, then as it was, error or not."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
