"""Apply's decisions for applysets, from plain objects: membership, prune, re-run on change,
and where a manifest error is (file, line, field)."""

from datetime import UTC, datetime

import pytest

from gctl.api import applyset, errors, job, manifest, meta
from gctl.store import applysets, planning
from tests.builders import JobBuilder, make_job

SOURCE = manifest.Source("exp/a.yaml", 1)
NOW = datetime(2026, 11, 22, 12, 0, 0, 123456, tzinfo=UTC)


def _stored(builder: JobBuilder, phase: str = "Pending", uid: str = "uid-1") -> job.Job:
    stored = builder.build()
    stored.metadata.namespace = "default"
    stored.metadata.uid = uid
    stored.metadata.resource_version = "7"
    stored.status.phase = phase  # type: ignore[assignment]
    return stored


def _manifest(builder: JobBuilder) -> manifest.Manifest:
    obj = builder.build()
    obj.metadata.namespace = "default"
    return manifest.Manifest(SOURCE, obj)


def _plan(
    builder: JobBuilder,
    current: job.Job | None,
    set_name: str | None = "exp",
    policy: applyset.OnSpecChange | None = None,
) -> planning.Action:
    snapshot: dict[applysets.Key, meta.Resource] = {}
    if current is not None:
        snapshot[applysets.key_of(current)] = current
    (action,) = planning.plan(
        [_manifest(builder)], snapshot, False, set_name=set_name, set_policy=policy, now=NOW
    )
    return action


def test_a_set_labels_what_it_creates() -> None:
    action = _plan(make_job("a").label("team", "nlp"), None)
    assert action.verb == "created"
    assert action.desired.metadata.labels == {"team": "nlp", applyset.LABEL: "exp"}


def test_a_set_adopts_an_unlabelled_object() -> None:
    action = _plan(make_job("a"), _stored(make_job("a")))
    assert action.verb == "configured"
    assert action.desired.metadata.labels == {applyset.LABEL: "exp"}


def test_a_member_of_another_set_is_refused() -> None:
    other = _stored(make_job("a").label(applyset.LABEL, "other"))
    with pytest.raises(errors.Forbidden, match="already belongs to applyset 'other'"):
        _plan(make_job("a"), other)


def test_a_manifest_naming_another_set_is_refused() -> None:
    with pytest.raises(errors.Invalid, match=r"metadata\.labels\.gctl/applyset"):
        _plan(make_job("a").label(applyset.LABEL, "other"), None)


def test_a_plain_apply_keeps_a_member_in_its_set() -> None:
    member = _stored(make_job("a").label(applyset.LABEL, "exp"))
    action = _plan(make_job("a"), member, set_name=None)
    assert action.verb == "unchanged"


def test_server_owned_annotations_are_kept_and_not_a_change() -> None:
    stored = _stored(make_job("a").label(applyset.LABEL, "exp"), phase="Running")
    stored.metadata.annotations = {job.ANNOTATION_RERUN: "t1", job.ANNOTATION_RERUN_REASON: "x"}
    assert _plan(make_job("a"), stored).verb == "unchanged"


def _annotated(builder: JobBuilder, annotations: dict[str, str]) -> manifest.Manifest:
    m = _manifest(builder)
    m.obj.metadata.annotations = dict(annotations)
    return m


def _plan_manifest(
    m: manifest.Manifest,
    current: job.Job | None,
    set_name: str | None = "exp",
    policy: applyset.OnSpecChange | None = None,
) -> planning.Action:
    snapshot: dict[applysets.Key, meta.Resource] = {}
    if current is not None:
        snapshot[applysets.key_of(current)] = current
    (action,) = planning.plan([m], snapshot, False, set_name=set_name, set_policy=policy, now=NOW)
    return action


RERUN_DUMPED = {job.ANNOTATION_RERUN: "old", job.ANNOTATION_RERUN_REASON: "old reason"}


def test_a_manifests_rerun_token_does_not_override_the_stored_one() -> None:
    stored = _stored(make_job("a").label(applyset.LABEL, "exp"), phase="Succeeded")
    stored.metadata.annotations = {job.ANNOTATION_RERUN: "t1", job.ANNOTATION_RERUN_REASON: "x"}
    action = _plan_manifest(_annotated(make_job("a"), RERUN_DUMPED), stored)
    assert action.verb == "unchanged"
    assert action.desired.metadata.annotations[job.ANNOTATION_RERUN] == "t1"


def test_a_manifests_rerun_token_is_dropped_from_a_new_object() -> None:
    action = _plan_manifest(_annotated(make_job("a"), RERUN_DUMPED | {"note": "n"}), None)
    assert action.verb == "created"
    assert action.desired.metadata.annotations == {"note": "n"}


def test_other_gctl_annotations_belong_to_the_manifest() -> None:
    stored = _stored(make_job("a").label(applyset.LABEL, "exp"))
    stored.metadata.annotations = {"gctl/simulated-duration": "5", job.ANNOTATION_RERUN: "t1"}
    removed = _plan_manifest(_annotated(make_job("a"), {}), stored)
    assert removed.verb == "configured"
    assert removed.desired.metadata.annotations == {job.ANNOTATION_RERUN: "t1"}
    changed = _plan_manifest(_annotated(make_job("a"), {"gctl/simulated-duration": "9"}), stored)
    assert changed.desired.metadata.annotations["gctl/simulated-duration"] == "9"


def test_a_rerun_on_change_sets_fresh_values_over_a_dumped_token() -> None:
    stored = _stored(make_job("a").label(applyset.LABEL, "exp"), phase="Running")
    changed = _annotated(make_job("a").command("false"), RERUN_DUMPED)
    action = _plan_manifest(changed, stored, policy="Rerun")
    annotations = action.desired.metadata.annotations
    assert annotations[job.ANNOTATION_RERUN] == "2026-11-22T12:00:00.123456Z"
    assert annotations[job.ANNOTATION_RERUN_REASON] == "spec.command changed (applyset exp)"


def test_drift_is_seen_on_other_gctl_annotations_only() -> None:
    wire = _stored(make_job("a")).wire()
    before = planning.applied_fingerprint(wire)
    wire["metadata"]["annotations"] = {job.ANNOTATION_RERUN: "t2"}
    assert planning.applied_fingerprint(wire) == before
    wire["metadata"]["annotations"] = {"gctl/simulated-duration": "5"}
    assert planning.applied_fingerprint(wire) != before


def _with_ttl(builder: JobBuilder) -> JobBuilder:
    builder.spec["ttlSecondsAfterFinished"] = 60
    return builder


def test_a_member_job_with_a_ttl_is_refused() -> None:
    with pytest.raises(errors.Invalid) as caught:
        _plan(_with_ttl(make_job("a")), None)
    message = str(caught.value)
    assert message.startswith('exp/a.yaml: document 1 (Job "a"): spec.ttlSecondsAfterFinished: ')
    assert "would recreate it" in message
    assert "\n" not in message


def test_a_one_off_apply_of_a_member_with_a_ttl_is_refused() -> None:
    member = _stored(make_job("a").label(applyset.LABEL, "exp"))
    with pytest.raises(errors.Invalid, match=r"spec\.ttlSecondsAfterFinished"):
        _plan(_with_ttl(make_job("a")), member, set_name=None)


def test_a_ttl_outside_any_set_is_fine() -> None:
    assert _plan(_with_ttl(make_job("a")), None, set_name=None).verb == "created"


def _members(*stored: job.Job) -> list[meta.Resource]:
    return list(stored)


def test_prune_takes_only_members_gone_from_the_input() -> None:
    kept = _stored(make_job("a").label(applyset.LABEL, "exp"), uid="1")
    gone = _stored(make_job("b").label(applyset.LABEL, "exp"), uid="2")
    pruned = planning.prune(_members(kept, gone), [_manifest(make_job("a"))])
    assert [(a.verb, a.desired.name) for a in pruned] == [("pruned", "b")]


def test_prune_leaves_owned_and_terminating_members() -> None:
    owned = _stored(make_job("s-0").label(applyset.LABEL, "exp"), uid="1")
    owned.metadata.owner_references = [meta.OwnerReference(kind="Sweep", name="s", uid="u")]
    leaving = _stored(make_job("c").label(applyset.LABEL, "exp"), uid="2")
    leaving.metadata.deletion_timestamp = NOW
    assert planning.prune(_members(owned, leaving), []) == []


@pytest.mark.parametrize(
    ("job_policy", "set_policy", "expected"),
    [
        pytest.param(None, None, "Refuse", id="default"),
        pytest.param(None, "Rerun", "Rerun", id="set"),
        pytest.param("Rerun", None, "Rerun", id="job"),
        pytest.param("Refuse", "Rerun", "Refuse", id="job-wins"),
    ],
)
def test_policy_precedence(job_policy: str | None, set_policy: str | None, expected: str) -> None:
    assert applyset.effective_policy(job_policy, set_policy) == expected


def test_a_started_jobs_command_change_is_refused_by_default() -> None:
    stored = _stored(make_job("a").label(applyset.LABEL, "exp"), phase="Running")
    with pytest.raises(errors.Forbidden, match=r"spec\.command: cannot change a started Job"):
        _plan(make_job("a").command("false"), stored)


def test_rerun_accepts_the_change_and_asks_for_a_new_run() -> None:
    stored = _stored(make_job("a").label(applyset.LABEL, "exp"), phase="Running")
    action = _plan(make_job("a").command("false"), stored, policy="Rerun")
    assert action.verb == "configured"
    assert action.rerun == "spec.command changed (applyset exp)"
    annotations = action.desired.metadata.annotations
    assert annotations[job.ANNOTATION_RERUN] == "2026-11-22T12:00:00.123456Z"
    assert annotations[job.ANNOTATION_RERUN_REASON] == action.rerun


def test_a_jobs_own_refuse_wins_over_its_sets_rerun() -> None:
    stored = _stored(make_job("a").label(applyset.LABEL, "exp"), phase="Running")
    changed = make_job("a").command("false")
    changed.spec["onSpecChange"] = "Refuse"
    with pytest.raises(errors.Forbidden):
        _plan(changed, stored, policy="Rerun")


def test_summary_counts_in_order() -> None:
    a = planning.Action("pruned", None, _stored(make_job("a")), None)
    b = planning.Action("created", SOURCE, _stored(make_job("b")), None)
    assert applysets.summary([a, b, b]) == "2 created, 1 pruned"
    assert applysets.summary([]) == "nothing to apply"


# -- names and errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("directory", "name"),
    [
        ("/home/me/experiments/", "experiments"),
        ("/x/LLM_runs", "llm-runs"),
        ("/x/--", "sync"),
    ],
)
def test_default_set_name(directory: str, name: str) -> None:
    assert applyset.name_for_directory(directory) == name


TEXT = """\
apiVersion: gctl/v1
kind: Job
metadata: {name: a}
spec: {command: ["true"]}
---
apiVersion: gctl/v1
kind: Job
metadata:
  name: b
spec:
  command: ["true"]
  resources:
    gpus: 1.5
"""


def _error(text: str) -> str:
    with pytest.raises(errors.Invalid) as caught:
        manifest.parse("exp/j.yaml", text)
    return str(caught.value)


def test_locate_a_bad_field() -> None:
    found = applyset.locate("exp/j.yaml", TEXT, _error(TEXT))
    assert (found.file, found.line, found.field) == ("exp/j.yaml", 13, "spec.resources.gpus")
    assert found.message.startswith('exp/j.yaml:13: document 2 (Job "b"): spec.resources.gpus:')


def test_locate_an_unknown_field() -> None:
    text = TEXT.replace("  resources:\n    gpus: 1.5\n", "  bogus: 1\n")
    found = applyset.locate("exp/j.yaml", text, _error(text))
    assert (found.line, found.field) == (12, "spec.bogus")
    assert "unknown field" in found.message


def test_locate_broken_yaml() -> None:
    text = TEXT.replace('["true"]}', '["true"}', 1)
    found = applyset.locate("exp/j.yaml", text, _error(text))
    assert found.line == 4
    assert found.message.startswith("exp/j.yaml:4: document 1: line 4")
