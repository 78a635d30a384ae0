"""Placement over plain snapshots: no database, no processes."""

from datetime import UTC, datetime, timedelta

import pytest

from controller import placement
from controller.placement import GPU, Allocation, Node, Request, Snapshot

GI = 2**30
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def cluster(*nodes: tuple[str, int, str, int]) -> Snapshot:
    """nodes: (name, gpu count, model, memory in GiB)."""
    gpus = [
        GPU(name, i, model, memory * GI)
        for name, count, model, memory in nodes
        for i in range(count)
    ]
    return Snapshot(nodes=[Node(n[0]) for n in nodes], gpus=gpus)


def req(name: str, gpus: float, **extra: object) -> Request:
    return Request("default", name, gpus, **extra)  # type: ignore[arg-type]


def where(result: placement.Plan) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {
        d.request.name: (d.placement.node, d.placement.gpus)
        for d in result.decisions
        if d.placement is not None
    }


def test_whole_gpus_stay_on_one_node() -> None:
    result = placement.plan(
        cluster(("a", 2, "A100", 80), ("b", 4, "A100", 80)),
        [req("big", 3), req("two", 2), req("one", 1)],
        T0,
    )
    assert where(result) == {"big": ("b", (0, 1, 2)), "two": ("a", (0, 1)), "one": ("b", (3,))}


def test_nothing_fits_when_no_node_has_enough() -> None:
    result = placement.plan(
        cluster(("a", 2, "A100", 80), ("b", 2, "A100", 80)), [req("big", 3)], T0
    )
    (decision,) = result.decisions
    assert decision.placement is None
    assert decision.reason == "Unschedulable"
    assert decision.message == "4/4 GPUs fit, but no node has 3 of them"


def test_fractions_share_a_gpu_up_to_one() -> None:
    result = placement.plan(
        cluster(("a", 1, "A100", 80)), [req("h1", 0.5), req("h2", 0.5), req("h3", 0.5)], T0
    )
    assert where(result) == {"h1": ("a", (0,)), "h2": ("a", (0,))}
    assert result.decisions[2].message == "0/1 GPUs fit: 1 too full for 0.5 GPU"


def test_thirds_fit_despite_rounding() -> None:
    result = placement.plan(
        cluster(("a", 1, "A100", 80)), [req(f"t{i}", 1 / 3) for i in range(3)], T0
    )
    assert len(where(result)) == 3


def test_whole_gpu_does_not_take_a_shared_one_and_fraction_skips_a_full_one() -> None:
    snapshot = cluster(("a", 2, "A100", 80))
    snapshot.allocations = [Allocation("default", "old", "old-1", "a", (0,), share=0.25)]
    result = placement.plan(snapshot, [req("whole", 1), req("quarter", 0.5)], T0)
    assert where(result) == {"whole": ("a", (1,)), "quarter": ("a", (0,))}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"node": "b"}, ("b", (0,))),
        ({"pinned": (1,)}, ("a", (1,))),
        ({"node": "b", "pinned": (1,)}, ("b", (1,))),
        ({"gpu_model": "*h100*"}, ("b", (0,))),
        ({"gpu_model": "A100"}, ("a", (0,))),
        ({"gpu_memory": 60 * GI}, ("b", (0,))),
        ({"gpu_memory": 100 * GI}, None),
        ({"node": "nowhere"}, None),
    ],
)
def test_constraints(
    extra: dict[str, object], expected: tuple[str, tuple[int, ...]] | None
) -> None:
    snapshot = cluster(("a", 2, "A100", 40), ("b", 2, "NVIDIA H100 80GB HBM3", 80))
    result = placement.plan(snapshot, [req("j", 1, **extra)], T0)
    assert where(result).get("j") == expected


def test_cpu_only_jobs_need_a_node_but_no_gpu() -> None:
    snapshot = cluster(("a", 1, "A100", 80))
    snapshot.allocations = [Allocation("default", "busy", "busy-1", "a", (0,))]
    (decision,) = placement.plan(snapshot, [req("collect", 0)], T0).decisions
    assert decision.placement is not None
    assert (decision.placement.node, decision.placement.gpus, decision.placement.share) == (
        "a",
        (),
        0.0,
    )
    (nowhere,) = placement.plan(Snapshot(nodes=[], gpus=[]), [req("collect", 0)], T0).decisions
    assert (nowhere.placement, nowhere.message) == (None, "0/0 nodes fit")


def test_queue_order_is_respected_but_a_job_that_can_never_fit_does_not_block_others() -> None:
    result = placement.plan(
        cluster(("a", 2, "A100", 80)), [req("first", 1), req("huge", 4), req("second", 1)], T0
    )
    assert [d.request.name for d in result.decisions if d.placement] == ["first", "second"]


def test_queue_order_is_priority_then_submission_then_name() -> None:
    early, late = T0, T0.replace(hour=1)
    requests = [
        req("c-late", 1, created=late),
        req("b-early", 1, created=early),
        req("a-late", 1, created=late),
        req("z-urgent", 1, created=late, priority=5),
    ]
    result = placement.plan(cluster(("a", 4, "A100", 80)), requests, T0)
    assert [d.request.name for d in result.decisions] == ["z-urgent", "b-early", "a-late", "c-late"]


@pytest.mark.parametrize("backfill", [False, True])
def test_run_times_past_the_last_datetime_do_not_stop_a_pass(backfill: bool) -> None:
    """A pass must not fail on far deadlines (stored before durations were limited, or a
    long queue of them one after another): those times saturate at 'never'."""
    forever = timedelta(days=365 * 100)  # a century: past datetime.max from `last`
    last = datetime.max.replace(tzinfo=UTC) - timedelta(days=1)
    pools = {"p": placement.Pool("p", backfill=backfill)}
    world = Snapshot(
        nodes=[Node("n1")],
        gpus=[GPU("n1", 0, "A100", 80 * GI)],
        pools=pools,
        allocations=[Allocation("default", "old", "old-1", "n1", (0,), ends=last)],
    )
    queue = [
        req(name, 1, pool="p", runtime=forever, deadline=int(forever.total_seconds()))
        for name in ("a", "b", "c")
    ]
    result = placement.plan(world, queue, T0)
    ahead = [d.placement is not None and bool(d.placement.after) for d in result.decisions]
    assert ahead == [True, False, False]  # a: next on the GPU; b and c wait


# -- a pass that starts Jobs decides no further than what could start (`starts_only`) --------


def _busy(node: str, index: int) -> Allocation:
    return Allocation("default", f"on-{index}", f"on-{index}-1", node, (index,), uid=f"u{index}")


def _one_free(*attempts: Allocation) -> Snapshot:
    """Node a with 4 GPUs, the first free, the others busy with `attempts`."""
    return Snapshot([Node("a")], cluster(("a", 4, "A100", 80)).gpus, {}, list(attempts))


def test_a_starting_pass_leaves_the_rest_of_the_queue_once_no_gpu_has_room() -> None:
    """Binding ahead and telling the waiting Jobs are the next pass's anyway (writing)."""
    queue = [req(f"j{i}", 1, created=T0 + timedelta(seconds=i)) for i in range(50)]
    shot = _one_free(_busy("a", 1), _busy("a", 2), _busy("a", 3))
    full = placement.plan(shot, queue, T0)
    cut = placement.plan(shot, queue, T0, starts_only=True)
    assert where(cut) == {"j0": ("a", (0,))}
    assert (len(cut.decisions), cut.undecided, cut.complete) == (1, 49, True)
    assert cut.decisions == full.decisions[:1]
    assert (len(full.decisions), full.undecided) == (50, 0)


def test_a_starting_pass_goes_on_to_a_later_job_that_needs_no_gpu() -> None:
    queue = [req(f"j{i}", 1, created=T0 + timedelta(seconds=i)) for i in range(5)]
    queue.append(req("cpu", 0, created=T0 + timedelta(seconds=99)))
    shot = _one_free(_busy("a", 1), _busy("a", 2), _busy("a", 3))
    cut = placement.plan(shot, queue, T0, starts_only=True)
    assert cut.undecided == 0
    assert cut.decisions == placement.plan(shot, queue, T0).decisions
    assert cut.decisions[-1].placement is not None  # it starts now


def test_a_starting_pass_goes_on_while_a_later_job_could_preempt() -> None:
    """`first` takes the free GPU; `second`, as urgent, may still preempt an attempt of lower
    priority; the Jobs of the attempts' own priority after them cannot, and are left."""
    queue = [
        req("first", 1, priority=5, created=T0),
        req("second", 1, priority=5, created=T0 + timedelta(seconds=1)),
    ]
    queue += [req(f"j{i}", 1, created=T0 + timedelta(seconds=i)) for i in range(5)]
    shot = _one_free(_busy("a", 1), _busy("a", 2), _busy("a", 3))
    cut = placement.plan(shot, queue, T0, starts_only=True)
    assert cut.decisions == placement.plan(shot, queue, T0).decisions[:2]
    assert where(cut) == {"first": ("a", (0,))}
    assert cut.decisions[1].victims  # second preempts
    assert cut.undecided == 5


def test_a_pass_that_starts_nothing_decides_every_request() -> None:
    """No GPU free: nothing starts, so the pass binds ahead and tells every Job why it waits."""
    queue = [req(f"j{i}", 1, created=T0 + timedelta(seconds=i)) for i in range(5)]
    shot = _one_free(_busy("a", 0), _busy("a", 1), _busy("a", 2), _busy("a", 3))
    cut = placement.plan(shot, queue, T0, starts_only=True)
    assert (len(cut.decisions), cut.undecided) == (5, 0)


def test_a_starting_pass_decides_every_job_bound_ahead() -> None:
    """`n` takes `p`'s place behind `x`; `p` moves to `q`'s, behind `x2` (that move is written
    even by a pass that starts a Job: `z`, on b). A pass that stopped after `z` started left
    `q` undecided, still next on a's GPU 1 beside `p`."""
    p = Allocation("default", "p", "p-1", "a", (0,), uid="up", queued=True)
    q = Allocation("default", "q", "q-1", "a", (1,), uid="uq", queued=True)
    shot = Snapshot(
        [Node("a"), Node("b")],
        cluster(("a", 2, "A100", 80), ("b", 1, "A100", 80)).gpus,
        {},
        [
            Allocation(
                "default", "x", "x-1", "a", (0,), priority=10, ends=T0 + timedelta(minutes=1)
            ),
            Allocation(
                "default", "x2", "x2-1", "a", (1,), priority=10, ends=T0 + timedelta(hours=1)
            ),
            p,
            q,
        ],
    )
    queue = [
        req("n", 1, priority=5, node="a"),
        req("p", 1, node="a", created=T0, queued=p),
        req("z", 1, created=T0 + timedelta(seconds=1)),
        req("q", 1, created=T0 + timedelta(seconds=2), queued=q),
    ]
    cut = placement.plan(shot, queue, T0, starts_only=True)
    full = placement.plan(shot, queue, T0)
    assert where(full)["p"] == ("a", (1,))  # p moves to q's place ...
    assert cut.decisions == full.decisions  # ... and q, decided, moves on


# -- a pass decides no further than the head while the rest could only wait (`head`) ---------


def _all_busy() -> Snapshot:
    """Node a with 4 GPUs, each busy with one job: the first four Jobs bind ahead."""
    return _one_free(_busy("a", 0), _busy("a", 1), _busy("a", 2), _busy("a", 3))


def test_a_pass_leaves_the_queue_behind_the_head_once_the_rest_could_only_wait() -> None:
    """j0-j3 bind ahead; j4 finds no place, and no later Job could do more than wait."""
    queue = [req(f"j{i}", 1, created=T0 + timedelta(seconds=i)) for i in range(10)]
    shot = _all_busy()
    full = placement.plan(shot, queue, T0)
    cut = placement.plan(shot, queue, T0, head=2)
    assert (len(cut.decisions), cut.untold, cut.undecided) == (5, 5, 0)
    assert cut.decisions == full.decisions[:5]
    assert [n for n, (_, _) in where(cut).items()] == ["j0", "j1", "j2", "j3"]
    assert (len(full.decisions), full.untold) == (10, 0)


def test_a_pass_decides_the_whole_head_even_when_the_rest_could_only_wait() -> None:
    queue = [req(f"j{i}", 1, created=T0 + timedelta(seconds=i)) for i in range(10)]
    cut = placement.plan(_all_busy(), queue, T0, head=8)
    assert (len(cut.decisions), cut.untold) == (8, 2)


def test_a_pass_goes_on_to_a_later_shape_that_may_still_bind_ahead() -> None:
    """The left pool's Jobs fill GPUs 0 and 1; the right pool's Job, last in the queue, still
    finds GPUs 2 and 3 to be next on."""
    pools = {
        "left": placement.Pool("left", gpus=frozenset({0, 1})),
        "right": placement.Pool("right", gpus=frozenset({2, 3})),
    }
    shot = _all_busy()
    shot.pools.update(pools)
    queue = [req(f"l{i}", 1, pool="left", created=T0 + timedelta(seconds=i)) for i in range(8)]
    queue.append(req("r", 2, pool="right", created=T0 + timedelta(seconds=99)))
    cut = placement.plan(shot, queue, T0, head=1)
    assert cut.untold == 0
    assert cut.decisions == placement.plan(shot, queue, T0).decisions
    assert where(cut)["r"] == ("a", (2, 3))


def test_a_pass_goes_on_while_a_gpu_has_room_or_a_later_job_could_preempt() -> None:
    queue = [req(f"j{i}", 1, created=T0 + timedelta(seconds=i)) for i in range(10)]
    room = placement.plan(_one_free(_busy("a", 1), _busy("a", 2), _busy("a", 3)), queue, T0)
    assert room.untold == 0
    low = [
        Allocation("default", f"on-{i}", f"on-{i}-1", "a", (i,), uid=f"u{i}", priority=-1)
        for i in range(4)
    ]
    cut = placement.plan(_one_free(*low), queue, T0, head=2)
    assert cut.untold == 0
    assert sum(1 for d in cut.decisions if d.victims) == 4


def test_a_pass_decides_everything_past_a_few_shapes() -> None:
    """Past `depth.Tail.MAX_SHAPES` shapes left, looking at each at every step costs more than
    deciding the rest."""
    queue = [
        req(f"j{i:02d}", 1, deadline=60 + i, created=T0 + timedelta(seconds=i)) for i in range(40)
    ]
    cut = placement.plan(_all_busy(), queue, T0, head=2)
    assert cut.untold == 0
