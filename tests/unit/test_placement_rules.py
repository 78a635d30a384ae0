"""The planner's rules one by one: pools, sharing, memory, thresholds, closed GPUs, scoring,
reservations, backfill, preemption and the messages a waiting Job gets."""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller import diagnosis, placement
from controller.placement import GPU, Allocation, Decision, Node, Pool, Request, Snapshot

GI = 2**30
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def gpus(node: str, count: int, **fields: Any) -> list[GPU]:
    defaults: dict[str, Any] = {"model": "A100", "memory_total": 80 * GI}
    return [GPU(node, i, **(defaults | fields)) for i in range(count)]


def snapshot(
    *gpu_lists: list[GPU],
    nodes: Sequence[Node] = (),
    pools: Sequence[Pool] = (),
    allocations: Sequence[Allocation] = (),
) -> Snapshot:
    every = [g for group in gpu_lists for g in group]
    named = {n.name: n for n in nodes}
    for name in sorted({g.node for g in every} - named.keys()):
        named[name] = Node(name)
    return Snapshot(list(named.values()), every, {p.name: p for p in pools}, list(allocations))


def req(name: str, count: float = 1, **extra: object) -> Request:
    return Request("default", name, count, **extra)  # type: ignore[arg-type]


def running(name: str, node: str, *indices: int, **extra: object) -> Allocation:
    return Allocation("default", name, f"{name}-1", node, indices, **extra)  # type: ignore[arg-type]


def decide(shot: Snapshot, *requests: Request) -> dict[str, Decision]:
    return {d.request.name: d for d in placement.plan(shot, requests, T0).decisions}


def at(decision: Decision) -> tuple[str, tuple[int, ...]] | None:
    return (
        None if decision.placement is None else (decision.placement.node, decision.placement.gpus)
    )


# -- pools -------------------------------------------------------------------------------------


def test_a_pool_selects_gpus_by_node_label_model_and_index_range() -> None:
    shot = snapshot(
        gpus("a1", 8),
        gpus("a2", 8),
        gpus("l1", 2, model="NVIDIA L40S"),
        nodes=[Node("a1", labels={"gpu": "a100"}), Node("a2"), Node("l1", labels={"gpu": "a100"})],
        pools=[
            Pool(
                "train",
                node_labels=(("gpu", "a100"),),
                gpu_model="*a100*",
                gpus=frozenset({0, 1, 2, 3}),
                bind_ahead=False,  # so that the fifth waits and says why
            )
        ],
    )
    result = decide(shot, *(req(f"j{i}", pool="train") for i in range(5)))
    assert [at(result[f"j{i}"]) for i in range(4)] == [("a1", (i,)) for i in range(4)]
    assert result[
        "j4"
    ].message == "0/18 GPUs fit: 10 not in pool train, 4 in use, 4 not in pool train" or (
        result["j4"].message == "0/18 GPUs fit: 14 not in pool train, 4 in use"
    )


def test_a_job_naming_a_missing_pool_waits_and_says_so() -> None:
    result = decide(snapshot(gpus("a", 1)), req("lost", pool="nope"))
    assert (result["lost"].reason, result["lost"].message) == (
        "GPUPoolNotFound",
        'GPUPool "nope" not found: create it, or change spec.pool',
    )
    assert result["lost"].position is None


def test_without_a_default_pool_every_gpu_is_shared_freely_and_with_one_its_rules_hold() -> None:
    free = decide(snapshot(gpus("a", 1)), *(req(f"q{i}", 0.25) for i in range(4)))
    assert all(at(d) == ("a", (0,)) for d in free.values())
    capped = snapshot(
        gpus("a", 1),
        gpus("b", 1),
        pools=[Pool("default", nodes=frozenset({"b"}), max_jobs_per_gpu=2)],
    )
    result = decide(capped, *(req(f"q{i}", 0.25) for i in range(3)))
    assert [at(result[f"q{i}"]) for i in range(3)] == [("b", (0,)), ("b", (0,)), None]
    assert result["q2"].message == "0/2 GPUs fit: 1 at maxJobsPerGPU=2, 1 not in pool default"


def test_a_pool_without_fractions_refuses_fractional_jobs() -> None:
    shot = snapshot(gpus("a", 1), pools=[Pool("whole", allow_fractions=False)])
    result = decide(shot, req("half", 0.5, pool="whole"))
    assert result["half"].message.startswith("pool whole does not allow fractional GPUs")


def test_usage_is_per_physical_gpu_across_overlapping_pools() -> None:
    shot = snapshot(gpus("a", 1), pools=[Pool("x"), Pool("y")])
    result = decide(shot, req("in-x", 0.5, pool="x"), req("in-y", 0.75, pool="y"))
    assert at(result["in-x"]) == ("a", (0,))
    assert result["in-y"].message == "0/1 GPUs fit: 1 too full for 0.75 GPU"


# -- memory, thresholds, closed and NotReady GPUs ------------------------------------------------


def test_memory_counts_foreign_processes_and_gctl_declarations() -> None:
    shot = snapshot(
        gpus("a", 1, foreign_memory=50 * GI),
        gpus("b", 1),
        allocations=[running("held", "b", 0, share=0.5, memory=50 * GI, priority=5)],
    )
    big = decide(shot, req("needs-40", 0.5, gpu_memory=40 * GI))["needs-40"]
    assert (at(big), big.message) == (None, "0/2 GPUs fit: 2 lack 40Gi free")
    small = decide(shot, req("needs-20", 0.25, gpu_memory=20 * GI))["needs-20"]
    assert at(small) == ("b", (0,))  # the fuller GPU first (binpack)


def test_busy_gpus_take_no_new_jobs_in_a_pool_with_thresholds() -> None:
    shot = snapshot(
        gpus("a", 1, utilization=95),
        gpus("b", 1, memory_used=78 * GI),
        gpus("c", 1, utilization=10, memory_used=1 * GI),
        pools=[
            Pool(
                "default",
                max_utilization_percent=90,
                max_memory_used_percent=90,
                bind_ahead=False,  # else "two" waits as the next job of c's GPU
            )
        ],
    )
    result = decide(shot, req("one"), req("two"))
    assert at(result["one"]) == ("c", (0,))
    assert result["two"].message == (
        "0/3 GPUs fit: 1 busier than pool default's 90% utilization limit, 1 in use, "
        "1 over pool default's 90% memory-used limit"
    )


def test_cordoned_draining_and_not_ready_gpus_take_nothing_and_are_counted() -> None:
    """A draining GPU whose jobs have all ended is Drained, as `get gpus` says (QA: the
    message said "draining" of GPUs that had been drained for a while)."""
    shot = snapshot(
        gpus("a", 2, state="Cordoned"),
        gpus("b", 2, state="Draining"),
        gpus("c", 3),
        nodes=[Node("c", ready=False)],
        allocations=[running("still", "b", 1)],
    )
    result = decide(shot, req("j"))
    assert at(result["j"]) is None
    assert result["j"].message == (
        "0/7 GPUs fit: 3 on NotReady node(s), 2 cordoned, 1 drained, 1 draining"
    )


def test_the_message_counts_the_first_failing_filter_most_frequent_first() -> None:
    shot = snapshot(
        gpus("a", 6, foreign_memory=60 * GI),
        gpus("b", 2, state="Cordoned"),
    )
    result = decide(shot, req("big", gpu_memory=40 * GI))
    assert result["big"].message == "0/8 GPUs fit: 6 lack 40Gi free, 2 cordoned"


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (req("m", gpu_model="H100*"), "0/2 GPUs fit: 2 not model H100*"),
        (req("p", node="b"), "0/2 GPUs fit: 2 excluded by spec.placement"),
        (req("s", gpu_memory=100 * GI), "0/2 GPUs fit: 2 smaller than 100Gi"),
    ],
)
def test_messages_name_the_constraint(request_: Request, message: str) -> None:
    assert decide(snapshot(gpus("a", 2)), request_)[request_.name].message == message


def test_no_gpus_at_all() -> None:
    assert (
        decide(snapshot(), req("j"))["j"].message
        == "0/0 GPUs fit: no Ready node has reported a GPU"
    )


# -- scoring -----------------------------------------------------------------------------------


def test_binpack_fills_one_node_and_spread_balances_nodes() -> None:
    packed = decide(snapshot(gpus("a", 4), gpus("b", 4)), *(req(f"j{i}") for i in range(3)))
    assert {at(d)[0] for d in packed.values() if at(d)} == {"a"}  # type: ignore[index]
    spread_pool = [Pool("default", policy="spread")]
    spread = decide(
        snapshot(gpus("a", 4), gpus("b", 4), pools=spread_pool), *(req(f"j{i}") for i in range(4))
    )
    nodes = [at(spread[f"j{i}"])[0] for i in range(4)]  # type: ignore[index]
    assert sorted(nodes) == ["a", "a", "b", "b"]


def test_binpack_prefers_the_node_whose_free_gpus_the_job_fills_exactly() -> None:
    shot = snapshot(gpus("a", 4), gpus("b", 4), allocations=[running("x", "b", 0, 1)])
    assert at(decide(shot, req("two", 2))["two"]) == ("b", (2, 3))


def test_fractions_fill_a_shared_gpu_first_under_binpack_and_the_emptiest_under_spread() -> None:
    shared = [running("x", "a", 0, share=0.5)]
    packed = decide(snapshot(gpus("a", 2), allocations=shared), req("q", 0.25))
    assert at(packed["q"]) == ("a", (0,))
    spread = decide(
        snapshot(gpus("a", 2), allocations=shared, pools=[Pool(policy="spread")]), req("q", 0.25)
    )
    assert at(spread["q"]) == ("a", (1,))


def test_multi_gpu_jobs_prefer_mutual_peers() -> None:
    peers = {0: {2}, 1: {3}, 2: {0}, 3: {1}}
    links = [GPU("a", i, "A100", 80 * GI, peers=frozenset(peers[i])) for i in range(4)]
    assert at(decide(snapshot(links), req("pair", 2))["pair"]) == ("a", (0, 2))


# -- reservation and backfill --------------------------------------------------------------


def _blocked_big_job(backfill: bool) -> Snapshot:
    ends = T0 + timedelta(minutes=10)
    return snapshot(
        gpus("a", 2),
        pools=[Pool(backfill=backfill)],
        allocations=[running("busy", "a", 0, ends=ends, started=T0, preemptible=False)],
    )


def test_the_first_blocked_job_reserves_its_gpus_and_later_jobs_wait() -> None:
    result = decide(_blocked_big_job(False), req("big", 2, priority=5), req("small", 1))
    assert at(result["big"]) is None
    assert result["big"].estimated_start == T0 + timedelta(minutes=10)
    assert (result["big"].position, result["small"].position) == (1, 2)
    assert at(result["small"]) is None
    assert (
        result["small"].message == "0/2 GPUs fit: 1 in use, 1 reserved for a Job ahead in the queue"
    )


def test_a_job_like_the_reserving_one_is_told_of_the_reservation() -> None:
    result = decide(_blocked_big_job(False), req("big", 2, priority=5), req("twin", 2))
    assert result["big"].message == "1/2 GPUs fit, but no node has 2 of them: 1 in use"
    assert (
        result["twin"].message == "0/2 GPUs fit: 1 in use, 1 reserved for a Job ahead in the queue"
    )


@pytest.mark.parametrize(
    ("deadline", "starts"), [(300, True), (600, True), (601, False), (None, False)]
)
def test_backfill_lets_a_job_that_ends_before_the_reservation_start(
    deadline: int | None, starts: bool
) -> None:
    result = decide(
        _blocked_big_job(True), req("big", 2, priority=5), req("short", 1, deadline=deadline)
    )
    assert (at(result["short"]) is not None) == starts


def test_a_reservation_is_not_made_on_gpus_the_job_could_never_use() -> None:
    shot = snapshot(
        gpus("a", 1, foreign_memory=70 * GI),
        gpus("b", 1),
        allocations=[running("busy", "b", 0)],
    )
    result = decide(shot, req("big", gpu_memory=40 * GI, priority=1), req("small"))
    assert at(result["small"]) == ("a", (0,))


# -- preemption --------------------------------------------------------------------------------


def test_a_higher_priority_job_preempts_a_lower_one_when_that_is_the_only_way() -> None:
    shot = snapshot(gpus("a", 1), allocations=[running("low", "a", 0, priority=0)])
    result = decide(shot, req("high", priority=10))
    assert [v.job for v in result["high"].victims] == ["low"]
    assert result["high"].message == "preempting 1 lower-priority job(s) on a: default/low"


@pytest.mark.parametrize(
    ("victim", "pool"),
    [
        ({"priority": 10}, Pool()),
        ({"priority": 0, "preemptible": False}, Pool()),
        ({"priority": 0}, Pool(preemption=False)),
    ],
)
def test_no_preemption_of_equal_priority_non_preemptible_or_in_a_pool_without_it(
    victim: dict[str, object], pool: Pool
) -> None:
    shot = snapshot(gpus("a", 1), pools=[pool], allocations=[running("low", "a", 0, **victim)])
    assert decide(shot, req("high", priority=10))["high"].victims == ()


def test_preemption_stops_the_fewest_then_lowest_then_most_recent() -> None:
    later = T0 + timedelta(minutes=1)
    shot = snapshot(
        gpus("a", 4),
        allocations=[
            running("pair-a", "a", 0, share=0.5, priority=0),
            running("pair-b", "a", 0, share=0.5, priority=0),
            running("mid", "a", 1, priority=3),
            running("low-old", "a", 2, priority=1, started=T0),
            running("low-new", "a", 3, priority=1, started=later),
        ],
    )
    assert [v.job for v in decide(shot, req("high", priority=9))["high"].victims] == ["low-new"]


def test_while_victims_stop_the_preemptor_waits_and_preempts_nobody_else() -> None:
    shot = snapshot(
        gpus("a", 1),
        gpus("b", 1),
        allocations=[
            running("stopping", "a", 0, priority=0, stopping="Preempted"),
            running("other", "b", 0, priority=0),
        ],
    )
    result = decide(shot, req("high", priority=10), req("next", priority=10))
    assert result["high"].victims == ()
    assert result["high"].message.startswith("waiting for 1 preempted job(s) to stop on a")
    assert [v.job for v in result["next"].victims] == ["other"]  # a is held for high


def test_each_job_preempts_only_what_its_own_priority_allows() -> None:
    """Jobs of one shape decided one after another: each chooses among the attempts of lower
    priority than its own, and none chooses an attempt another has chosen."""
    shot = snapshot(
        gpus("a", 1),
        gpus("b", 1),
        gpus("c", 1),
        allocations=[
            running("one", "a", 0, priority=1),
            running("three", "b", 0, priority=3),
            running("two", "c", 0, priority=2),
        ],
    )
    result = decide(
        shot, req("p9", priority=9), req("p8", priority=8), req("p3", priority=3), req("p2")
    )
    assert [v.job for v in result["p9"].victims] == ["one"]
    assert [v.job for v in result["p8"].victims] == ["two"]
    assert result["p3"].victims == ()  # "three" is not below it
    assert result["p2"].victims == ()


# -- queue positions and estimates ---------------------------------------------------------


def test_positions_count_per_pool_and_estimates_follow_known_end_times() -> None:
    ends = T0 + timedelta(hours=1)
    shot = snapshot(
        gpus("a", 1),
        gpus("b", 1),
        pools=[  # without binding ahead: they wait in their queues
            Pool("x", nodes=frozenset({"a"}), bind_ahead=False),
            Pool("y", nodes=frozenset({"b"}), bind_ahead=False),
        ],
        allocations=[
            running("ra", "a", 0, ends=ends, priority=9),
            running("rb", "b", 0, priority=9),
        ],
    )
    result = decide(
        shot,
        req("x1", pool="x", priority=2, runtime=timedelta(minutes=30)),
        req("x2", pool="x", priority=1),
        req("y1", pool="y"),
    )
    assert [(result[n].position, result[n].estimated_start) for n in ("x1", "x2", "y1")] == [
        (1, ends),
        (2, ends + timedelta(minutes=30)),
        (1, None),  # nobody knows when rb ends
    ]


def test_a_pools_first_job_whose_gpus_another_pool_reserved_is_estimated_after_it() -> None:
    """Two pools over the same GPU: the first Job of `x` reserves it; the first of `y` can
    reserve nothing, but still learns when it should start: after `x1`, whose run time is
    known."""
    ends = T0 + timedelta(hours=1)
    shot = snapshot(
        gpus("a", 1),
        pools=[Pool("x", bind_ahead=False), Pool("y", bind_ahead=False)],
        allocations=[running("busy", "a", 0, ends=ends, priority=9)],
    )
    result = decide(
        shot,
        req("x1", pool="x", priority=1, runtime=timedelta(minutes=30)),
        req("y1", pool="y"),
    )
    assert [(result[n].position, result[n].estimated_start) for n in ("x1", "y1")] == [
        (1, ends),
        (1, ends + timedelta(minutes=30)),
    ]
    assert result["x1"].held == (("a", 0),)
    assert result["y1"].held == ()


def test_pools_of_both_orders_sharing_gpus_take_turns_by_their_first_jobs_age() -> None:
    """Each pool's queue in its own order; the queues merged by their first Jobs' priority and
    age: a LongestFirst pool's new long Job does not go ahead of an older FIFO Job."""
    shot = snapshot(
        gpus("a", 1),
        pools=[Pool("fifo", bind_ahead=False), Pool("lpt", queue_order="LongestFirst")],
    )
    requests = [
        req("lpt-short", pool="lpt", created=T0, deadline=5, length=-5.0),
        req("lpt-long", pool="lpt", created=T0 + timedelta(seconds=2), length=-3600.0),
        req("old-fifo", pool="fifo", created=T0 + timedelta(seconds=1)),
    ]
    decisions = placement.plan(shot, requests, T0).decisions
    assert [d.request.name for d in decisions] == ["old-fifo", "lpt-long", "lpt-short"]
    assert at(decisions[0]) == ("a", (0,))


def test_the_planner_stops_after_max_placements() -> None:
    result = placement.plan(
        snapshot(gpus("a", 4)), [req(f"j{i}") for i in range(4)], T0, max_placements=2
    )
    assert (len(result.decisions), result.complete) == (2, False)


def test_gist_keeps_the_first_clause_without_numbers() -> None:
    assert diagnosis.gist("0/1000 GPUs fit: 999 in use, 1 reserved") == "#/# GPUs fit: # in use"
