"""Properties of the planner over random clusters and queues (hypothesis): no GPU is ever
over-committed, closed GPUs take nothing, a multi-node Job's members are on distinct nodes, and
a Job is never passed over by a later one of its pool that needs as much or more; across two
passes, a GPU never has two jobs bound ahead, and none is started on, nor reserved on, a GPU
whose job bound ahead is about to start; and the planner's fit indexes (a multi-node Job's
too) and cached messages decide exactly as looking at every node and working out every message
would, as every blocked Job looking for GPUs to reserve would, and as every Job that preempts
looking at every node would."""

import dataclasses
import functools
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from controller import capacity, diagnosis, placement, preemption
from controller.placement import GPU, Allocation, Node, Pool, Request, Snapshot
from controller.snapshot import Static

GI = 2**30
T0 = datetime(2026, 1, 1, tzinfo=UTC)
FRACTIONS = (0.25, 0.5, 1.0)
SIZES = (0, 0.25, 0.5, 1, 1, 2, 3)
NODES = (1, 1, 1, 1, 2, 3)  # of a Job on whole GPUs


@st.composite
def clusters(draw: st.DrawFn, backfill: bool = False) -> Snapshot:
    """Random nodes, GPUs and running attempts; the default pool backfills only if asked."""
    nodes, gpus, allocations = [], [], []
    for n in range(draw(st.integers(1, 4))):
        name = f"n{n}"
        nodes.append(Node(name, ready=n == 0 or draw(st.booleans())))
        for index in range(draw(st.integers(1, 4))):
            total = draw(st.sampled_from((24, 40, 80))) * GI
            foreign = draw(st.sampled_from((0, 0, 10 * GI)))
            state = draw(st.sampled_from((None, None, None, "Cordoned", "Draining")))
            peers = draw(st.sampled_from((frozenset(), frozenset({index ^ 1}))))
            gpus.append(
                GPU(name, index, "A100", total, foreign_memory=foreign, peers=peers, state=state)
            )
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
            "default",
            policy=policy,
            max_jobs_per_gpu=draw(st.sampled_from((None, 3))),
            backfill=backfill and draw(st.booleans()),
        )
    return Snapshot(nodes, gpus, pools, allocations)


@st.composite
def queues(draw: st.DrawFn) -> list[Request]:
    """Random pending Jobs; some of those on whole GPUs span 2 or 3 nodes."""
    requests = []
    for i in range(draw(st.integers(1, 14))):
        gpus = draw(st.sampled_from(SIZES))
        requests.append(
            Request(
                "default",
                f"q{i:02d}",
                gpus,
                gpu_memory=draw(st.sampled_from((None, None, 20 * GI, 40 * GI))),
                pool=draw(st.sampled_from(("default", "default", "capped"))),
                priority=draw(st.integers(0, 5)),
                created=T0 + timedelta(seconds=draw(st.integers(0, 3))),
                nodes=draw(st.sampled_from(NODES)) if gpus >= 1 else 1,
                runtime=draw(st.sampled_from((None, timedelta(minutes=10)))),
                deadline=draw(st.sampled_from((None, None, 60, 3600))),
            )
        )
    return requests


def _cap(shot: Snapshot, request: Request) -> int | None:
    found = shot.pools.get(request.pool)
    return found.max_jobs_per_gpu if found else None


def _no_gpu_is_over_committed_and_closed_gpus_take_nothing(
    shot: Snapshot, result: placement.Plan
) -> None:
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
    queued_on: set[tuple[str, int]] = set()
    for d in result.decisions:
        if d.placement is None:
            assert d.reason
            assert d.message
            continue
        assert d.placement.node in ready
        if d.placement.after:  # bound ahead: the next job of busy whole GPUs, one each
            assert d.request.gpus >= 1
            assert d.request.nodes == 1, "a multi-node Job was bound ahead"
            for index in d.placement.gpus:
                key = (d.placement.node, index)
                assert gpus[key].state is None, "a cordoned or draining GPU received work"
                assert key not in queued_on, "two jobs bound ahead to one GPU"
                queued_on.add(key)
                assert jobs[key] == 1
                assert share[key] >= 1 - 1e-9
                need = d.request.gpu_memory or 0
                assert need + gpus[key].foreign_memory <= (gpus[key].memory_total or 0)
            continue
        members = d.placement.ranks()  # a multi-node Job's: on distinct Ready nodes
        assert len(members) == d.request.nodes
        assert len({node for node, _ in members}) == len(members)
        assert {node for node, _ in members} <= ready
        for _, indices in members:
            assert len(indices) == (
                int(d.request.gpus) if d.request.gpus >= 1 else int(d.request.gpus > 0)
            )
        for key in ((node, index) for node, indices in members for index in indices):
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
    return (
        later.gpus >= earlier.gpus
        and later.nodes >= earlier.nodes
        and (later.gpu_memory or 0) >= (earlier.gpu_memory or 0)
    )


def _no_job_is_passed_over_by_a_later_one_that_needs_as_much(result: placement.Plan) -> None:
    decisions = result.decisions
    for i, earlier in enumerate(decisions):
        if earlier.placement is not None or earlier.request.problem:
            continue
        for later in decisions[i + 1 :]:
            if later.placement is None or later.request.pool != earlier.request.pool:
                continue
            if later.placement.after and (earlier.request.gpus < 1 or earlier.held):
                # Bound ahead, not started, behind one that a fraction could never take, or
                # while the earlier one holds GPUs that free for it sooner (it preempts).
                continue
            assert not _needs_as_much(later.request, earlier.request), (
                f"{later.request.name} started ahead of {earlier.request.name}"
            )


def _only_lower_priority_preemptible_running_jobs_are_preempted_and_once(
    shot: Snapshot, result: placement.Plan
) -> None:
    stopped: set[str] = set()
    for d in result.decisions:
        rules = shot.pools.get(d.request.pool, Pool())
        assert not d.victims or (rules.preemption and d.placement is None)
        for victim in d.victims:
            assert victim.priority < d.request.priority
            assert victim.preemptible
            assert victim.stopping is None
            assert victim.binding not in stopped
            stopped.add(victim.binding)


def _no_job_uses_gpus_reserved_for_a_job_ahead_of_it(result: placement.Plan) -> None:
    """No pool here backfills, so a GPU held for a Job is closed to every Job after it."""
    held: set[tuple[str, int]] = set()
    for d in result.decisions:
        if d.placement is not None:
            taken = {(node, i) for node, indices in d.placement.ranks() for i in indices}
            assert not taken & held, f"{d.request.name} took GPUs held for a Job ahead of it"
        held |= set(d.held)


@settings(max_examples=300, deadline=None)
@given(clusters(), queues())
def test_a_plan_keeps_every_invariant_and_does_not_depend_on_the_queue_s_order(
    shot: Snapshot, requests: list[Request]
) -> None:
    """Each invariant above, on one plan of each random cluster and queue (the cluster and the
    queue cost more to draw than to plan); and the plan of the queue in reverse is the same."""
    result = placement.plan(shot, requests, T0)
    _no_gpu_is_over_committed_and_closed_gpus_take_nothing(shot, result)
    _no_job_is_passed_over_by_a_later_one_that_needs_as_much(result)
    _only_lower_priority_preemptible_running_jobs_are_preempted_and_once(shot, result)
    _no_job_uses_gpus_reserved_for_a_job_ahead_of_it(result)
    assert placement.plan(shot, list(reversed(requests)), T0) == result


@contextmanager
def _replaced(method: str, replacement: object) -> Iterator[None]:
    """The planner with one of its methods replaced."""
    kept = getattr(placement._Planner, method)
    setattr(placement._Planner, method, replacement)
    try:
        yield
    finally:
        setattr(placement._Planner, method, kept)


def _scan(
    self: placement._Planner, request: Request, pool: Pool, static: Static, wanted: int
) -> placement.snapshot.Fit | None:
    """`_indexed_fit` without the fit indexes: every fit looks at every node."""
    return self._scan(request, pool, static, wanted, frozenset(), prune=False)


def _scan_gang(
    self: placement._Planner, request: Request, pool: Pool, static: Static
) -> list[placement.snapshot.Fit] | None:
    """`_fit_gang` without its index: every node looked at for every multi-node Job."""
    wanted = int(request.gpus)
    options = []
    for name, slots in static.groups:
        found = self._option(name, slots, request, pool, wanted)
        if found is not None:
            chosen, peers = capacity._pick(found[1], wanted)
            options.append(((*found[0], not peers), name, chosen))
    if len(options) < request.nodes:
        return None
    options.sort(key=lambda o: (o[0], o[1]))
    return [placement.snapshot.Fit(name, tuple(c)) for _, name, c in options[: request.nodes]]


def _exact_why(
    self: placement._Planner, request: Request, pool: Pool, static: Static, *_: object
) -> str:
    """`_why` without its cache: every waiting Job's message worked out afresh."""
    return diagnosis.why(static, self._blocker, request, pool)


def _decides_the_same_without(
    replacements: dict[str, object],
    shot: Snapshot,
    requests: list[Request],
    data: st.DataObject,
) -> None:
    """The planner decides as it does with each of its methods in `replacements` replaced, one
    at a time, over two passes, so that Jobs bound ahead in the first are decided again."""
    for _ in range(2):
        planned = placement.plan(shot, requests, T0)
        for method, replacement in replacements.items():
            with _replaced(method, replacement):
                try:
                    again = placement.plan(shot, requests, T0)
                except Exception as exc:  # named, as a test of its own would be
                    raise AssertionError(f"without {method}: {exc!r}") from exc
            assert again == planned, f"without {method}"
        ended = set(
            data.draw(st.sets(st.sampled_from([a.binding for a in shot.allocations])))
            if shot.allocations
            else set()
        )
        shot, requests = _after_pass(shot, planned.decisions, ended)


def _look_again(
    self: placement._Planner, request: Request, static: Static, wanted: int, _shape: object
) -> tuple[datetime | None, list[placement.snapshot.Slot]] | None:
    """`_soonest_to_reserve` without its memory: every first blocked Job looks at every GPU."""
    return self._soonest(request, static, wanted, reserving=True)


def _every_node(
    self: placement._Planner, request: Request, pool: Pool, static: Static, _shape: object
) -> preemption.Choice | None:
    """`_victims` without its index: every node looked at for every Job that preempts."""
    return preemption.choose(
        request, pool, static, stopping=self.stopping, blocker=self._blocker, now=self.now
    )


def _every_node_for_a_gang(
    self: placement._Planner, request: Request, pool: Pool, static: Static, _shape: object
) -> list[preemption.Member] | None:
    """`_gang_members` without its index: every node looked at for every multi-node Job that
    fits on too few nodes now."""
    options = []
    for name, slots in static.groups:
        found = preemption.member(
            name,
            slots,
            request,
            pool,
            fits=functools.partial(self._member_option, name, slots, request, pool),
            stopping=self.stopping,
            blocker=self._blocker,
            now=self.now,
        )
        if found is not None:
            options.append((found[0], name, found[1]))
    if len(options) < request.nodes:
        return None
    options.sort(key=lambda o: (o[0], o[1]))
    return [member for _, _, member in options[: request.nodes]]


_WAIT_OR_PREEMPT_GANG = placement._Planner._wait_or_preempt_gang


def _gang_looks_again(
    self: placement._Planner,
    request: Request,
    pool: Pool,
    static: Static,
    shape: tuple[object, ...],
) -> object:
    """`_wait_or_preempt_gang` without its memory of shapes that found too few nodes."""
    self.no_preemption.discard(shape)
    return _WAIT_OR_PREEMPT_GANG(self, request, pool, static, shape)


# What the planner keeps to decide faster (its fit indexes, a multi-node Job's, the preemption
# indexes, its cached messages, its memory of shapes that found nothing) against working it out
# afresh: each replaced by the exhaustive way, one at a time, on the same cluster and queue.
EXHAUSTIVE: dict[str, object] = {
    "_indexed_fit": _scan,
    "_fit_gang": _scan_gang,
    "_why": _exact_why,
    "_soonest_to_reserve": _look_again,
    "_victims": _every_node,
    "_gang_members": _every_node_for_a_gang,
    "_wait_or_preempt_gang": _gang_looks_again,
}


@settings(max_examples=300, deadline=None)
@given(clusters(backfill=True), queues(), st.data())
def test_what_the_planner_keeps_decides_as_looking_at_everything_again(
    shot: Snapshot, requests: list[Request], data: st.DataObject
) -> None:
    """Every fit index and memory decides as a scan of every node, every blocked Job looking
    for GPUs to reserve, every message worked out afresh would. Every Job here is at the head
    of its queue (QUEUE_HEAD): its message is worked out for it, or taken from one worked out
    since nothing it could show changed."""
    assert len(requests) <= placement.QUEUE_HEAD
    _decides_the_same_without(EXHAUSTIVE, shot, requests, data)


def _after_pass(
    shot: Snapshot, decisions: list[placement.Decision], ended: set[str]
) -> tuple[Snapshot, list[Request]]:
    """The store after a pass was applied and the attempts named in `ended` exited: placed
    Jobs run, Jobs bound ahead are queued attempts, the waiting ones are the next queue."""
    allocations = [a for a in shot.allocations if a.binding not in ended]
    requests = []
    for d in decisions:
        r = dataclasses.replace(d.request, queued=None)
        if d.placement is None:
            requests.append(r)
            continue
        for rank, (node, indices) in enumerate(d.placement.ranks()):  # a Binding per member
            bound = Allocation(
                r.namespace,
                r.name,
                f"{r.name}-1" + (f"-r{rank}" if rank else ""),
                node,
                indices,
                share=d.placement.share,
                memory=r.gpu_memory,
                priority=r.priority,
                uid=f"uid-{r.name}" + (f"-r{rank}" if rank else ""),
                queued=bool(d.placement.after),
            )
            allocations.append(bound)
            if bound.queued:
                requests.append(dataclasses.replace(r, queued=bound))
    return dataclasses.replace(shot, allocations=allocations), requests


@settings(max_examples=300, deadline=None)
@given(clusters(), queues(), st.data())
def test_jobs_bound_ahead_never_share_a_place_or_lose_it_to_a_start(
    shot: Snapshot, requests: list[Request], data: st.DataObject
) -> None:
    first = placement.plan(shot, requests, T0)
    running = sorted(a.binding for a in shot.allocations)
    ended = set(data.draw(st.lists(st.sampled_from(running), unique=True))) if running else set()
    shot, requests = _after_pass(shot, first.decisions, ended)
    second = placement.plan(shot, requests, T0 + timedelta(minutes=1))
    decided = {(d.request.namespace, d.request.name) for d in second.decisions}
    queued_on: dict[tuple[str, int], str] = {}
    for a in shot.allocations:  # attempts bound ahead that this pass leaves alone
        if a.queued and (a.namespace, a.job) not in decided:
            for index in a.gpus:
                queued_on[(a.node, index)] = a.job
    busy = {(a.node, i) for a in shot.allocations if not a.queued for i in a.gpus}
    waiting_there = {  # GPUs free now whose job bound ahead is about to start
        key
        for a in shot.allocations
        if a.queued
        for key in ((a.node, i) for i in a.gpus)
        if key not in busy
    }
    for d in second.decisions:  # a job bound ahead that moves or waits again frees its place
        if d.request.queued is not None and placement.changes(d):
            waiting_there -= _gpus_of(d.request.queued)
    started: set[tuple[str, int]] = set()
    for d in second.decisions:
        if d.placement is None:
            continue
        keys = [(node, i) for node, indices in d.placement.ranks() for i in indices]
        if d.placement.after:
            for key in keys:
                assert key not in queued_on, f"{d.request.name} and {queued_on[key]} both next"
                queued_on[key] = d.request.name
        else:  # starts now
            mine = d.request.queued
            for key in keys:
                if key in waiting_there and (mine is None or key not in _gpus_of(mine)):
                    raise AssertionError(f"{d.request.name} started on {key}, taken already")
            started.update(keys)
    for d in second.decisions:
        if d.placement is None and not d.victims:  # a reservation: the pool's first blocked Job
            taken = set(d.held) & (waiting_there - started)  # behind a start: may be reserved
            assert not taken, f"{d.request.name} reserved {taken}, where a job is about to start"


def _gpus_of(a: Allocation) -> set[tuple[str, int]]:
    return {(a.node, i) for i in a.gpus}


@st.composite
def busy_clusters(draw: st.DrawFn) -> Snapshot:
    """Every GPU busy with one whole job, of a priority from 2 to 5 (some stopping, some
    preemptible, some ending soon): where a pass may stop behind the head of the queue."""
    nodes, gpus, allocations = [], [], []
    for n in range(draw(st.integers(1, 3))):
        name = f"n{n}"
        nodes.append(Node(name))
        for index in range(draw(st.integers(1, 4))):
            gpus.append(GPU(name, index, "A100", 80 * GI))
            allocations.append(
                Allocation(
                    "default",
                    f"r-{name}-{index}",
                    f"r-{name}-{index}-1",
                    name,
                    (index,),
                    priority=draw(st.integers(2, 5)),
                    preemptible=draw(st.booleans()),
                    ends=draw(st.sampled_from((None, T0 + timedelta(minutes=5)))),
                    stopping=draw(st.sampled_from((None, None, None, "Preempted"))),
                )
            )
    pools = {
        "capped": Pool("capped", nodes=frozenset({"n0"}), preemption=False),
        "default": Pool("default", bind_ahead=draw(st.booleans()), backfill=draw(st.booleans())),
    }
    return Snapshot(nodes, gpus, pools, allocations)


@settings(max_examples=500, deadline=None)
@given(st.one_of(clusters(backfill=True), busy_clusters()), queues(), st.integers(0, 14))
def test_a_pass_stops_behind_the_head_only_where_the_rest_would_only_wait(
    shot: Snapshot, requests: list[Request], head: int
) -> None:
    """`plan(head=)` decides a prefix of what the whole plan decides, and every request it
    leaves the whole plan neither places (to start or bound ahead) nor lets preempt."""
    whole = placement.plan(shot, requests, T0)
    cut = placement.plan(shot, requests, T0, head=head)
    decided = len(cut.decisions)
    assert decided + cut.untold == len(whole.decisions)
    assert decided >= min(head, len(requests))
    assert cut.decisions == whole.decisions[:decided]
    for left in whole.decisions[decided:]:
        assert left.placement is None, left
        assert not left.victims, left
