"""How an attempt's end moves its Job: Succeeded, Failed once its retries are spent, or back
in the queue (after a back-off, or not counted as a failure: suspended, preempted, evicted,
lost, re-run), with the Events that say so. `jobs` decides when an attempt has ended;
this module writes what that means, once.
"""

from datetime import datetime, timedelta

from gctl.api import binding, job, meta
from gctl.store import store

SOURCE = "controller/jobs"
BACKOFF_BASE = timedelta(seconds=10)
BACKOFF_CAP = timedelta(minutes=6)
_OUTCOMES = (job.CONDITION_COMPLETE, job.CONDITION_FAILED)
# The one requeue that goes on with the same run: a retry after a failure, as Kubernetes'
# activeDeadlineSeconds covers a Job's retries. Every other (suspended, preempted, evicted, a
# lost attempt, a re-run) counts no failure and ends the run: its start time is cleared, and
# the deadline counts again from the next start, as Kubernetes resets a resumed Job's startTime.
_SAME_RUN = frozenset({job.REASON_BACKOFF})


def backoff(failures: int, base: timedelta = BACKOFF_BASE) -> timedelta:
    """10 s, 20 s, 40 s ... capped at 6 min, as Kubernetes backs off failed Jobs."""
    wait: timedelta = min(BACKOFF_CAP, base * 2 ** max(0, failures - 1))
    return wait


def record_started(
    writer: store.Store,
    j: job.Job,
    attempt: binding.Binding,
    members: list[binding.Binding] | None = None,
) -> None:
    where = ", ".join(
        f"{b.spec.node}" + (f" (pid {b.status.pid})" if b.status.pid is not None else "")
        for b in members or [attempt]
    )
    writer.record_event(
        j, "Started", f"attempt {attempt.spec.attempt} started on {where}", source=SOURCE
    )


def _lost(attempt: binding.Binding) -> tuple[str, str]:
    """The reason and message of a Job whose attempt was lost or fenced, saying only what the
    attempt's status knows: its node was lost, or the attempt alone (the node is fine), or its
    fence stopped it. Neither says where the retry runs: the scheduler decides, and it may be
    the same node."""
    number, where = attempt.spec.attempt, attempt.spec.node
    if attempt.status.reason == binding.REASON_FENCED:
        return job.REASON_ATTEMPT_FENCED, (
            f"attempt {number} on {where} was stopped by its fence: the node's agent was "
            "silent for longer than --fence-after; retrying"
        )
    if attempt.status.reason == binding.REASON_NODE_LOST:
        lost, detail = f"attempt {number} was lost with node {where}", attempt.status.message
    else:  # its agent found it gone
        lost = f"attempt {number} on {where} was lost"
        detail = attempt.status.message or "it ended without an exit record"
    message = f"{lost}: {detail}; retrying" if detail else f"{lost}; retrying"
    return job.REASON_ATTEMPT_LOST, message


def account(
    writer: store.Store,
    j: job.Job,
    latest: binding.Binding,
    now: datetime,
    base: timedelta,
    *,
    members: list[binding.Binding] | None = None,
) -> None:
    """The latest attempt ended (`members`: a multi-node attempt's, `latest` the one that
    decides how): decide what that means for the Job, once."""
    if j.status.phase != "Running" and latest.status.start_time is not None:
        # It ran, and ended before the controller saw it running: Started is told now, before
        # how it ended, so that `describe` shows every attempt that ran.
        started = [m for m in members or [] if m.status.start_time is not None]
        record_started(writer, j, latest, started or None)
    status = j.status
    status.exit_code = latest.status.exit_code
    ends = [m.status.finish_time for m in members or [latest] if m.status.finish_time]
    ended = max(ends, default=None)  # its last member's, for a multi-node attempt
    # A Job bound ahead gets its start time from the first attempt of its run that started,
    # even one that ended before the controller saw it run (activeDeadlineSeconds counts from
    # it); a requeue that ends the run clears it again (`_SAME_RUN`).
    status.start_time = status.start_time or latest.status.start_time
    # What ended the attempt is what the agent observed: a stop asked for after the process
    # had already exited on its own does not count (its status.reason says how it ended).
    stop = latest.status.reason if latest.spec.stop_reason else None
    fenced = latest.status.reason == binding.REASON_FENCED  # its agent went silent
    if latest.status.phase == "Lost" or fenced:
        requeue(writer, j, *_lost(latest), now)
    elif stop == binding.STOP_SUSPENDED:
        requeue(writer, j, "Suspended", f"attempt {latest.spec.attempt} stopped: suspended", now)
    elif stop in job.REQUEUE_REASONS:
        j.status.preemptions += 1
        why = "preempted by a higher-priority Job" if stop == job.REASON_PREEMPTED else "evicted"
        requeue(
            writer,
            j,
            stop,
            f"attempt {latest.spec.attempt} on {latest.spec.node} was {why}; requeued "
            "without counting against backoffLimit",
            now,
        )
    elif stop == binding.STOP_RERUN:  # stopped for a re-run whose request has since gone
        start_over(j, now)
        message = f"attempt {latest.spec.attempt} was stopped to run the Job again; requeued"
        requeue(writer, j, job.REASON_RERUN, message, now)
    elif stop == binding.STOP_DEADLINE:
        finish(
            writer,
            j,
            "Failed",
            job.REASON_DEADLINE,
            f"stopped after activeDeadlineSeconds={j.spec.active_deadline_seconds}",
            now=now,
            ended=ended,
        )
    elif binding.succeeded(latest.status):
        # With a success file the agent's message says what decided: it names the file.
        how = latest.status.message if latest.status.success_file else None
        message = f"attempt {latest.spec.attempt} " + (
            f"succeeded: {how}" if how else f"exited with code {latest.status.exit_code}"
        )
        finish(writer, j, "Succeeded", job.REASON_COMPLETED, message, now=now, ended=ended)
    else:
        _fail_attempt(writer, j, latest, now, base, ended=ended)


def _fail_attempt(
    writer: store.Store,
    j: job.Job,
    latest: binding.Binding,
    now: datetime,
    base: timedelta,
    *,
    ended: datetime | None,
) -> None:
    status = j.status
    status.failed += 1
    how = latest.status.message or f"exit code {latest.status.exit_code}"
    if latest.status.signal:
        how += f" ({latest.status.signal})"
    if status.failed > j.spec.backoff_limit:
        missing = latest.status.reason == job.REASON_SUCCESS_FILE_MISSING
        finish(
            writer,
            j,
            "Failed",
            job.REASON_SUCCESS_FILE_MISSING if missing else job.REASON_BACKOFF_LIMIT,
            f"attempt {latest.spec.attempt} failed: {how}; backoffLimit "
            f"{j.spec.backoff_limit} reached",
            now=now,
            ended=ended,
        )
        return
    wait = backoff(status.failed, base)
    status.retry_after = now + wait
    requeue(
        writer,
        j,
        job.REASON_BACKOFF,
        f"attempt {latest.spec.attempt} failed: {how}; retry {status.failed} of "
        f"{j.spec.backoff_limit} in {int(wait.total_seconds())}s",
        now,
        warning=True,
    )


def start_over(j: job.Job, now: datetime) -> None:
    """Forget how the last run ended, so the next attempt is a fresh run: a new deadline, a
    new backoffLimit, Complete and Failed false again (so `gctl wait` waits for this run).
    `attempts` stays, so attempt numbers (and their logs) go on."""
    status = j.status
    status.completion_time = status.exit_code = status.retry_after = status.start_time = None
    status.failed = 0
    ended = [c.type for c in status.conditions if c.type in _OUTCOMES and c.status == "True"]
    for type_ in ended:
        meta.set_condition(
            status.conditions,
            type_,
            "False",
            job.REASON_RERUN,
            "the Job runs again",
            generation=j.metadata.generation,
            now=now,
        )


def requeue(
    writer: store.Store,
    j: job.Job,
    reason: str,
    message: str,
    now: datetime,
    *,
    warning: bool = False,
) -> None:
    """Back to the queue, saying why; a run that ends here (`_SAME_RUN`) forgets its start."""
    j.status.phase = "Pending"
    j.status.reason = reason
    j.status.message = message
    j.status.node = None
    j.status.gpus = None
    j.status.nodes = None
    if reason not in _SAME_RUN:
        j.status.start_time = None
    meta.set_condition(
        j.status.conditions,
        job.CONDITION_SCHEDULED,
        "False",
        reason,
        message,
        generation=j.metadata.generation,
        now=now,
    )
    j = writer.update_status(j)
    writer.record_event(j, reason, message, type_="Warning" if warning else "Normal", source=SOURCE)


def finish(
    writer: store.Store,
    j: job.Job,
    phase: str,
    reason: str,
    message: str,
    *,
    now: datetime,
    ended: datetime | None = None,
) -> None:
    """The Job is done. Its completion time is `ended`, when its last attempt ended as its
    agent recorded it (as Slurm's End), else `now`: a controller or agent that was down when
    the job exited must not add its downtime to the Job's duration."""
    status = j.status
    status.phase = "Succeeded" if phase == "Succeeded" else "Failed"
    status.reason = reason
    status.message = message
    # Never after now: an agent's clock ahead of this one's would put it in the future.
    status.completion_time = min(ended, now) if ended is not None else now
    condition = job.CONDITION_COMPLETE if phase == "Succeeded" else job.CONDITION_FAILED
    meta.set_condition(
        status.conditions,
        condition,
        "True",
        reason,
        message,
        generation=j.metadata.generation,
        now=now,
    )
    j = writer.update_status(j)
    writer.record_event(
        j, reason, message, type_="Normal" if phase == "Succeeded" else "Warning", source=SOURCE
    )
