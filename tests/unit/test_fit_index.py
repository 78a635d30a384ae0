"""The planner's fit indexes: each request shape remembers where it fits and looks again only
at nodes whose GPUs changed. These cases change a node by something other than a placement on
it, after the index of a shape was built, and check that the next request of that shape sees
the change (the property test in test_placement_properties compares whole plans)."""

from datetime import timedelta

from controller.placement import Pool
from tests.unit.test_bind_ahead import again, queued
from tests.unit.test_placement_rules import T0, at, decide, gpus, req, running, snapshot


def test_gpus_reserved_for_a_job_ahead_are_seen_by_the_next_job_of_an_indexed_shape() -> None:
    shot = snapshot(
        gpus("a", 1),
        gpus("b", 4),
        pools=[Pool("default", bind_ahead=False)],
        allocations=[running("busy2", "b", 2), running("busy3", "b", 3)],
    )
    result = decide(
        shot,
        req("r1", created=T0),  # builds the 1-GPU index, goes to a (fewest free)
        req("big", 3, created=T0 + timedelta(seconds=1)),  # reserves b's GPUs 0, 1 and one more
        req("r2", created=T0 + timedelta(seconds=2)),
    )
    assert at(result["r1"]) == ("a", (0,))
    assert at(result["big"]) is None
    assert result["big"].held == (("b", 0), ("b", 1), ("b", 2))
    assert at(result["r2"]) is None  # not on b's free GPUs: they are held for big
    assert "reserved" in (result["r2"].message or "")


def test_a_place_given_up_by_a_job_bound_ahead_is_seen_by_the_next_job_of_an_indexed_shape() -> (
    None
):
    # b/0 has freed and is the place of `ahead` (bound ahead to b/0 and b/1 in an earlier
    # pass; b/1 is still busy). `ahead` moves to c, which is free now: b/0 is nobody's then.
    place = queued("ahead", "b", 0, 1)
    shot = snapshot(
        gpus("a", 1),
        gpus("b", 2),
        gpus("c", 2),
        allocations=[running("busy", "b", 1, ends=T0 + timedelta(hours=1)), place],
    )
    result = decide(
        shot,
        req("r1", created=T0),  # builds the 1-GPU index while b/0 is ahead's place: goes to a
        again(req("ahead", 2, created=T0 + timedelta(seconds=1)), place),
        req("r2", created=T0 + timedelta(seconds=2)),
    )
    assert at(result["r1"]) == ("a", (0,))
    assert at(result["ahead"]) == ("c", (0, 1))
    assert at(result["r2"]) == ("b", (0,))


def test_a_later_estimated_start_is_seen_by_the_next_job_of_an_indexed_shape() -> None:
    # r1 builds the index of 1-GPU Jobs bound ahead, and takes a. Pool "later" never binds
    # ahead: w1 reserves c/0, w2 takes its place on the timeline after b/0's job (b/0 now frees
    # in 65 minutes). r2 is bound ahead to the GPU that frees soonest: b/1.
    minutes = [T0 + timedelta(minutes=m) for m in (1, 2, 5, 10)]
    shot = snapshot(
        gpus("a", 1),
        gpus("b", 2),
        gpus("c", 1),
        pools=[Pool("later", nodes=frozenset({"b", "c"}), bind_ahead=False)],
        allocations=[
            running("on-a", "a", 0, ends=minutes[0]),
            running("on-c", "c", 0, ends=minutes[1]),
            running("on-b0", "b", 0, ends=minutes[2]),
            running("on-b1", "b", 1, ends=minutes[3]),
        ],
    )
    hour = timedelta(hours=1)
    result = decide(
        shot,
        req("r1", created=T0),
        req("w1", pool="later", runtime=hour, created=T0 + timedelta(seconds=1)),
        req("w2", pool="later", runtime=hour, created=T0 + timedelta(seconds=2)),
        req("r2", created=T0 + timedelta(seconds=3)),
    )
    assert at(result["r1"]) == ("a", (0,))
    assert result["w1"].held == (("c", 0),)
    assert result["w2"].estimated_start == minutes[2]
    assert at(result["r2"]) == ("b", (1,))
