"""apply's decision for each manifest, computed from plain objects (no database)."""

from datetime import UTC, datetime

import pytest

from gctl.api import errors, job, manifest, meta, sweep
from gctl.store import applysets, planning
from tests.builders import make_job

SOURCE = manifest.Source("job.yaml", 1)


def _stored(builder_job: job.Job, phase: str = "Pending", rv: str = "7") -> job.Job:
    stored = builder_job.model_copy(deep=True)
    stored.metadata.namespace = "default"
    stored.metadata.uid = "uid-1"
    stored.metadata.generation = 1
    stored.metadata.resource_version = rv
    stored.metadata.creation_timestamp = datetime(2026, 1, 1, tzinfo=UTC)
    stored.status.phase = phase  # type: ignore[assignment]
    return stored


def _plan(desired: job.Job, current: job.Job | None, force: bool = False) -> planning.Action:
    desired.metadata.namespace = desired.metadata.namespace or "default"
    snapshot: dict[applysets.Key, meta.Resource] = {}
    if current is not None:
        snapshot[applysets.key_of(current)] = current
    (action,) = planning.plan([manifest.Manifest(SOURCE, desired)], snapshot, force)
    return action


def test_new_object_is_created() -> None:
    assert _plan(make_job("a").build(), None).verb == "created"


def test_same_spec_is_unchanged_even_with_defaults_spelled_out() -> None:
    stored = _stored(make_job("a").gpus(1).build())
    desired = make_job("a").build()
    desired.spec.priority = 0  # explicit default
    assert _plan(desired, stored).verb == "unchanged"


@pytest.mark.parametrize("phase", ["Pending", "Running"])
def test_editable_fields_configure(phase: str) -> None:
    stored = _stored(make_job("a").build(), phase)
    action = _plan(make_job("a").priority(5).label("team", "nlp").build(), stored)
    assert action.verb == "configured"
    assert action.desired.metadata.resource_version == "7"  # compare-and-set on what was read
    assert action.desired.metadata.uid == "uid-1"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda b: b.command("python", "other.py"), "spec.command"),
        (lambda b: b.gpus(2), "spec.resources.gpus"),
        (lambda b: b.memory("8Gi"), "spec.resources.gpuMemory"),
        (lambda b: b.on("node1"), "spec.placement.node"),
    ],
)
def test_started_job_refuses_frozen_fields_and_names_them(change, field: str) -> None:  # type: ignore[no-untyped-def]
    stored = _stored(make_job("a").build(), "Running")
    desired = change(make_job("a")).build()
    with pytest.raises(errors.Forbidden) as caught:
        _plan(desired, stored)
    assert f"{field}: cannot change a started Job (phase Running)" in str(caught.value)
    assert "--force" in str(caught.value)
    assert _plan(change(make_job("a")).build(), stored, force=True).verb == "replaced"


def test_pending_job_accepts_any_change() -> None:
    stored = _stored(make_job("a").build(), "Pending")
    assert _plan(make_job("a").command("other").gpus(2).build(), stored).verb == "configured"


def test_stale_resource_version_in_manifest_is_a_conflict() -> None:
    stored = _stored(make_job("a").build(), rv="9")
    desired = make_job("a").priority(3).build()
    desired.metadata.resource_version = "7"
    with pytest.raises(errors.Conflict, match="resourceVersion 7 is stale"):
        _plan(desired, stored)


def test_foreign_uid_in_manifest_is_a_conflict() -> None:
    stored = _stored(make_job("a").build())
    desired = make_job("a").build()
    desired.metadata.uid = "someone-else"
    with pytest.raises(errors.Conflict, match="deleted and recreated"):
        _plan(desired, stored)


def test_a_sweep_being_deleted_refuses_a_change() -> None:
    """QA: applied while being deleted, a changed Sweep said `configured`, then was gone with
    its change. Refused as a Job on its way out is; an unchanged one is unchanged."""
    stored = sweep.Sweep.model_validate(
        {
            "metadata": {"name": "s", "namespace": "default", "uid": "u", "resourceVersion": "3"},
            "spec": {"items": ["a"], "template": {"spec": {"command": ["echo", "{item}"]}}},
        }
    )
    stored.metadata.deletion_timestamp = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
    changed = sweep.Sweep.model_validate(
        {
            "metadata": {"name": "s", "namespace": "default"},
            "spec": {"items": ["a", "b"], "template": {"spec": {"command": ["echo", "{item}"]}}},
        }
    )
    snapshot: dict[applysets.Key, meta.Resource] = {applysets.key_of(stored): stored}
    with pytest.raises(errors.Forbidden) as caught:
        planning.plan([manifest.Manifest(SOURCE, changed)], snapshot, False)
    assert "spec.items: cannot change a Sweep that is being deleted" in str(caught.value)
    (forced,) = planning.plan([manifest.Manifest(SOURCE, changed)], snapshot, True)
    assert forced.verb == "replaced"  # made anew once the old one is gone
    same = stored.model_copy(update={"metadata": stored.metadata.model_copy()})
    (action,) = planning.plan([manifest.Manifest(SOURCE, same)], snapshot, False)
    assert action.verb == "unchanged"


@pytest.mark.parametrize("policy", [None, "Rerun"])
def test_a_job_being_deleted_refuses_a_change_only_a_new_job_can_take(policy: str | None) -> None:
    stored = _stored(make_job("a").build(), "Running")
    stored.metadata.deletion_timestamp = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
    desired = make_job("a").command("python", "other.py").build()
    desired.spec.on_spec_change = policy  # type: ignore[assignment]
    with pytest.raises(errors.Forbidden) as caught:
        _plan(desired, stored)
    message = str(caught.value)
    assert (
        "spec.command: cannot change a Job that is being deleted (object is being deleted"
        in message
    )
    assert "wait for it to be gone and apply again, or apply with --force" in message
    assert "started Job" not in message
    assert _plan(make_job("a").command("python", "other.py").build(), stored, force=True).verb == (
        "replaced"
    )
