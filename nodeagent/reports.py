"""What the node agent reports of an attempt: the Binding status that says what its host knows
of it (runtime.State), and how an exit is worded."""

from collections.abc import Callable
from datetime import UTC, datetime

from gctl.api import binding, job
from nodeagent import runtime, supervisor

REPORTED = frozenset({"running", "exited", "lost"})  # the states a Binding's status tells


def status_after(
    bound: binding.Binding,
    state: runtime.State,
    now: datetime,
    log_path: Callable[[], str | None],
) -> binding.BindingStatus | None:
    """The attempt's status once what its host knows is written into it; None when there is
    nothing to tell yet. Running is told once the supervisor wrote the job's pid, so a
    Running attempt always has one. `log_path` says where its supervisor writes the log
    (None: nowhere, it was never launched here); asked only until the status holds one, which
    then never changes."""
    if state.phase not in REPORTED or (state.phase == "running" and state.pid is None):
        return None
    status = bound.status.model_copy(deep=True)
    status.log_path = status.log_path or log_path()
    started = None if state.started is None else datetime.fromtimestamp(state.started, UTC)
    # An attempt that ended before a pass saw it running still started: say when.
    status.start_time = status.start_time or started
    if state.phase == "running":
        status.phase = "Running"
        status.pid = state.pid or status.pid
        status.start_time = status.start_time or now
    elif state.phase == "exited":
        status.phase = "Exited"
        status.pid = state.pid or status.pid
        status.exit_code = state.exit_code
        status.signal = state.signal
        # When the supervisor saw the job end, not when this pass noticed (a pass later).
        finished = state.finished
        status.finish_time = now if finished is None else datetime.fromtimestamp(finished, UTC)
        status.success_file = _success_file(state.success_file)
        ended, how = exit_outcome(state)
        status.reason = state.reason or (bound.spec.stop_reason if state.stopped else None) or ended
        status.message = state.message or how
    elif state.phase == "lost":
        status.phase = "Lost"
        status.finish_time = now
        status.reason = binding.REASON_LOST
        status.message = state.message
    return status


REASON_LOST_ENDED = "LostAttemptEnded"  # the Event on a Job: how an attempt lost here ended


def lost_and_ended(
    bound: binding.Binding, state: runtime.State
) -> tuple[binding.BindingStatus, str] | None:
    """How an attempt declared Lost (its node was silent past the timeout) really ended, once
    its agent is back and finds the exit its supervisor recorded: the status it keeps (phase
    Lost, as its Job was requeued on it, with the exit code, signal and the time the job
    ended) and the message of the Event on its Job. None when there is nothing to add: it has
    not ended, never started, or its exit is told already."""
    if state.phase != "exited" or state.exit_code is None or bound.status.exit_code is not None:
        return None
    status = bound.status.model_copy(deep=True)
    status.exit_code = state.exit_code
    status.signal = state.signal
    status.pid = state.pid or status.pid
    if state.finished is not None:  # when the supervisor saw it end, not when it was lost
        status.finish_time = datetime.fromtimestamp(state.finished, UTC)
    at = "" if status.finish_time is None else f" at {status.finish_time:%Y-%m-%dT%H:%M:%SZ}"
    code = f"code {state.exit_code}" + (f" ({state.signal})" if state.signal else "")
    if state.reason == supervisor.FENCED:
        how = f"was stopped by its supervisor, its agent silent past the fence: exit {code}{at}"
    elif state.stopped:
        how = f"was still running when its agent came back, which stopped it: exit {code}{at}"
    else:
        how = f"exited with {code}{at}"
    spec = bound.spec
    return status, f"attempt {spec.attempt} on {spec.node}, lost while the node was silent, {how}"


def exit_outcome(state: runtime.State) -> tuple[str, str | None]:
    """The reason and message of an attempt that exited on its own. With a success file, the
    file decides and the message names it; the exit code is kept either way."""
    code = state.exit_code
    if state.success_file == binding.SUCCESS_FILE_FOUND:
        if code == 0:
            return "Completed", f"exit code 0; success file {state.success_path} was written"
        return "Completed", (
            f"exit code {code}, but success file {state.success_path} was written, "
            "so the attempt succeeded"
        )
    if state.success_file == binding.SUCCESS_FILE_MISSING:
        return job.REASON_SUCCESS_FILE_MISSING, (
            f"exit code {code}; success file {state.success_path} was not written "
            "after the attempt started"
        )
    return ("Completed" if code == 0 else "Error"), None


def _success_file(value: str | None) -> binding.SuccessFile | None:
    if value == binding.SUCCESS_FILE_FOUND:
        return binding.SUCCESS_FILE_FOUND
    if value == binding.SUCCESS_FILE_MISSING:
        return binding.SUCCESS_FILE_MISSING
    return None
