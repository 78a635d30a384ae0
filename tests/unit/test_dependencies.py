"""dependsOn as a graph: the cycle a Job is on, and a cycle among the objects of one apply."""

import pytest

from gctl.api import dependencies

JOB, SWEEP = dependencies.JOB, dependencies.SWEEP


def _job(*needs: str, waits: bool = True) -> dependencies.Waiter:
    return dependencies.Waiter(JOB, needs, waits)


def _sweep(*needs: str, waits: bool = True) -> dependencies.Waiter:
    return dependencies.Waiter(SWEEP, needs, waits)


@pytest.mark.parametrize(
    ("graph", "owner", "found"),
    [
        ({"a": _job("a")}, None, ["a", "a"]),
        ({"a": _job("b"), "b": _job("a")}, None, ["a", "b", "a"]),
        ({"a": _job("b"), "b": _job("c"), "c": _job("a", "b")}, None, ["a", "b", "c", "a"]),
        # the shortest way back
        ({"a": _job("b", "c"), "b": _job("c"), "c": _job("a")}, None, ["a", "c", "a"]),
        # on the way to a cycle, not on it: it fails when one of the cycle does
        ({"a": _job("b"), "b": _job("c"), "c": _job("b")}, None, None),
        ({"a": _job("b"), "b": _job()}, None, None),
        ({"a": _job("missing")}, None, None),
        # what succeeded or runs waits for nothing: no cycle through it
        ({"a": _job("b"), "b": _job("a", waits=False)}, None, None),
        # through a Sweep: it needs what its Jobs need
        ({"a": _job("s"), "s": _sweep("a")}, None, ["a", "s", "a"]),
        # a Sweep's Job: its Sweep waits for it
        ({"s-x": _job("a"), "a": _job("s"), "s": _sweep("a")}, "s", ["s-x", "a", "s", "s-x"]),
        ({"s-x": _job("s"), "s": _sweep()}, "s", ["s-x", "s", "s-x"]),
        # a Job named like the owner is what the name stands for, not the Sweep
        ({"s-x": _job("s"), "s": _job()}, "s", None),
    ],
)
def test_the_cycle_a_job_is_on(
    graph: dict[str, dependencies.Waiter], owner: str | None, found: list[str] | None
) -> None:
    start = next(iter(graph))
    assert dependencies.cycle(start, graph, owner) == found


@pytest.mark.parametrize(
    ("graph", "found"),
    [
        ({"a": _job("b"), "b": _job("a")}, ["a", "b", "a"]),
        ({"x": _job("a"), "a": _job("b"), "b": _job("a")}, ["a", "b", "a"]),
        # named from its first object in the input, wherever the walk came upon it
        ({"x": _job("b"), "a": _job("b"), "b": _job("a")}, ["a", "b", "a"]),
        ({"a": _job("b", "c"), "b": _job("d"), "c": _job("d"), "d": _job()}, None),  # a diamond
        ({"a": _job("s"), "s": _sweep("b"), "b": _job("a")}, ["a", "s", "b", "a"]),
        ({"a": _job("a")}, ["a", "a"]),
    ],
)
def test_a_cycle_among_the_objects_of_one_apply(
    graph: dict[str, dependencies.Waiter], found: list[str] | None
) -> None:
    assert dependencies.cycle_in(graph, list(graph)) == found


def test_a_long_chain_is_walked_once() -> None:
    """Linear, not one walk per object: 20,000 Jobs each waiting for the one before."""
    graph = {f"j{i}": _job(f"j{i - 1}") if i else _job() for i in range(20_000)}
    assert dependencies.cycle_in(graph, list(graph)) is None
    graph["j0"] = _job("j19999")
    cycle = dependencies.cycle_in(graph, list(graph))
    assert cycle is not None
    assert (len(cycle), cycle[0] == cycle[-1]) == (20_001, True)


def test_a_cycle_reads_with_namespaces_and_kinds() -> None:
    graph = {"a": _job("grid"), "grid": _sweep("a")}
    assert dependencies.describe("ml", ["a", "grid", "a"], graph) == "ml/a -> sweep ml/grid -> ml/a"
