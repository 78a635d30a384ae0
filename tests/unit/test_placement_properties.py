"""Properties of the planner over random clusters and queues (hypothesis): no GPU is ever
over-committed, closed GPUs take nothing, and a Job is never passed over by a later one of its
pool that needs as much or more."""

from collections import defaultdict
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from controller import placement
from controller.placement import GPU, Allocation, Node, Pool, Request, Snapshot

GI = 2**30
T0 = datetime(2026, 1, 1, tzinfo=UTC)
FRACTIONS = (0.25, 0.5, 1.0)
SIZES = (0, 0.25, 0.5, 1, 1, 2, 3)


@st.composite
def clusters(draw: st.DrawFn) -> Snapshot:
    nodes, gpus, allocations = [], [], []
    for n in range(draw(st.integers(1, 4))):
        name = f"n{n}"
        nodes.append(Node(name, ready=n == 0 or draw(st.booleans())))
        for index in range(draw(st.integers(1, 4))):
            total = draw(st.sampled_from((24, 40, 80))) * GI
            foreign = draw(st.sampled_from((0, 0, 10 * GI)))
            state = draw(st.sampled_from((None, None, None, "Cordoned", "Draining")))
            gpus.append(GPU(name, index, "A100", total, foreign_memory=foreign, state=state))
            share, memory, jobs = 0.0, foreign, 0
            for j in range(draw(st.integers(0, 2))):
                piece = draw(st.sampled_from(FRACTIONS))
                declared = draw(st.sampled_from((None, 8 * GI)))
                if share + piece > 1 or memory + (declared or 0) > total:
                    break
                share, memory, jobs = share + piece, memory + (declared or 0), jobs + 1
                allocations.append(
                    Allocation(
                        "default",
                        f"r-{name}-{index}-{j}",
                        f"r-{name}-{index}-{j}-1",
                        name,
                        (index,),
                        share=piece,
                        memory=declared,
                        priority=draw(st.integers(0, 3)),
                        preemptible=draw(st.booleans()),
                        ends=draw(st.sampled_from((None, T0 + timedelta(minutes=5)))),
                        stopping=draw(st.sampled_from((None, None, None, "Preempted"))),
                    )
                )
    pools = {
        "capped": Pool(
            "capped", nodes=frozenset({"n0", "n1"}), max_jobs_per_gpu=2, preemption=False
        )
    }
    if draw(st.booleans()):
        policy = draw(st.sampled_from(("binpack", "spread")))
        pools["default"] = Pool(
            "default", policy=policy, max_jobs_per_gpu=draw(st.sampled_from((None, 3)))
        )
    return Snapshot(nodes, gpus, pools, allocations)


@st.composite
def queues(draw: st.DrawFn) -> list[Request]:
    return [
        Request(
            "default",
            f"q{i:02d}",
            draw(st.sampled_from(SIZES)),
            gpu_memory=draw(st.sampled_from((None, None, 20 * GI, 40 * GI))),
            pool=draw(st.sampled_from(("default", "default", "capped"))),
            priority=draw(st.integers(0, 5)),
            created=T0 + timedelta(seconds=draw(st.integers(0, 3))),
            runtime=draw(st.sampled_from((None, timedelta(minutes=10)))),
        )
        for i in range(draw(st.integers(1, 14)))
    ]


def _cap(shot: Snapshot, request: Request) -> int | None:
    found = shot.pools.get(request.pool)
    return found.max_jobs_per_gpu if found else None


@settings(max_examples=300, deadline=None)
@given(clusters(), queues())
def test_no_gpu_is_over_committed_and_closed_gpus_take_nothing(
    shot: Snapshot, requests: list[Request]
) -> None:
    result = placement.plan(shot, requests, T0)
    gpus = {(g.node, g.index): g for g in shot.gpus}
    ready = {n.name for n in shot.nodes if n.ready}
    share: dict[tuple[str, int], float] = defaultdict(float)
    jobs: dict[tuple[str, int], int] = defaultdict(int)
    memory: dict[tuple[str, int], int] = defaultdict(int)
    for a in shot.allocations:
        for index in a.gpus:
            share[(a.node, index)] += a.share
            jobs[(a.node, index)] += 1
            memory[(a.node, index)] += a.memory or 0
    for d in result.decisions:
        if d.placement is None:
            assert d.reason
            assert d.message
            continue
        assert d.placement.node in ready
        assert len(d.placement.gpus) == (
            int(d.request.gpus) if d.request.gpus >= 1 else int(d.request.gpus > 0)
        )
        for index in d.placement.gpus:
            key = (d.placement.node, index)
            gpu = gpus[key]
            assert gpu.state is None, "a cordoned or draining GPU received work"
            share[key] += d.placement.share
            jobs[key] += 1
            memory[key] += d.request.gpu_memory or 0
            assert share[key] <= 1 + 1e-9
            cap = _cap(shot, d.request)
            assert cap is None or jobs[key] <= cap
            if d.request.gpu_memory:
                assert memory[key] + gpu.foreign_memory <= (gpu.memory_total or 0)


def _needs_as_much(later: Request, earlier: Request) -> bool:
    return later.gpus >= earlier.gpus and (later.gpu_memory or 0) >= (earlier.gpu_memory or 0)


@settings(max_examples=300, deadline=None)
@given(clusters(), queues())
def test_a_job_is_never_passed_over_by_a_later_one_that_needs_as_much(
    shot: Snapshot, requests: list[Request]
) -> None:
    decisions = placement.plan(shot, requests, T0).decisions
    for i, earlier in enumerate(decisions):
        if earlier.placement is not None or earlier.request.problem:
            continue
        for later in decisions[i + 1 :]:
            if later.placement is None or later.request.pool != earlier.request.pool:
                continue
            assert not _needs_as_much(later.request, earlier.request), (
                f"{later.request.name} started ahead of {earlier.request.name}"
            )


@settings(max_examples=300, deadline=None)
@given(clusters(), queues())
def test_only_lower_priority_preemptible_running_jobs_are_preempted_and_once(
    shot: Snapshot, requests: list[Request]
) -> None:
    stopped: set[str] = set()
    for d in placement.plan(shot, requests, T0).decisions:
        rules = shot.pools.get(d.request.pool, Pool())
        assert not d.victims or (rules.preemption and d.placement is None)
        for victim in d.victims:
            assert victim.priority < d.request.priority
            assert victim.preemptible
            assert victim.stopping is None
            assert victim.binding not in stopped
            stopped.add(victim.binding)


@settings(max_examples=300, deadline=None)
@given(clusters(), queues())
def test_no_job_uses_gpus_reserved_for_a_job_ahead_of_it(
    shot: Snapshot, requests: list[Request]
) -> None:
    """No pool here backfills, so a GPU held for a Job is closed to every Job after it."""
    held: set[tuple[str, int]] = set()
    for d in placement.plan(shot, requests, T0).decisions:
        if d.placement is not None:
            taken = {(d.placement.node, index) for index in d.placement.gpus}
            assert not taken & held, f"{d.request.name} took GPUs held for a Job ahead of it"
        held |= set(d.held)


@settings(max_examples=100, deadline=None)
@given(clusters(), queues())
def test_planning_is_deterministic(shot: Snapshot, requests: list[Request]) -> None:
    first = placement.plan(shot, requests, T0)
    again = placement.plan(shot, list(reversed(requests)), T0)
    assert first == again
