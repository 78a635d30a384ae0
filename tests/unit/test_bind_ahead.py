"""Binding ahead: a waiting Job becomes the next job of busy whole GPUs, and a pass decides it
again until its agent takes it (it stays, starts where its GPUs freed, moves, or waits again)."""

import dataclasses
from datetime import timedelta

from controller import placement
from controller.placement import Allocation, Node, Pool, Request
from tests.unit.test_placement_rules import T0, at, decide, gpus, req, running, snapshot


def queued(name: str, node: str, *indices: int, after: str = "") -> Allocation:
    """An attempt bound ahead in an earlier pass, not yet taken by its agent."""
    return Allocation("default", name, f"{name}-1", node, indices, uid=f"uid-{name}", queued=True)


def again(request: Request, allocation: Allocation) -> Request:
    """The Request a pass makes of a Job bound ahead."""
    return dataclasses.replace(request, queued=allocation)


def after(decision: placement.Decision) -> list[str]:
    assert decision.placement is not None
    return sorted(b.job if isinstance(b, Allocation) else b.name for b in decision.placement.after)


def test_a_waiting_job_is_bound_ahead_to_the_gpu_that_frees_soonest() -> None:
    shot = snapshot(
        gpus("a", 2),
        allocations=[
            running("long", "a", 0, ends=T0 + timedelta(hours=5)),
            running("short", "a", 1, ends=T0 + timedelta(minutes=5)),
        ],
    )
    result = decide(shot, req("j1"), req("j2"), req("j3"))
    assert (at(result["j1"]), after(result["j1"])) == (("a", (1,)), ["short"])
    assert (at(result["j2"]), after(result["j2"])) == (("a", (0,)), ["long"])
    assert at(result["j3"]) is None  # one job ahead per GPU
    assert result["j3"].message == "0/2 GPUs fit: 2 in use"


def test_jobs_placed_in_the_same_pass_are_waited_for() -> None:
    result = decide(snapshot(gpus("a", 1)), req("j1"), req("j2"))
    assert at(result["j1"]) == ("a", (0,))
    assert result["j1"].placement is not None
    assert not result["j1"].placement.after
    assert (at(result["j2"]), after(result["j2"])) == (("a", (0,)), ["j1"])


def test_a_multi_gpu_job_waits_for_every_job_on_its_gpus_of_one_node() -> None:
    shot = snapshot(
        gpus("a", 2),
        gpus("b", 1),
        allocations=[running("x", "a", 0), running("y", "a", 1), running("z", "b", 0)],
    )
    result = decide(shot, req("pair", 2))
    assert (at(result["pair"]), after(result["pair"])) == (("a", (0, 1)), ["x", "y"])


def test_fractions_are_never_bound_ahead_nor_ahead_of() -> None:
    shot = snapshot(
        gpus("a", 2),
        allocations=[
            running("half", "a", 0, share=0.5),
            running("whole", "a", 1),
        ],
    )
    result = decide(shot, req("big", 1), req("small", 0.6))
    assert (at(result["big"]), after(result["big"])) == (("a", (1,)), ["whole"])
    assert at(result["small"]) is None  # too full now, and a fraction waits in the queue


def test_a_pool_can_turn_it_off() -> None:
    shot = snapshot(
        gpus("a", 1),
        pools=[Pool("default", bind_ahead=False)],
        allocations=[running("x", "a", 0)],
    )
    result = decide(shot, req("next"))
    assert at(result["next"]) is None
    assert result["next"].held == (("a", 0),)  # it reserves the GPU instead


def test_closed_gpus_take_no_job_ahead() -> None:
    shot = snapshot(
        gpus("a", 1, state="Draining"),
        gpus("b", 1, state="Cordoned"),
        gpus("c", 1),
        nodes=[Node("c", ready=False)],
        allocations=[running("x", "a", 0), running("y", "b", 0), running("z", "c", 0)],
    )
    assert at(decide(shot, req("next"))["next"]) is None


def test_a_job_bound_ahead_stays_where_it_is_and_that_writes_nothing() -> None:
    mine = queued("next", "a", 1)
    shot = snapshot(
        gpus("a", 2),
        allocations=[
            running("x", "a", 0, ends=T0 + timedelta(minutes=1)),
            running("y", "a", 1, ends=T0 + timedelta(hours=1)),
            mine,
        ],
    )
    decision = placement.plan(shot, [again(req("next"), mine)], T0).decisions[0]
    assert at(decision) == ("a", (1,))  # GPU 0 frees sooner, but it does not move for that
    assert not placement.changes(decision)


def test_a_job_bound_ahead_starts_where_its_gpus_freed_and_nobody_takes_them() -> None:
    mine = queued("next", "a", 0)
    shot = snapshot(gpus("a", 2), allocations=[mine])
    result = decide(shot, req("early", priority=5), again(req("next"), mine))
    assert at(result["early"]) == ("a", (1,))  # not GPU 0: its agent is starting "next" there
    assert at(result["next"]) == ("a", (0,))
    assert not placement.changes(result["next"])


def test_a_multi_gpu_job_keeps_the_gpus_that_freed_while_the_others_run() -> None:
    mine = queued("pair", "a", 0, 1)
    shot = snapshot(gpus("a", 2), allocations=[running("y", "a", 1), mine])  # x on 0 ended
    result = decide(shot, again(req("pair", 2), mine), req("small", priority=-1))
    assert (at(result["pair"]), after(result["pair"])) == (("a", (0, 1)), ["y"])
    assert not placement.changes(result["pair"])
    assert at(result["small"]) is None  # GPU 0 stays free for the pair
    assert "taken by a job bound ahead" in result["small"].message


def test_a_job_bound_ahead_moves_to_a_gpu_that_is_free_now() -> None:
    mine = queued("next", "a", 0)
    shot = snapshot(gpus("a", 2), allocations=[running("x", "a", 0), mine])
    decision = decide(shot, again(req("next"), mine))["next"]
    assert at(decision) == ("a", (1,))
    assert decision.placement is not None
    assert not decision.placement.after
    assert placement.changes(decision)


def test_a_job_ahead_in_the_queue_takes_the_place_and_the_later_one_waits_again() -> None:
    mine = queued("later", "a", 0)
    shot = snapshot(gpus("a", 1), allocations=[running("x", "a", 0, preemptible=False), mine])
    result = decide(shot, req("urgent", priority=9), again(req("later"), mine))
    assert (at(result["urgent"]), after(result["urgent"])) == (("a", (0,)), ["x"])
    assert at(result["later"]) is None
    assert placement.changes(result["later"])
    assert result["later"].position == 1


def test_a_job_bound_ahead_leaves_a_gpu_that_is_being_drained() -> None:
    mine = queued("next", "a", 0)
    shot = snapshot(
        gpus("a", 1, state="Draining"),
        gpus("b", 1),
        allocations=[running("x", "a", 0), running("y", "b", 0), mine],
    )
    decision = decide(shot, again(req("next"), mine))["next"]
    assert (at(decision), after(decision)) == (("b", (0,)), ["y"])


def test_a_preempting_job_takes_the_gpu_from_the_job_bound_ahead_there() -> None:
    mine = queued("later", "a", 0)
    shot = snapshot(gpus("a", 1), allocations=[running("low", "a", 0), mine])
    result = decide(shot, req("high", priority=9), again(req("later"), mine))
    assert [v.job for v in result["high"].victims] == ["low"]
    assert at(result["later"]) is None  # else its agent would start it when "low" stops


def test_only_changes_count_against_max_placements() -> None:
    mine = queued("kept", "a", 0)
    shot = snapshot(gpus("a", 2), allocations=[running("x", "a", 0), running("y", "a", 1), mine])
    result = placement.plan(
        shot, [again(req("kept"), mine), req("new"), req("over")], T0, max_placements=1
    )
    assert [d.request.name for d in result.decisions] == ["kept", "new"]
    assert at(result.decisions[1]) == ("a", (1,))


def test_a_gpu_its_next_job_is_about_to_start_on_is_not_reserved_for_another() -> None:
    # "next" is bound ahead to GPU 0, whose job just ended: its agent is starting it there.
    # "half" is ahead of it in the queue, but may not share GPU 0 nor fit beside "y", so it
    # is the first blocked Job: it reserves GPU 1, not the GPU "next" is about to start on.
    mine = queued("next", "a", 0)
    y = running("y", "a", 1, preemptible=False)
    shot = snapshot(gpus("a", 2), allocations=[y, mine])
    result = decide(shot, req("half", 0.5, priority=9), again(req("next"), mine))
    assert at(result["half"]) is None
    assert result["half"].held == (("a", 1),)
    assert at(result["next"]) == ("a", (0,))
    assert not placement.changes(result["next"])


def test_a_job_ahead_takes_the_place_of_the_last_job_bound_ahead_not_the_next() -> None:
    # Three GPUs busy until nobody knows when, each with a Job bound ahead (a, b, c in queue
    # order). "urgent" comes first in the queue: it takes c's place, and only c waits again;
    # taking a's would move a to b's place and b to c's.
    places = [queued(name, "n", index) for index, name in enumerate("abc")]
    shot = snapshot(
        gpus("n", 3),
        allocations=[*(running(f"r{i}", "n", i, preemptible=False) for i in range(3)), *places],
    )
    result = decide(
        shot,
        req("urgent", priority=9),
        *(again(req(p.job, created=T0), p) for p in places),
    )
    assert (at(result["urgent"]), after(result["urgent"])) == (("n", (2,)), ["r2"])
    assert [placement.changes(result[name]) for name in "abc"] == [False, False, True]
    assert at(result["c"]) is None
