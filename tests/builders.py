"""Builders for test objects: `make_job("a").gpus(2).on("n1").build()` and manifest text."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import sqlalchemy
import yaml

from gctl.api import binding, event, job, meta, node
from gctl.store import db, store, tables

T = TypeVar("T", bound=meta.Resource)


@dataclass
class JobBuilder:
    name: str
    spec: dict[str, Any] = field(default_factory=lambda: {"command": ["true"]})
    labels: dict[str, str] = field(default_factory=dict)
    namespace: str | None = None

    def gpus(self, count: float) -> "JobBuilder":
        self.spec.setdefault("resources", {})["gpus"] = count
        return self

    def memory(self, quantity: str) -> "JobBuilder":
        self.spec.setdefault("resources", {})["gpuMemory"] = quantity
        return self

    def on(self, node: str, *gpus: int) -> "JobBuilder":
        self.spec["placement"] = {"node": node, **({"gpus": list(gpus)} if gpus else {})}
        return self

    def priority(self, value: int) -> "JobBuilder":
        self.spec["priority"] = value
        return self

    def command(self, *argv: str) -> "JobBuilder":
        self.spec["command"] = list(argv)
        return self

    def label(self, key: str, value: str) -> "JobBuilder":
        self.labels[key] = value
        return self

    def in_namespace(self, namespace: str) -> "JobBuilder":
        self.namespace = namespace
        return self

    def document(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name}
        if self.labels:
            metadata["labels"] = self.labels
        if self.namespace:
            metadata["namespace"] = self.namespace
        return {"apiVersion": "gctl/v1", "kind": "Job", "metadata": metadata, "spec": self.spec}

    def yaml(self) -> str:
        return yaml.safe_dump(self.document(), sort_keys=False)

    def build(self) -> job.Job:
        return job.Job.model_validate(self.document())


def make_job(name: str) -> JobBuilder:
    return JobBuilder(name)


def manifests(*builders: JobBuilder) -> str:
    return "---\n".join(b.yaml() for b in builders)


def object_meta(name: str, namespace: str | None = None) -> meta.ObjectMeta:
    return meta.ObjectMeta(name=name, namespace=namespace)


def make_binding(
    job_name: str,
    node_name: str,
    gpus: list[int],
    *,
    phase: str = "Running",
    stop_reason: str | None = None,
    share: float = 1.0,
    pid: int | None = None,
) -> binding.Binding:
    """Attempt 1 of `job_name` on `node_name`, as the scheduler and an agent would leave it."""
    return binding.Binding(
        metadata=meta.ObjectMeta(name=f"{job_name}-1", namespace="default"),
        spec=binding.BindingSpec(
            job_name=job_name,
            job_uid=f"uid-{job_name}",
            attempt=1,
            node=node_name,
            gpus=gpus,
            gpu_share=share,
            stop_reason=stop_reason,
        ),
        status=binding.BindingStatus.model_validate({"phase": phase, "pid": pid}),
    )


def bind_first_attempt(
    writer: store.Store, owner: job.Job, node_name: str, gpus: list[int], after: list[str]
) -> binding.Binding:
    """Attempt 1 of a stored Job, as the scheduler writes it (bound ahead when `after` names
    the attempts it starts after)."""
    return writer.create(
        binding.Binding(
            metadata=meta.ObjectMeta(name=f"{owner.name}-1", namespace="default"),
            spec=binding.BindingSpec(
                job_name=owner.name,
                job_uid=owner.metadata.uid or "",
                attempt=1,
                node=node_name,
                gpus=gpus,
                after=after,
            ),
        )
    )


def put_ready_node(
    writer: store.Store, name: str, gpus: int, heartbeat: datetime, **gpu_fields: Any
) -> None:
    """A Ready Node with `gpus` A100s of 80Gi (or `gpu_fields`), heartbeating at `heartbeat`."""
    created = writer.create(node.Node(metadata=meta.ObjectMeta(name=name)))
    created.status.gpus = [
        node.GPUInfo(
            index=i,
            uuid=f"{name}-{i}",
            **({"model": "A100", "memory_total": 80 * 2**30} | gpu_fields),
        )
        for i in range(gpus)
    ]
    created.status.heartbeat_time = heartbeat
    meta.set_condition(created.status.conditions, "Ready", "True", "AgentReady", now=heartbeat)
    writer.update_status(created)


def report_attempt(
    database: db.Database, name: str, phase: str, at: datetime, exit_code: int | None = None
) -> None:
    """What a node agent writes of the attempt (Binding) `name` in namespace default: its
    phase, its start time `at` if it had none, and when it exited, its code and reason."""
    with database.write() as session:
        writer = store.Store(session)
        attempt = writer.get(binding.Binding, name, "default")
        attempt.status.phase = phase  # type: ignore[assignment]
        attempt.status.start_time = attempt.status.start_time or at
        if phase == "Exited":
            attempt.status.exit_code = exit_code
            ok = "Completed" if exit_code == 0 else "Error"
            attempt.status.reason = attempt.spec.stop_reason or ok
        writer.update_status(attempt)


def stored(database: db.Database, cls: type[T], name: str, namespace: str = "default") -> T:
    """The object of kind `cls` named `name` as stored now, read in a transaction of its own."""
    with database.read() as session:
        return store.Store(session).get(cls, name, namespace)


def corrupt(database: db.Database, kind: str, name: str, **columns: Any) -> None:
    """Write documents the models refuse straight into an object's row (`spec=...`,
    `status=...`), as an older gctl or a hand edit in the database would leave them: no Store,
    no change in the feed."""
    table = tables.table_of(kind)
    with database.engine.begin() as connection:
        done = connection.execute(
            sqlalchemy.update(table).where(table.c.name == name).values(**columns)
        )
        assert done.rowcount == 1


def warnings_about(database: db.Database, name: str) -> list[tuple[str, str, int]]:
    """(reason, message, count) of the Warning Events about the objects named `name`."""
    with database.read() as session:
        found = store.Store(session).list_wire(event.Event)
    return [
        (e["spec"]["reason"], e["spec"]["message"], e["spec"]["count"])
        for e in found
        if e["spec"]["involvedObject"]["name"] == name and e["spec"]["type"] == "Warning"
    ]
