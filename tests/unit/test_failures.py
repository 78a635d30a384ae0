"""A loop's failed passes in the log: one line for the project's own errors, a traceback for
anything else, and a repeat held back for a minute, then told with its count."""

import logging

import pytest

from gctl.api import errors, failures

FULL = errors.Unavailable("database sqlite:////x/gctl.db: database or disk is full")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def failure_log(clock: Clock) -> failures.FailureLog:
    return failures.FailureLog(logging.getLogger("gctl.test"), clock=clock)


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, bool]]:
    """Each record's message, and whether it carries a traceback."""
    return [(r.getMessage(), r.exc_info is not None) for r in caplog.records]


def test_an_error_of_our_own_is_one_line_and_its_repeats_are_held(
    failure_log: failures.FailureLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(30):  # once a second, as the agent retries
        failure_log.failed("agent pass", FULL)
        clock.now += 1
    assert lines(caplog) == [(f"agent pass failed; retrying: {FULL}", False)]
    assert caplog.records[0].levelno == logging.WARNING
    for _ in range(31):
        failure_log.failed("agent pass", FULL)
        clock.now += 1
    assert lines(caplog)[1:] == [
        (f"agent pass failed; retrying: {FULL} (and 59 time(s) more in the 60s before)", False)
    ]


def test_a_different_error_is_told_at_once(
    failure_log: failures.FailureLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    failure_log.failed("schedule", FULL)
    failure_log.failed("job/default/a", FULL)  # the same cause from another step: held
    failure_log.failed("schedule", errors.Unavailable("database x: database is locked"))
    clock.now += 1
    failure_log.failed("schedule", FULL)
    assert [message for message, _ in lines(caplog)] == [
        f"schedule failed; retrying: {FULL}",
        "schedule failed; retrying: database x: database is locked",
    ]


def test_an_unexpected_error_keeps_its_traceback(
    failure_log: failures.FailureLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    try:
        {}["missing"]
    except KeyError as exc:
        failure_log.failed("agent pass", exc)
        failure_log.failed("agent pass", exc)
    assert lines(caplog) == [("agent pass failed; retrying", True)]
    assert caplog.records[0].levelno == logging.ERROR
    assert "KeyError: 'missing'" in caplog.text


def test_a_failure_that_stopped_is_told_afresh_later(
    failure_log: failures.FailureLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    failure_log.failed("agent pass", FULL)
    clock.now += 3600
    failure_log.failed("agent pass", FULL)
    assert [message for message, _ in lines(caplog)] == [
        f"agent pass failed; retrying: {FULL}",
        f"agent pass failed; retrying: {FULL}",
    ]
