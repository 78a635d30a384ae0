"""The scheduling pass: read a snapshot, let `placement` decide, then bind with compare-and-set.

One pass is one transaction. Each decision creates the attempt's Binding (named
`<job>-<attempt>`, unique, so a second controller racing on the same attempt fails) and moves
the Job to Scheduled with the CAS of the Job it read: a Job is never bound twice.
"""

from datetime import datetime, timedelta
from typing import Any

from controller import placement
from gctl.api import binding, job, meta, node, quantity
from gctl.store import store

SOURCE = "controller/scheduler"


def ready(n: node.Node) -> bool:
    condition = next((c for c in n.status.conditions if c.type == "Ready"), None)
    return condition is not None and condition.status == "True" and not n.spec.unschedulable


def snapshot(reader: store.Store) -> placement.Snapshot:
    nodes = sorted((n for n in reader.list_objects(node.Node) if ready(n)), key=lambda n: n.name)
    gpus = [
        placement.GPU(n.name, g.index, g.model, g.memory_total)
        for n in nodes
        for g in sorted(n.status.gpus, key=lambda g: g.index)
        if g.index not in n.spec.cordoned_gpus and g.index not in n.spec.draining_gpus
    ]
    shot = placement.Snapshot(gpus=gpus, nodes=[n.name for n in nodes])
    for active in reader.active_bindings():
        for index in active.spec.gpus:
            usage = shot.usage.setdefault((active.spec.node, index), placement.Usage())
            usage.share += active.spec.gpu_share
            usage.jobs += 1
            usage.memory += active.spec.gpu_memory or 0
    return shot


Wire = dict[str, Any]


def _key(w: Wire) -> tuple[str, str]:
    return w["metadata"].get("namespace", ""), w["metadata"]["name"]


def request_of(w: Wire) -> placement.Request:
    """What placement needs of a pending Job, read from its stored form: a pass looks at every
    pending Job, so it does not pay for validating them (it validates those it writes)."""
    spec = w["spec"]
    resources = spec.get("resources", {})
    pinned = spec.get("placement") or {}
    memory = resources.get("gpuMemory")
    return placement.Request(
        namespace=_key(w)[0],
        name=_key(w)[1],
        gpus=float(resources.get("gpus", 1)),
        gpu_model=resources.get("gpuModel"),
        gpu_memory=None if memory is None else quantity.parse_bytes(memory),
        node=pinned.get("node"),
        pinned=tuple(pinned["gpus"]) if pinned.get("gpus") is not None else None,
    )


def _retry_after(w: Wire) -> datetime | None:
    value = w["status"].get("retryAfter")
    return None if value is None else datetime.fromisoformat(value)


def waiting(w: Wire, now: datetime, succeeded: set[tuple[str, str]]) -> bool:
    """Whether a pending Job must not be placed yet: suspended, deleting, in back-off, or a
    dependency has not succeeded (checked here, not trusted from a status field)."""
    retry_after = _retry_after(w)
    namespace = _key(w)[0]
    return bool(
        w["spec"].get("suspend")
        or w["metadata"].get("deletionTimestamp")
        or (retry_after is not None and retry_after > now)
        or any((namespace, d) not in succeeded for d in w["spec"].get("dependsOn", []))
    )


def _succeeded_dependencies(reader: store.Store, pending: list[Wire]) -> set[tuple[str, str]]:
    wanted = {(_key(w)[0], d) for w in pending for d in w["spec"].get("dependsOn", [])}
    found = set()
    for namespace, name in wanted:
        other = reader.find(job.Job, name, namespace)
        if other is not None and other.status.phase == "Succeeded":
            found.add((namespace, name))
    return found


def schedule(writer: store.Store, now: datetime) -> datetime | None:
    """Bind every pending Job that fits; returns when the next back-off ends, if any."""
    writer.lock_scheduling()
    pending = writer.pending_wires()
    succeeded = _succeeded_dependencies(writer, pending)
    eligible = [w for w in pending if not waiting(w, now, succeeded)]
    if not eligible:
        return _next_retry(pending, now)
    shot = snapshot(writer)
    by_key = {_key(w): w for w in eligible}
    placed = placement.place(shot, [request_of(w) for w in eligible])
    for decision in placed:
        chosen = by_key[(decision.request.namespace, decision.request.name)]
        _bind(writer, job.Job.model_validate(chosen), decision, now)
    bound = {(d.request.namespace, d.request.name) for d in placed}
    for w in eligible:
        if _key(w) not in bound:
            _mark_unschedulable(writer, w, now)
    return _next_retry(pending, now)


def _bind(writer: store.Store, j: job.Job, decision: placement.Placement, now: datetime) -> None:
    attempt = j.status.attempts + 1
    writer.create(
        binding.Binding(
            metadata=meta.ObjectMeta(
                name=f"{j.name}-{attempt}",
                namespace=j.namespace,
                labels={"gctl/job": j.name},
            ),
            spec=binding.BindingSpec(
                job_name=j.name,
                job_uid=j.metadata.uid or "",
                attempt=attempt,
                node=decision.node,
                gpus=list(decision.gpus),
                gpu_share=decision.share,
                gpu_memory=j.spec.resources.gpu_memory_bytes(),
            ),
        )
    )
    if job.FINALIZER not in j.metadata.finalizers:
        j.metadata.finalizers = [*j.metadata.finalizers, job.FINALIZER]
        j = writer.update(j)
    status = j.status
    status.phase = "Scheduled"
    status.attempts = attempt
    status.node = decision.node
    status.gpus = list(decision.gpus)
    status.retry_after = None
    # activeDeadlineSeconds counts from the first bind (time in the queue does not count) and
    # is never reset by a retry.
    status.start_time = status.start_time or now
    status.reason = None
    status.message = None
    gpus = ",".join(str(g) for g in decision.gpus) or "none"
    message = f"attempt {attempt} bound to {decision.node}, GPUs [{gpus}]"
    meta.set_condition(
        status.conditions,
        job.CONDITION_SCHEDULED,
        "True",
        "Bound",
        message,
        generation=j.metadata.generation,
        now=now,
    )
    j = writer.update_status(j)
    writer.record_event(j, "Scheduled", message, source=SOURCE)


def _mark_unschedulable(writer: store.Store, w: Wire, now: datetime) -> None:
    gpus = float(w["spec"].get("resources", {}).get("gpus", 1))
    message = f"no Ready node has {gpus:g} free GPU(s) that fit this Job"
    said = next(
        (c for c in w["status"].get("conditions", []) if c["type"] == job.CONDITION_SCHEDULED), None
    )
    if said is not None and (said["status"], said.get("reason"), said.get("message")) == (
        "False",
        job.REASON_UNSCHEDULABLE,
        message,
    ):
        return  # already says so: no validation, no write
    j = job.Job.model_validate(w)
    if meta.set_condition(
        j.status.conditions,
        job.CONDITION_SCHEDULED,
        "False",
        job.REASON_UNSCHEDULABLE,
        message,
        generation=j.metadata.generation,
        now=now,
    ):
        writer.update_status(j)


def _next_retry(pending: list[Wire], now: datetime) -> datetime | None:
    times = [t for t in map(_retry_after, pending) if t is not None and t > now]
    return min(times) + timedelta(milliseconds=1) if times else None
