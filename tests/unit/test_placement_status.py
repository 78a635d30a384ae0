"""The scheduling pass's pure parts: a stored Job read as a placement request (its profile
applied), and whether what a waiting Job's status says is stale enough to write."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller import placement, reading, telling
from gctl.api import profile
from tests.builders import make_binding

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GI = 2**30
RUN_TIMES: dict[str, timedelta] = {}  # no earlier runs, the same at every pass


def world(**profiles: profile.GPUProfileSpec) -> reading.World:
    return reading.World(placement.Snapshot([], []), {}, {}, dict(profiles), {})


def wire(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "namespace": "default", "generation": 1},
        "spec": {"command": ["true"], **spec},
        "status": status or {},
    }


LLM = profile.GPUProfileSpec(gpus=2, gpu_memory="48Gi", gpu_model="*H100*")


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({}, (1.0, None, None)),
        ({"profile": "llm"}, (2.0, 48 * GI, "*H100*")),
        ({"profile": "llm", "gpus": 1, "gpuModel": "*A100*"}, (1.0, 48 * GI, "*A100*")),
        ({"profile": "llm", "gpuMemory": "20Gi"}, (2.0, 20 * GI, "*H100*")),
    ],
)
def test_a_profile_fills_only_what_the_job_leaves_out(
    resources: dict[str, Any], expected: tuple[float, int | None, str | None]
) -> None:
    found = reading.request_of(wire({"resources": resources}), world(llm=LLM))
    assert (found.gpus, found.gpu_memory, found.gpu_model, found.problem) == (*expected, None)


def test_a_missing_profile_and_a_pin_that_no_longer_matches_are_problems() -> None:
    missing = reading.request_of(wire({"resources": {"profile": "gone"}}), world())
    assert missing.problem is not None
    assert missing.problem[0] == "GPUProfileNotFound"
    pinned = wire({"resources": {"profile": "llm"}, "placement": {"gpus": [0]}})
    mismatch = reading.request_of(pinned, world(llm=LLM)).problem
    assert mismatch == (
        "Unschedulable",
        "spec.placement.gpus lists 1 GPU(s) but GPUProfile llm asks for 2: list at least 2",
    )


def test_pool_and_deadline_are_read() -> None:
    found = reading.request_of(
        wire({"pool": "train", "activeDeadlineSeconds": 60, "priority": 3}), world()
    )
    assert (found.pool, found.deadline, found.runtime, found.priority) == (
        "train",
        60,
        timedelta(seconds=60),
        3,
    )


@pytest.mark.parametrize("deadline", [300_000_000_000, 10**20, 365 * 86_400 + 1, -5, "60", True])
def test_a_stored_deadline_gctl_no_longer_accepts_counts_as_none(deadline: object) -> None:
    """Stored by an older gctl (or written by hand): the plan could not add such a deadline
    to a time, so it knows no deadline for the Job rather than failing every pass."""
    found = reading.request_of(wire({"activeDeadlineSeconds": deadline}), world())
    assert (found.deadline, found.runtime) == (None, None)
    running = make_binding("j", "n1", [0])
    running.status.start_time = T0
    owner = wire({"activeDeadlineSeconds": deadline}, {"startTime": T0.isoformat()})
    assert reading.allocation_of(running, owner, {}).ends is None


def test_a_deadline_of_a_year_is_still_read() -> None:
    year = 365 * 86_400
    found = reading.request_of(wire({"activeDeadlineSeconds": year}), world())
    assert (found.deadline, found.runtime) == (year, timedelta(days=365))
    running = make_binding("j", "n1", [0])
    owner = wire({"activeDeadlineSeconds": year}, {"startTime": T0.isoformat()})
    assert reading.allocation_of(running, owner, {}).ends == T0 + timedelta(days=365)


def test_a_pass_over_the_head_keeps_every_value_and_a_whole_pass_drops_those_it_missed() -> None:
    """`PassMemo`: a pass that may decide only the head of the queue keeps the values of the
    Jobs it did not look at (they are told nothing new); the next whole pass keeps only those
    of the Jobs it read, and a new version of a Job (a new object) never finds its old value."""
    memo: reading.PassMemo[str] = reading.PassMemo()
    head, behind, gone = wire({}), wire({}), wire({})
    memo.begin(3)
    for w, value in ((head, "head"), (behind, "behind"), (gone, "gone")):
        memo.put(w, value)

    memo.begin(2, whole=False)  # `gone` left the queue; the pass reads `head` alone
    assert memo.get(head) == "head"
    memo.put(head, "head, told again")
    memo.begin(2, whole=True)  # reads both, and keeps what it found (`telling.told`)
    for w in (head, behind):
        found = memo.get(w)
        assert found is not None
        memo.put(w, found)
    assert memo.get(wire({})) is None
    assert len(memo) == 2  # `gone` dropped: the whole pass did not meet it
    memo.begin(2)
    assert memo.get(gone) is None
    assert memo.get(head) == "head, told again"
    assert memo.get(behind) == "behind"


def said(message: str, position: int | None, start: datetime | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [
            {
                "type": "Scheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "observedGeneration": 1,
            }
        ]
    }
    del position  # not stored: printed from the queue's order (gctl.api.queue)
    if start is not None:
        status["estimatedStartTime"] = start.isoformat()
    return status


def decision(
    message: str, position: int | None, start: datetime | None = None
) -> placement.Decision:
    return placement.Decision(
        placement.Request("default", "j"),
        reason="Unschedulable",
        message=message,
        position=position,
        estimated_start=start,
    )


@pytest.mark.parametrize(
    ("stored", "now_says", "write"),
    [
        (said("0/8 GPUs fit: 8 in use", 3), decision("0/8 GPUs fit: 8 in use", 3), False),
        # the place in the queue is not stored: moving up rewrites nothing
        (said("0/8 GPUs fit: 8 in use", 3), decision("0/8 GPUs fit: 8 in use", 2), False),
        (said("0/8 GPUs fit: 8 in use", 500), decision("0/8 GPUs fit: 8 in use", 440), False),
        # only the gist of the message: its first clause without the numbers
        (
            said("0/8 GPUs fit: 8 in use", 3),
            decision("0/8 GPUs fit: 7 in use, 1 reserved", 3),
            False,
        ),
        (
            said("0/8 GPUs fit: 8 in use", 500),
            decision("0/8 GPUs fit: 8 cordoned", 500),
            True,
        ),
        # the head of the queue: every clause, still without the numbers
        (
            said("1/4 GPUs fit, but no node has 5 of them: 3 in use", 1),
            decision("4/4 GPUs fit, but no node has 5 of them", 1),
            True,
        ),
        (
            said("1/4 GPUs fit, but no node has 5 of them: 3 in use", 2),
            decision("4/4 GPUs fit, but no node has 5 of them", 2),
            False,
        ),
        (
            said("0/8 GPUs fit: 8 in use", 1),
            decision("0/8 GPUs fit: 7 in use", 1),
            False,
        ),
        (said("x", None), decision("x", None), False),
        (said("x", 1, T0 + timedelta(hours=1)), decision("x", 1, None), True),
        (
            said("x", 1, T0 + timedelta(hours=1)),
            decision("x", 1, T0 + timedelta(hours=1, minutes=5)),
            False,
        ),
        (
            said("x", 1, T0 + timedelta(hours=1)),
            decision("x", 1, T0 + timedelta(hours=1, minutes=7)),
            True,
        ),
        ({}, decision("x", 1), True),
    ],
)
def test_only_a_change_that_matters_is_written(
    stored: dict[str, Any], now_says: placement.Decision, write: bool
) -> None:
    assert telling.stale(wire({}, stored), now_says, T0) == write


def test_a_reason_of_the_schedulers_own_is_set_and_cleared() -> None:
    lost = placement.Decision(
        placement.Request("default", "j"), reason="GPUPoolNotFound", message="no pool"
    )
    stored = said("no pool", None)
    stored["conditions"][0]["reason"] = "GPUPoolNotFound"
    assert telling.stale(wire({}, stored), lost, T0)
    stored |= {"reason": "GPUPoolNotFound", "message": "no pool"}
    assert not telling.stale(wire({}, stored), lost, T0)
    later = said("x", 1) | {"reason": "GPUPoolNotFound", "message": "no pool"}
    assert telling.stale(wire({}, later), decision("x", 1), T0)
