"""Conditions: the transition time moves only when the status flips."""

from datetime import UTC, datetime, timedelta

from gctl.api import meta

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_set_condition_reports_change_and_keeps_transition_time() -> None:
    conditions: list[meta.Condition] = []
    assert meta.set_condition(conditions, "Ready", "False", "Starting", now=T0)
    assert not meta.set_condition(conditions, "Ready", "False", "Starting", now=T0)
    later = T0 + timedelta(minutes=1)
    assert meta.set_condition(conditions, "Ready", "False", "StillStarting", now=later)
    assert conditions[0].last_transition_time == T0  # reason changed, status did not
    flipped = T0 + timedelta(minutes=2)
    assert meta.set_condition(conditions, "Ready", "True", "Up", now=flipped)
    assert conditions[0].last_transition_time == flipped
    assert len(conditions) == 1
