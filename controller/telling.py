"""What a scheduling pass tells the Jobs it leaves waiting, and when it need not.

A waiting Job's `Scheduled=False` condition says why it waits (the planner's reason and
message) and its status when it should start; `report` writes them only when `stale` says they
changed in substance, so that a Job ending does not rewrite the queue behind it. `take` is the
pass's budget of status writes (`scheduling.Limits.writes`): False, and the next pass writes
it. A Job held back (suspended, in back-off, waiting for dependencies) loses its estimate
(`forget_queue`).
"""

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from controller import diagnosis, placement, reading
from gctl.api import job, meta
from gctl.store import store, stored

Wire = reading.Wire
# Reasons the pass sets in status.reason (the Job cannot be queued until a user acts); it
# clears them once they no longer hold, and leaves every other reason to the Job lifecycle.
OWN_REASONS = frozenset({job.REASON_POOL_NOT_FOUND, job.REASON_PROFILE_NOT_FOUND})


# What a waiting Job's stored status was found to say already: (reason, message) of a decision
# with no estimated start, for which `stale` does not depend on the time.
TOLD: reading.PassMemo[tuple[str | None, str]] = reading.PassMemo()


def told(w: Wire, d: placement.Decision, now: datetime) -> bool:
    """Whether the Job's status already says what the pass decided: `not stale`, taken from
    the last pass when the same stored Job was found to say the same."""
    if d.estimated_start is None and TOLD.get(w) == (d.reason, d.message):
        TOLD.put(w, (d.reason, d.message))
        return True
    if stale(w, d, now):
        return False
    if d.estimated_start is None and not w["status"].get("estimatedStartTime"):
        TOLD.put(w, (d.reason, d.message))
    return True


def report(
    writer: store.Store,
    w: Wire,
    d: placement.Decision,
    now: datetime,
    take: Callable[[], bool],
) -> None:
    """Tell a waiting Job why, where it stands and when it should start, if that changed."""
    if told(w, d, now):
        return
    if not take():
        return  # the next pass writes it
    j = stored.validated(job.Job, w)
    status = j.status
    meta.set_condition(
        status.conditions,
        job.CONDITION_SCHEDULED,
        "False",
        d.reason,
        d.message,
        generation=j.metadata.generation,
        now=now,
    )
    status.estimated_start_time = d.estimated_start
    if d.reason in OWN_REASONS:
        status.reason, status.message = d.reason, d.message
    elif status.reason in OWN_REASONS:
        status.reason, status.message = None, None
    writer.update_status(j)


def stale(w: Wire, d: placement.Decision, now: datetime) -> bool:
    """Whether what a waiting Job's status says differs from the decision enough to write.

    A waiting Job is rewritten only when the reason or the gist of the message changes (for
    the head of a pool's queue, which GPU states it names), or its estimate moves by more than
    10 % of the time left (at least 30 s): a Job ending must not rewrite the queue behind it.
    Its place in the queue is not stored at all."""
    status = w["status"]
    said = next(
        (c for c in status.get("conditions", []) if c["type"] == job.CONDITION_SCHEDULED), None
    )
    if said is None or (said["status"], said.get("reason"), said.get("observedGeneration")) != (
        "False",
        d.reason,
        w["metadata"].get("generation"),
    ):
        return True
    whole = d.position == 1  # the head of its pool's queue: the Job that others wait behind
    if diagnosis.gist(said.get("message", ""), whole=whole) != diagnosis.gist(
        d.message, whole=whole
    ):
        return True
    if _drifted(reading.parse_time(status.get("estimatedStartTime")), d.estimated_start, now):
        return True
    mine = (d.reason, d.message) if d.reason in OWN_REASONS else None
    has = status.get("reason"), status.get("message")
    return has != mine if mine else has[0] in OWN_REASONS


def _drifted(old: datetime | None, new: datetime | None, now: datetime) -> bool:
    if old is None or new is None:
        return old != new
    slack = max(timedelta(seconds=30), (new - now) / 10)
    return abs(old - new) > slack


def forget_queue(writer: store.Store, held: Iterable[Wire], take: Callable[[], bool]) -> None:
    """A Job held back (suspended, in back-off, waiting for dependencies) has no place in the
    queue and no estimated start."""
    with writer.batched():
        for w in held:
            status = w["status"]
            if status.get("estimatedStartTime") is None:
                continue
            if not take():
                return
            j = stored.validated(job.Job, w)
            j.status.estimated_start_time = None
            writer.update_status(j)
