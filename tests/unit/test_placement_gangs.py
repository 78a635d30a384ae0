"""Multi-node Jobs in the planner: `nodes` distinct nodes at once or none, chosen by the pool's
policy, reserving as the first blocked Job of their pool, and told what is missing."""

from datetime import timedelta
from typing import Any

import pytest

from controller import placement, reading, writing
from controller.placement import GPU, Allocation, Decision, Pool, Request, Snapshot
from gctl.api import binding, meta
from tests.unit.test_placement_rules import GI, T0, decide, gpus, req, running, snapshot


def gang(name: str, nodes: int, count: int, **extra: object) -> Request:
    return req(name, count, nodes=nodes, **extra)


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
        allocations=[
            running("x", "b", 0, 1, preemptible=False),
            running("y", "c", 0, 1, 2, 3, preemptible=False),
        ],
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
        allocations=[running("busy", "b", 0, 1, 2, 3, ends=ends, started=T0, preemptible=False)],
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


def test_a_gang_is_never_bound_ahead() -> None:
    shot = snapshot(
        gpus("a", 2),
        gpus("b", 2),
        allocations=[running("low", "a", 0, 1, priority=5), running("low2", "b", 0, 1)],
    )
    result = decide(shot, gang("g", 2, 2, priority=5))
    assert (ranks(result["g"]), result["g"].victims) == (None, ())
    assert sorted(result["g"].held) == [(n, i) for n in "ab" for i in range(2)]


# -- waiting for attempts stopping, and preemption ---------------------------------------------


def test_a_gang_preempts_the_fewest_lower_priority_jobs_on_as_many_nodes() -> None:
    """a would cost two victims, b and c one each (c's of a higher priority than b's, yet
    fewer than a's): the gang stops b's and c's and holds their GPUs."""
    shot = snapshot(
        gpus("a", 2),
        gpus("b", 2),
        gpus("c", 2),
        allocations=[
            running("a0", "a", 0),
            running("a1", "a", 1),
            running("on-b", "b", 0, 1),
            running("on-c", "c", 0, 1, priority=3),
        ],
    )
    result = decide(shot, gang("g", 2, 2, priority=10), req("later", 1, priority=10))
    g = result["g"]
    assert ranks(g) is None
    assert g.reason == "Unschedulable"
    assert [v.job for v in g.victims] == ["on-b", "on-c"]
    assert g.message == "preempting 2 lower-priority job(s) on b, c: default/on-b, default/on-c"
    assert sorted(g.held) == [(n, i) for n in "bc" for i in range(2)]
    assert [v.job for v in result["later"].victims] == ["a0"]  # b and c are held for g


def test_a_gang_takes_a_free_node_and_preempts_on_another_only_what_it_must() -> None:
    """a is free; on b the gang needs GPU 3, free, and one more: it stops the most recently
    started of the two it could, and keeps its hands off c, which costs two."""
    shot = snapshot(
        gpus("a", 2),
        gpus("b", 4),
        gpus("c", 2),
        allocations=[
            running("keep", "b", 0, preemptible=False),
            running("old", "b", 1, started=T0),
            running("new", "b", 2, started=T0 + timedelta(minutes=1)),
            running("c0", "c", 0),
            running("c1", "c", 1),
        ],
    )
    result = decide(shot, gang("g", 2, 2, priority=10))
    assert [v.job for v in result["g"].victims] == ["new"]
    assert result["g"].message == "preempting 1 lower-priority job(s) on b: default/new"
    assert sorted(result["g"].held) == [("a", 0), ("a", 1), ("b", 2), ("b", 3)]


def test_a_gang_waits_for_attempts_stopping_and_preempts_nobody_else() -> None:
    shot = snapshot(
        gpus("a", 2),
        gpus("b", 2),
        gpus("c", 2),
        allocations=[
            running("s1", "a", 0, 1, stopping=binding.STOP_PREEMPTED),
            running("s2", "b", 0, 1, stopping=binding.STOP_PREEMPTED),
            running("low", "c", 0, 1),
        ],
    )
    result = decide(shot, gang("g", 2, 2, priority=10), req("next", 2, priority=10))
    assert result["g"].victims == ()
    assert result["g"].message == (
        "waiting for 2 preempted job(s) to stop on a, b (GPUs held for this Job)"
    )
    assert sorted(result["g"].held) == [(n, i) for n in "ab" for i in range(2)]
    assert [v.job for v in result["next"].victims] == ["low"]  # a and b are held for g


def test_a_gang_waits_for_a_job_stopping_beside_a_free_node() -> None:
    shot = snapshot(
        gpus("a", 2),
        gpus("b", 2),
        allocations=[running("deleted", "b", 0, 1, stopping=binding.STOP_DELETED)],
    )
    result = decide(shot, gang("g", 2, 2))
    assert result["g"].message == "waiting for 1 job(s) to stop on b (GPUs held for this Job)"
    assert sorted(result["g"].held) == [(n, i) for n in "ab" for i in range(2)]


def test_a_gang_stops_only_lower_priority_preemptible_jobs() -> None:
    """a and b would cost one victim each, but one is not below the gang and the other not
    preemptible: it stops two on each of c and d instead."""
    shot = snapshot(
        gpus("a", 2),
        gpus("b", 2),
        gpus("c", 2),
        gpus("d", 2),
        allocations=[
            running("equal", "a", 0, 1, priority=10),
            running("kept", "b", 0, 1, preemptible=False),
            running("c0", "c", 0),
            running("c1", "c", 1),
            running("d0", "d", 0),
            running("d1", "d", 1),
        ],
    )
    result = decide(shot, gang("g", 2, 2, priority=10))
    assert [v.job for v in result["g"].victims] == ["c0", "c1", "d0", "d1"]


def test_a_gang_in_a_pool_without_preemption_reserves_as_before() -> None:
    def shot(preempting: bool) -> Snapshot:
        return snapshot(
            gpus("a", 2),
            gpus("b", 2),
            pools=[Pool(preemption=preempting)],
            allocations=[running("x", "a", 0, 1), running("y", "b", 0, 1)],
        )

    kept = decide(shot(False), gang("g", 2, 2, priority=10))["g"]
    assert kept.victims == ()
    assert kept.message.startswith("needs 2 nodes with 2 free GPUs each, 0 have them")
    assert sorted(kept.held) == [(n, i) for n in "ab" for i in range(2)]
    preempting = decide(shot(True), gang("g", 2, 2, priority=10))["g"]
    assert [v.job for v in preempting.victims] == ["x", "y"]


def test_a_gang_preempting_another_gang_stops_each_member_and_names_the_job_once() -> None:
    shot = snapshot(
        gpus("a", 2),
        gpus("b", 2),
        allocations=[
            Allocation("default", "ddp", "ddp-1", "a", (0, 1)),
            Allocation("default", "ddp", "ddp-1-r1", "b", (0, 1)),
        ],
    )
    result = decide(shot, gang("g", 2, 2, priority=10))
    assert [v.binding for v in result["g"].victims] == ["ddp-1", "ddp-1-r1"]
    assert result["g"].message == "preempting 1 lower-priority job(s) on a, b: default/ddp"


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


def _count_gpu_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the planner asks whether a GPU can take a request (`_blocker`), so far."""
    calls = [0]
    blocker = placement._Planner._blocker

    def counted(self: placement._Planner, *args: Any, **kwargs: Any) -> str | None:
        calls[0] += 1
        return blocker(self, *args, **kwargs)

    monkeypatch.setattr(placement._Planner, "_blocker", counted)
    return calls


def test_many_identical_gangs_do_not_each_look_at_every_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """500 gangs of 2 x 8 GPUs over 300 nodes of 8: 150 start; the 350 that wait do not each
    check the 2,400 GPUs again (840,000 checks): a shape that found no fit finds none for the
    rest of the pass, and their messages are worked out once per shape while nothing changes."""
    shot = snapshot(*(gpus(f"n{i:03d}", 8) for i in range(300)))
    calls = _count_gpu_checks(monkeypatch)
    decisions = placement.plan(shot, [gang(f"g{i:03d}", 2, 8) for i in range(500)], T0).decisions
    placed = [d for d in decisions if d.placement is not None]
    assert len(placed) == 150
    assert all(len(d.placement.members) == 1 for d in placed if d.placement)
    assert calls[0] < 10 * 2400


def test_many_identical_gangs_preempt_without_each_looking_at_every_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1,000 gangs of 2 x 8 GPUs over 500 busy nodes of 8: the first 250 stop a job on each of
    two nodes; what each node offers is worked out again only after its GPUs changed, and a
    shape that found too few nodes finds too few for the rest of the pass (4,000 GPU checks
    each would be 4 million)."""
    shot = snapshot(
        *(gpus(f"n{i:03d}", 8) for i in range(500)),
        allocations=[running(f"low{i:03d}", f"n{i:03d}", *range(8)) for i in range(500)],
    )
    calls = _count_gpu_checks(monkeypatch)
    requests = [gang(f"g{i:04d}", 2, 8, priority=10) for i in range(1000)]
    decisions = placement.plan(shot, requests, T0).decisions
    preempting = [d for d in decisions if d.victims]
    assert len(preempting) == 250
    assert len({v.job for d in preempting for v in d.victims}) == 500
    assert all(d.placement is None and not d.victims for d in decisions[250:])
    assert calls[0] < 20 * 4000


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
