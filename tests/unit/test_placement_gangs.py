"""Multi-node Jobs in the planner: `nodes` distinct nodes at once or none, chosen by the pool's
policy, reserving as the first blocked Job of their pool, and told what is missing."""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller import placement, reading, writing
from controller.placement import GPU, Allocation, Decision, Node, Pool, Request, Snapshot
from gctl.api import binding, meta

GI = 2**30
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def gpus(node: str, count: int, **fields: Any) -> list[GPU]:
    defaults: dict[str, Any] = {"model": "A100", "memory_total": 80 * GI}
    return [GPU(node, i, **(defaults | fields)) for i in range(count)]


def snapshot(
    *gpu_lists: list[GPU], pools: Sequence[Pool] = (), allocations: Sequence[Allocation] = ()
) -> Snapshot:
    every = [g for group in gpu_lists for g in group]
    nodes = [Node(name) for name in sorted({g.node for g in every})]
    return Snapshot(nodes, every, {p.name: p for p in pools}, list(allocations))


def req(name: str, count: float = 1, **extra: object) -> Request:
    return Request("default", name, count, **extra)  # type: ignore[arg-type]


def gang(name: str, nodes: int, count: int, **extra: object) -> Request:
    return req(name, count, nodes=nodes, **extra)


def running(name: str, node: str, *indices: int, **extra: object) -> Allocation:
    return Allocation("default", name, f"{name}-1", node, indices, **extra)  # type: ignore[arg-type]


def decide(shot: Snapshot, *requests: Request) -> dict[str, Decision]:
    return {d.request.name: d for d in placement.plan(shot, requests, T0).decisions}


def ranks(decision: Decision) -> list[tuple[str, tuple[int, ...]]] | None:
    return None if decision.placement is None else decision.placement.ranks()


# -- fit: all members at once, or none ----------------------------------------------------------


def test_a_gang_takes_two_free_nodes_at_once() -> None:
    shot = snapshot(gpus("a", 4), gpus("b", 4), gpus("c", 4), allocations=[running("x", "c", 0)])
    result = decide(shot, gang("g", 2, 4))
    assert ranks(result["g"]) == [("a", (0, 1, 2, 3)), ("b", (0, 1, 2, 3))]
    placed = result["g"].placement
    assert placed is not None
    assert (placed.node, placed.gpus, placed.share) == ("a", (0, 1, 2, 3), 1.0)
    assert placed.members == (("b", (0, 1, 2, 3)),)
    assert placed.after == ()


def test_a_gang_that_one_node_cannot_take_waits_whole_and_holds_nothing() -> None:
    """Only `a` has 4 free GPUs: the gang waits and takes none of them, and a later Job does.
    (`first`, blocked ahead of it, holds the pool's reservation, so the gang reserves none.)"""
    shot = snapshot(
        gpus("a", 4),
        gpus("b", 4),
        gpus("c", 4),
        pools=[Pool(bind_ahead=False)],
        allocations=[running("x", "b", 0, 1), running("y", "c", 0, 1, 2, 3, preemptible=False)],
    )
    result = decide(
        shot,
        req("first", 4, node="c", priority=9),
        gang("g", 2, 4, priority=5),
        req("later", 4),
    )
    assert result["first"].held
    assert ranks(result["g"]) is None
    assert result["g"].held == ()
    assert ranks(result["later"]) == [("a", (0, 1, 2, 3))]


def test_gangs_of_one_shape_fill_the_nodes_one_after_another() -> None:
    """The second gang sees what the first took (binpack: the rest of the same nodes)."""
    shot = snapshot(gpus("a", 4), gpus("b", 4), gpus("c", 4), gpus("d", 4))
    result = decide(shot, gang("g1", 2, 2), gang("g2", 2, 2), gang("g3", 2, 2))
    assert ranks(result["g1"]) == [("a", (0, 1)), ("b", (0, 1))]
    assert ranks(result["g2"]) == [("a", (2, 3)), ("b", (2, 3))]
    assert ranks(result["g3"]) == [("c", (0, 1)), ("d", (0, 1))]


def test_members_are_distinct_nodes() -> None:
    """One node with room for both members is not two nodes."""
    result = decide(snapshot(gpus("a", 8), gpus("b", 8, state="Cordoned")), gang("g", 2, 4))
    assert ranks(result["g"]) is None


def test_binpack_takes_the_fullest_nodes_and_spread_the_emptiest() -> None:
    def shot(policy: str) -> Snapshot:
        return snapshot(
            gpus("a", 4),
            gpus("b", 4),
            gpus("c", 8),
            pools=[Pool(policy=policy)],
            allocations=[running("x", "a", 0, 1)],
        )

    # binpack: a is left with no free GPU, b with 2, c with 6
    assert ranks(decide(shot("binpack"), gang("g", 2, 2))["g"]) == [("a", (2, 3)), ("b", (0, 1))]
    # spread: b and c run no job; c has more free GPUs
    assert ranks(decide(shot("spread"), gang("g", 2, 2))["g"]) == [("c", (0, 1)), ("b", (0, 1))]


def test_placement_nodes_and_gpus_pin_every_member() -> None:
    shot = snapshot(gpus("a", 4), gpus("b", 4), gpus("c", 4))
    pinned = gang("g", 2, 2, allowed=frozenset({"b", "c"}), pinned=(2, 3))
    assert ranks(decide(shot, pinned)["g"]) == [("b", (2, 3)), ("c", (2, 3))]


def test_each_member_takes_mutual_peers() -> None:
    peers = {0: {2}, 1: {3}, 2: {0}, 3: {1}}
    linked = [
        GPU(name, i, "A100", 80 * GI, peers=frozenset(peers[i])) for name in "ab" for i in range(4)
    ]
    assert ranks(decide(snapshot(linked), gang("g", 2, 2))["g"]) == [("a", (0, 2)), ("b", (0, 2))]


def test_a_node_with_peers_goes_before_one_as_good_without() -> None:
    peers = {0: {2}, 1: {3}, 2: {0}, 3: {1}}
    linked = [GPU("c", i, "A100", 80 * GI, peers=frozenset(peers[i])) for i in range(4)]
    shot = snapshot(gpus("a", 4), gpus("b", 4, peers=frozenset({9})), linked)
    assert ranks(decide(shot, gang("g", 2, 2))["g"]) == [("c", (0, 2)), ("a", (0, 1))]


# -- reservation and backfill -------------------------------------------------------------------


def _reserving_gang(backfill: bool) -> Snapshot:
    ends = T0 + timedelta(minutes=10)
    return snapshot(
        gpus("a", 4),
        gpus("b", 4),
        pools=[Pool(backfill=backfill)],
        allocations=[running("busy", "b", 0, 1, 2, 3, ends=ends, started=T0)],
    )


def test_a_blocked_gang_reserves_on_every_node_and_starts_when_the_last_frees() -> None:
    result = decide(_reserving_gang(False), gang("g", 2, 4, priority=5), req("small", 1))
    assert ranks(result["g"]) is None
    assert sorted(result["g"].held) == [(n, i) for n in "ab" for i in range(4)]
    assert result["g"].estimated_start == T0 + timedelta(minutes=10)
    assert ranks(result["small"]) is None
    assert result["small"].message == (
        "0/8 GPUs fit: 4 in use, 4 reserved for a Job ahead in the queue"
    )


@pytest.mark.parametrize(("deadline", "starts"), [(300, True), (601, False), (None, False)])
def test_backfill_lets_a_job_through_that_ends_before_the_gang_starts(
    deadline: int | None, starts: bool
) -> None:
    result = decide(
        _reserving_gang(True), gang("g", 2, 4, priority=5), req("short", 1, deadline=deadline)
    )
    assert ranks(result["g"]) is None
    assert (ranks(result["short"]) == [("a", (0,))]) == starts


def test_a_gang_that_can_never_fit_reserves_nothing() -> None:
    shot = snapshot(gpus("a", 4), gpus("b", 4), gpus("c", 4, state="Cordoned"))
    result = decide(shot, gang("g", 3, 4, priority=5), req("later", 4))
    assert result["g"].held == ()
    assert ranks(result["later"]) == [("a", (0, 1, 2, 3))]


def test_a_gang_is_neither_bound_ahead_nor_preempts() -> None:
    shot = snapshot(
        gpus("a", 2),
        gpus("b", 2),
        allocations=[running("low", "a", 0, 1, priority=0), running("low2", "b", 0, 1)],
    )
    result = decide(shot, gang("g", 2, 2, priority=10))
    assert (ranks(result["g"]), result["g"].victims) == (None, ())
    assert sorted(result["g"].held) == [(n, i) for n in "ab" for i in range(2)]


# -- messages ----------------------------------------------------------------------------------


def test_a_waiting_gang_is_told_how_many_nodes_have_its_gpus() -> None:
    shot = snapshot(gpus("a", 4), gpus("b", 4), allocations=[running("x", "b", 0, 1)])
    result = decide(shot, gang("g", 2, 4))
    assert result["g"].message == (
        "needs 2 nodes with 4 free GPUs each, 1 has them (a); 6/8 GPUs fit: 2 in use"
    )


def test_a_gang_that_can_never_fit_is_told_so() -> None:
    shot = snapshot(gpus("a", 4), gpus("b", 4), gpus("c", 2), gpus("d", 4, state="Cordoned"))
    result = decide(shot, gang("g", 3, 4))
    assert result["g"].message == (
        "needs 3 nodes with 4 GPUs each: pool default has only 2 such nodes (a,b); "
        "10/14 GPUs fit: 4 cordoned"
    )
    result = decide(snapshot(gpus("a", 2)), gang("g", 2, 4))
    assert result["g"].message == (
        "needs 2 nodes with 4 GPUs each: pool default has no such node; 2/2 GPUs fit"
    )


# -- many gangs --------------------------------------------------------------------------------


def test_many_identical_gangs_do_not_each_look_at_every_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """500 gangs of 2 x 8 GPUs over 300 nodes of 8: 150 start; the 350 that wait do not each
    check the 2,400 GPUs again (840,000 checks): a shape that found no fit finds none for the
    rest of the pass, and their messages are worked out once per shape while nothing changes."""
    shot = snapshot(*(gpus(f"n{i:03d}", 8) for i in range(300)))
    calls = 0
    blocker = placement._Planner._blocker

    def counted(self: placement._Planner, *args: Any, **kwargs: Any) -> str | None:
        nonlocal calls
        calls += 1
        return blocker(self, *args, **kwargs)

    monkeypatch.setattr(placement._Planner, "_blocker", counted)
    decisions = placement.plan(shot, [gang(f"g{i:03d}", 2, 8) for i in range(500)], T0).decisions
    placed = [d for d in decisions if d.placement is not None]
    assert len(placed) == 150
    assert all(len(d.placement.members) == 1 for d in placed if d.placement)
    assert calls < 10 * 2400


# -- what the writing of a plan reads of it ------------------------------------------------------


def _placed_gang() -> Decision:
    request = gang("g", 2, 2)
    where = placement.Placement(request, "a", (0, 1), 1.0, members=(("b", (0, 1)),))
    return Decision(request, placement=where)


def test_the_jobs_bound_in_a_pass_include_every_member_of_a_gang() -> None:
    takers = writing._takers([_placed_gang()])
    assert {key: r.name for key, r in takers.items()} == {
        ("a", 0): "g",
        ("a", 1): "g",
        ("b", 0): "g",
        ("b", 1): "g",
    }


def test_a_gang_on_the_gpus_of_an_attempt_asked_back_is_held_back() -> None:
    """An armed attempt on b that the pass moves is asked back, not removed: a gang placed
    with a member on its GPUs waits for the next pass, as a Job placed there would."""
    queued = running("moved", "b", 0, queued=True)
    moving = Decision(
        req("moved", queued=queued), placement=placement.Placement(req("moved"), "c", (0,), 1.0)
    )
    armed = binding.Binding(
        metadata=meta.ObjectMeta(name="moved-1", namespace="default"),
        spec=binding.BindingSpec(
            job_name="moved", job_uid="j", attempt=1, node="b", gpus=[0], after=["u"]
        ),
        status=binding.BindingStatus(phase="Armed"),
    )
    world = reading.World(
        snapshot(), {("default", "moved-1"): armed}, running={}, profiles={}, run_times={}
    )
    placed = _placed_gang()
    assert writing._held_back([moving, placed], world) == {id(moving), id(placed)}
