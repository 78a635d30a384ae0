"""An object's wire form drops empty mappings and lists, as Kubernetes' `omitempty` does."""

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gctl.api import job, meta

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
KEYS = st.sampled_from(["spec", "status", "labels", "items", "a"])
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)


def _reference(value: Any) -> Any:
    """The rule, written plainly: every empty dict or list goes, but `spec` and `status`."""
    if isinstance(value, dict):
        kept = {}
        for key, item in value.items():
            pruned = _reference(item)
            if key in ("spec", "status") or not isinstance(pruned, dict | list) or pruned:
                kept[key] = pruned
        return kept
    if isinstance(value, list):
        return [_reference(item) for item in value]
    return value


@given(VALUES)
def test_prune_follows_the_rule(value: Any) -> None:
    assert meta.prune(value) == _reference(value)


def test_a_new_jobs_wire_keeps_an_empty_status_and_drops_empty_fields() -> None:
    wire = job.Job(metadata=meta.ObjectMeta(name="a"), spec=job.JobSpec(command="true")).wire()
    assert "labels" not in wire["metadata"]
    assert "env" not in wire["spec"]
    assert "conditions" not in wire["status"]
    assert wire["status"] is not None
