"""Property: whatever is applied, `get -o yaml` of it applies again as unchanged."""

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gctl.api import manifest
from gctl.cli import printers
from gctl.store import applying, db, store

_names = itertools.count()
label_text = st.from_regex(r"\A[A-Za-z0-9]([A-Za-z0-9_.-]{0,10}[A-Za-z0-9])?\Z")
free_text = st.text(  # what a UTF-8 file can hold; NUL is refused on purpose
    st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30
)
dns = st.from_regex(r"\A[a-z]([a-z0-9-]{0,8}[a-z0-9])?\Z")

job_specs = st.fixed_dictionaries(
    {
        "command": st.one_of(
            st.lists(free_text, min_size=1, max_size=4), free_text.filter(str.strip)
        )
    },
    optional={
        "env": st.dictionaries(st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,8}\Z"), free_text, max_size=3),
        "workingDir": free_text,
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "gpus": st.sampled_from([0, 0.25, 0.5, 1, 2, 8]),
                "gpuMemory": st.sampled_from(["500Mi", "24Gi", "24GB", "80Gi", 1048576]),
                "gpuModel": st.sampled_from(["*A100*", "H100", "NVIDIA GeForce RTX 4090"]),
            },
        ),
        "pool": dns,
        "priority": st.integers(-1000, 1000),
        "backoffLimit": st.integers(0, 10),
        "activeDeadlineSeconds": st.integers(1, 10**6),
        "ttlSecondsAfterFinished": st.integers(0, 10**6),
        "dependsOn": st.lists(dns, max_size=3, unique=True),
        "suspend": st.booleans(),
        "gpuEnv": st.sampled_from(["CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"]),
    },
)


def _documents(specs: list[dict[str, Any]], labels: dict[str, str], notes: dict[str, str]) -> str:
    docs = []
    for spec in specs:
        metadata = {"name": f"job-{next(_names)}", "labels": labels, "annotations": notes}
        docs.append({"apiVersion": "gctl/v1", "kind": "Job", "metadata": metadata, "spec": spec})
    return "---\n".join(printers.dump_yaml(d) for d in docs)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    specs=st.lists(job_specs, min_size=1, max_size=3),
    labels=st.dictionaries(label_text, label_text, max_size=3),
    notes=st.dictionaries(label_text, free_text, max_size=2),
)
def test_apply_get_yaml_apply_is_unchanged(
    database: db.Database,
    specs: list[dict[str, Any]],
    labels: dict[str, str],
    notes: dict[str, str],
) -> None:
    text = _documents(specs, labels, notes)
    first = applying.apply(database, manifest.parse("in.yaml", text), force=False, dry_run=False)
    assert {action.verb for action, _ in first} == {"created"}
    names = [obj.name for _, obj in first]
    with database.read() as session:
        wires = store.Store(session).list_wire(first[0][1].__class__, "default", names=names)
    exported = printers.dump_yaml(printers.as_list(wires))
    again = applying.apply(
        database, manifest.parse("out.yaml", exported), force=False, dry_run=False
    )
    assert [action.verb for action, _ in again] == ["unchanged"] * len(names)
    with database.read() as session:
        after = store.Store(session).list_wire(first[0][1].__class__, "default", names=names)
    assert after == wires
