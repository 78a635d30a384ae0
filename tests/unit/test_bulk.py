"""Bulk work runs with the cycle collector paused, and leaves it as it found it."""

import gc

import pytest

from gctl.store import bulk


@pytest.mark.parametrize("collecting", [True, False])
def test_the_collector_is_paused_in_the_block_then_as_it_was(collecting: bool) -> None:
    was = gc.isenabled()
    (gc.enable if collecting else gc.disable)()
    try:
        with bulk.collector_paused():
            assert not gc.isenabled()
            with bulk.collector_paused():  # nested: the outer block resumes it, not this one
                pass
            assert not gc.isenabled()
        assert gc.isenabled() is collecting
        with pytest.raises(ZeroDivisionError), bulk.collector_paused():
            _ = 1 / 0
        assert gc.isenabled() is collecting
    finally:
        (gc.enable if was else gc.disable)()
