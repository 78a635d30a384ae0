"""`gctl describe`: an object as a person reads it, like kubectl describe.

Spec and status print as an indented tree with Title Case keys, but for the keys a user chose
(labels, annotations and node labels as `k=v`, env and matrix keys as written); conditions and
events as tables. A value or message longer than the line wraps below itself, within the
terminal's width (100 columns through a pipe).

`describe` itself, at the end, reads each object with its events through the Store, and what
the sections beside it need: the queue (for a pending Job), the chain of dependencies, a pool's
usage as `get pools` counts it (through `getting`). An object stored in a form that does not
validate is not described: one line on stderr names it, once the others are.
"""

import re
import shlex
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gctl.api import binding, errors, event, kinds, quantity, queue
from gctl.cli import cells, fitting, getting, views

if TYPE_CHECKING:
    from gctl.api import meta
    from gctl.store import store

# Before a capital after a lowercase letter or digit, and before the last capital of a run
# followed by a lowercase letter: `enforceGPUMemory` -> `enforce GPU Memory`.
_WORD_BREAK = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_ACRONYMS = {"Gpu": "GPU", "Gpus": "GPUs", "Uid": "UID", "Ttl": "TTL", "Id": "ID"}
_LABEL_MAPS = frozenset({"labels", "annotations", "nodeLabels"})  # printed `k=v,...`
_USER_KEYS = frozenset({"env", "matrix"})  # maps whose keys print as written
# Fields stored as bytes (a Node's GPU memory, a Binding's gpuMemory): `80Gi`, as `get gpus`
# shows them; `-o yaml` keeps the exact count.
_BYTES = frozenset({"memoryTotal", "memoryUsed", "usedMemory", "gpuMemory"})


def title(key: str) -> str:
    """`ttlSecondsAfterFinished` -> `TTL Seconds After Finished`."""
    words = _WORD_BREAK.sub(" ", key).split(" ")
    return " ".join(_ACRONYMS.get(w.capitalize(), w[:1].upper() + w[1:]) for w in words)


def _tree(value: Any, indent: int, width: int, *, as_written: bool = False) -> list[str]:
    """`as_written`: the keys are the user's (an env, a matrix), printed as they are."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        names = {key: key if as_written else title(key) for key in value}
        column = max((len(name) for name in names.values()), default=0) + 2
        for key, item in value.items():
            label = f"{names[key]}:"
            if isinstance(item, dict) and item and key not in _LABEL_MAPS:
                lines.append(f"{pad}{label}")
                lines.extend(_tree(item, indent + 1, width, as_written=key in _USER_KEYS))
            elif isinstance(item, list) and item and any(isinstance(i, dict) for i in item):
                lines.append(f"{pad}{label}")
                for element in item:
                    lines.extend(_tree(element, indent + 1, width))
                    lines.append("")
            else:
                text = _scalar(item)
                if key in _BYTES and isinstance(item, int) and not isinstance(item, bool):
                    text = quantity.format_bytes(item)
                lines.extend(_wrapped(f"{pad}{label.ljust(column)}", text, width))
    else:
        lines.extend(_wrapped(pad, _scalar(value), width))
    return lines


def _wrapped(prefix: str, text: str, width: int) -> list[str]:
    """`prefix` then `text`, wrapped below itself to fit `width` columns."""
    first, *more = fitting.wrap(text, fitting.room(width, len(prefix)))
    return [f"{prefix}{first}", *(" " * len(prefix) + line for line in more)]


def _scalar(value: Any) -> str:
    if isinstance(value, list):
        return shlex.join(str(v) for v in value) if value else cells.NONE
    if isinstance(value, dict):  # labels: sorted, as `get --show-labels` and kubectl print them
        return ",".join(f"{k}={v}" for k, v in sorted(value.items())) or cells.NONE
    if value is None or value == "":
        return cells.NONE
    return str(value)


def _table(
    headers: list[str], rows: list[list[str]], indent: str = "  ", width: int = fitting.WIDTH
) -> list[str]:
    """Columns two spaces apart; the last (a message) wraps below itself to fit `width`."""
    *leading, _ = range(len(headers))
    widths = [max(len(headers[i]), *(len(r[i]) for r in rows)) for i in leading]
    rule = ["-" * len(h) for h in headers]
    lines = []
    for row in [headers, rule, *rows]:
        head = indent + "".join(cell.ljust(widths[i]) + "  " for i, cell in enumerate(row[:-1]))
        first, *more = _wrapped(head, row[-1], width)
        lines.extend([first.rstrip(), *more])
    return lines


def render(
    wire: dict[str, Any],
    events: list[event.Event],
    now: datetime,
    related: list[str] | None = None,
    width: int = fitting.WIDTH,
) -> str:
    """`related`: sections on other objects (a chain of dependencies, a Sweep's Jobs);
    `width`: the terminal's, which long values and messages wrap to fit."""
    metadata = wire["metadata"]
    created = metadata.get("creationTimestamp")
    head = {
        "Name": metadata["name"],
        "Namespace": metadata.get("namespace"),
        "Labels": metadata.get("labels", {}),
        "Annotations": metadata.get("annotations", {}),
        "API Version": wire["apiVersion"],
        "Kind": wire["kind"],
        "UID": metadata.get("uid"),
        "Generation": metadata.get("generation"),
        "Created": f"{created} ({cells.age(created, now)} ago)" if created else None,
    }
    if metadata.get("deletionTimestamp"):
        head["Deleting Since"] = metadata["deletionTimestamp"]
    if "namespace" not in metadata:
        del head["Namespace"]
    if wire["kind"] == "Job":
        head |= _queue(wire, now) | _rerun(wire, now)
    lines = []
    for key, value in head.items():
        lines.extend(_wrapped(f"{key + ':':<14}", _scalar(value), width))
    lines.append("Spec:")
    lines.extend(_tree(wire["spec"], 1, width))
    status = dict(wire["status"])
    conditions = status.pop("conditions", [])
    status.pop("members", None)  # an ApplySet's, shown as a table of their own (`related`)
    lines.append("Status:")
    lines.extend(_tree(status, 1, width) if status else ["  " + cells.NONE])
    lines.append("Conditions:" if conditions else f"Conditions:   {cells.NONE}")
    if conditions:
        rows = [
            [
                c["type"],
                c["status"],
                c.get("reason", ""),
                cells.age(c.get("lastTransitionTime"), now),
                c.get("message", ""),
            ]
            for c in conditions
        ]
        lines.extend(_table(["Type", "Status", "Reason", "Age", "Message"], rows, width=width))
    lines.extend(related or [])
    lines.append("Events:" if events else f"Events:       {cells.NONE}")
    if events:
        rows = [_event_row(e, now) for e in events]
        lines.extend(_table(["Type", "Reason", "Age", "From", "Message"], rows, width=width))
    return "\n".join(lines) + "\n"


def _queue(wire: dict[str, Any], now: datetime) -> dict[str, str]:
    """Why a pending Job waits and for how long (as the scheduler last said), and how often
    it was preempted or evicted."""
    status = wire["status"]
    found: dict[str, str] = {}
    if status.get("phase", "Pending") == "Pending":
        conditions = status.get("conditions", [])
        scheduled = next((c for c in conditions if c["type"] == "Scheduled"), None)
        if scheduled is not None and scheduled["status"] == "False":
            reason, message = scheduled.get("reason", ""), scheduled.get("message", "")
            found["Waiting"] = f"{reason}: {message}" if reason and message else reason or message
        if (position := status.get("queuePosition")) is not None:
            pool = wire["spec"].get("pool") or "default"
            order = status.get("queueOrder")
            by = " (longest time limit first)" if order == "LongestFirst" else ""
            found["Queue"] = f"position {position} in pool {pool}{by}"
        if eta := status.get("estimatedStartTime"):
            when = cells.until(eta, now)
            found["Starts"] = f"{eta} ({when})" if when == "now" else f"{eta} (in {when})"
    if preemptions := status.get("preemptions"):
        found["Preemptions"] = f"{preemptions} (requeued each time, not counted as failures)"
    return {key: value for key, value in found.items() if value}


def _rerun(wire: dict[str, Any], now: datetime) -> dict[str, str]:
    """The last re-run acted upon (`gctl rerun`): its token, a UTC time, and its reason."""
    token = wire["status"].get("rerun")
    if not token:
        return {}
    try:
        text = f"{token} ({cells.age(token, now)} ago)"
    except ValueError:  # a token need not be a time: only new matters
        text = token
    why = wire["metadata"].get("annotations", {}).get("gctl/rerun-reason")
    return {"Last Rerun": f"{text}: {why}" if why else text}


def _event_row(e: event.Event, now: datetime) -> list[str]:
    def ago(moment: datetime) -> str:
        return cells.human_duration((now - moment).total_seconds())

    seen = e.spec.last_timestamp or e.metadata.creation_timestamp
    when = ago(seen) if seen else "?"
    if e.spec.count > 1 and e.spec.first_timestamp:
        when += f" (x{e.spec.count} over {ago(e.spec.first_timestamp)})"
    return [e.spec.type, e.spec.reason, when, e.spec.source or "-", e.spec.message]


# -- the chain: dependencies, dependents, a Sweep's Jobs ---------------------------------------

_SWEEP_LABEL = "gctl/sweep"  # gctl.api.sweep.LABEL, without loading pydantic for describe


class Chain:
    """The Jobs and Sweeps of a namespace, read once per `gctl describe` and indexed by what
    `related` looks up, so that describing many objects is not a scan per object."""

    def __init__(self, reader: "store.Store") -> None:
        self._reader = reader
        self._namespaces: dict[str, _Namespace] = {}

    def of(self, namespace: str) -> "_Namespace":
        if namespace not in self._namespaces:
            from gctl.api import kinds

            jobs = self._reader.list_wire(kinds.model(kinds.JOB.kind), namespace)
            sweeps = self._reader.list_wire(kinds.model(kinds.SWEEP.kind), namespace)
            self._namespaces[namespace] = _Namespace(jobs, sweeps)
        return self._namespaces[namespace]


class _Namespace:
    def __init__(self, jobs: list[dict[str, Any]], sweeps: list[dict[str, Any]]) -> None:
        self.phases: dict[tuple[str, str], str] = {}  # (kind, name) -> phase
        self.needed_by: dict[str, list[list[str]]] = {}  # name -> rows of what waits on it
        self.sweep_jobs: dict[str, list[list[str]]] = {}  # Sweep name -> rows of its Jobs
        for kind, found in (("Job", jobs), ("Sweep", sweeps)):
            for w in found:
                try:
                    self._add(kind, w)
                except Exception:
                    if not views.malformed(kind, w):
                        raise
                    # What it waits for cannot be read: it is in the chain as its phase alone.
                    self.phases.setdefault((kind, w["metadata"]["name"]), views.INVALID)

    def _add(self, kind: str, w: dict[str, Any]) -> None:
        name, phase = w["metadata"]["name"], _phase(w)
        self.phases[(kind, name)] = phase
        if not _owned_by_sweep(w):
            for need in _depends(w):
                self.needed_by.setdefault(need, []).append([name, kind, phase])
        owner = w["metadata"].get("labels", {}).get(_SWEEP_LABEL) if kind == "Job" else None
        if owner is not None:
            point = w["metadata"].get("annotations", {}).get("gctl/sweep-point", "")
            self.sweep_jobs.setdefault(owner, []).append([name, phase, point])


def related(
    reader: "store.Store",
    wire: dict[str, Any],
    chain: Chain | None = None,
    width: int = fitting.WIDTH,
) -> list[str]:
    """What `describe` shows beside a Job or Sweep: who owns it, what it depends on and its
    phase, what depends on it, and a Sweep's Jobs with their phases. `chain`: the namespaces
    read already, shared by the objects of one command; `width`: the terminal's."""
    kind = wire["kind"]
    if kind == "ApplySet":  # its members, a Job's with its phase
        from gctl.cli import syncing

        return syncing.members_section(reader, wire)
    if kind not in ("Job", "Sweep"):
        return []
    namespace, name = wire["metadata"].get("namespace", ""), wire["metadata"]["name"]
    known = (chain or Chain(reader)).of(namespace)
    lines: list[str] = []
    owners = wire["metadata"].get("ownerReferences", [])
    if owners:
        lines.append(f"{'Owned By:':<14}" + ", ".join(f"{o['kind']}/{o['name']}" for o in owners))
    rows = [_chain_row(d, known.phases) for d in _depends(wire)]
    lines.extend(_section("Depends On:", ["Name", "Kind", "Phase"], rows, width))
    needed = known.needed_by.get(name, [])
    lines.extend(_section("Needed By:", ["Name", "Kind", "Phase"], needed, width))
    if kind == "Sweep":
        jobs = known.sweep_jobs.get(name, [])
        lines.extend(_section("Jobs:", ["Name", "Phase", "Point"], jobs, width, always=True))
    if kind == "Job" and int(wire["spec"].get("resources", {}).get("nodes") or 1) > 1:
        lines.extend(_members(reader, wire, width))
    return lines


def _members(reader: "store.Store", wire: dict[str, Any], width: int) -> list[str]:
    """A multi-node Job's latest attempt, member by member: the rank, its node and GPUs, and
    where its process stands (its Binding's phase), as `kubectl describe` lists a PyTorchJob's
    replicas. `<none>` until an attempt is bound."""
    members = binding.latest_attempt(reader.bindings_of(wire["metadata"].get("uid", "")))
    rows = [
        [
            str(b.spec.rank or 0),
            b.spec.node,
            cells.index_ranges(b.spec.gpus) or cells.NONE,
            b.status.phase,
        ]
        for b in members
    ]
    return _section("Nodes:", ["Rank", "Node", "GPUs", "Phase"], rows, width, always=True)


def _depends(w: dict[str, Any]) -> list[str]:
    """What a Job waits for; for a Sweep, what each of its Jobs waits for."""
    spec = w["spec"]
    template = spec.get("template", {}).get("spec", {}) if w["kind"] == "Sweep" else {}
    return list(dict.fromkeys([*template.get("dependsOn", []), *spec.get("dependsOn", [])]))


def _phase(w: dict[str, Any]) -> str:
    if w["metadata"].get("deletionTimestamp"):
        return "Terminating"
    return str(w["status"].get("phase", "Pending"))


def _owned_by_sweep(w: dict[str, Any]) -> bool:
    """A Sweep's Jobs carry its dependsOn: the Sweep stands for them in "Needed By"."""
    return any(o.get("kind") == "Sweep" for o in w["metadata"].get("ownerReferences", []))


def _chain_row(name: str, phases: dict[tuple[str, str], str]) -> list[str]:
    """A dependency as the controller resolves it: a Job of that name, else a Sweep."""
    for kind in ("Job", "Sweep"):
        if (kind, name) in phases:
            return [name, kind, phases[(kind, name)]]
    return [name, cells.NONE, "NotFound (waits until it exists)"]


def pool_usage(viewed: dict[str, Any], width: int) -> list[str]:
    """What `describe gpupool` shows of a pool's use, counted as `get pools` counts it
    (`views.with_pool_views`): the GPUs its selector matches on known Nodes, Node by Node, and
    how many of them gctl's Jobs hold; its Jobs running, queued, held out of the queue and
    bound ahead to a busy GPU."""
    view = viewed[views.VIEW]
    by_node: dict[str, list[int]] = {}
    for name, index in view.get("matched", []):  # none where the pool's GPUs cannot be read
        by_node.setdefault(name, []).append(index)
    where = ", ".join(f"{n} [{cells.index_ranges(i)}]" for n, i in by_node.items())
    rows = {
        "GPUs": f"{view['gpus']} ({where})" if where else str(view["gpus"]),
        "Allocated": view["allocated"],
        "Running": view["running"],
        "Queued": view["queued"],
        "Held": view["held"],
        "Bound Ahead": view["ahead"],
    }
    lines = ["Usage:"]
    for key, value in rows.items():
        lines.extend(_wrapped(f"  {key + ':':<13}", str(value), width))
    return lines


def _section(
    heading: str, headers: list[str], rows: list[list[str]], width: int, *, always: bool = False
) -> list[str]:
    """A table under a heading; nothing at all when empty, unless `always`."""
    if not rows:
        return [f"{heading:<14}{cells.NONE}"] if always else []
    return [heading, *_table(headers, rows, width=width)]


def describe(*, resource: str, names: list[str], namespace: str | None, db_url: str | None) -> None:
    """Each kind named in turn; an object stored in a form that does not validate is said in
    one line on stderr, after the others are described, and fails the command at the end."""
    described = True
    for number, (info, group) in enumerate(getting.resource_and_names(resource, names)):
        if number:
            sys.stdout.write("\n\n")
        described &= _describe_kind(info, group, namespace, db_url)
    if not described:
        raise SystemExit(1)


def _describe_kind(
    info: kinds.KindInfo, names: list[str], namespace: str | None, db_url: str | None
) -> bool:
    """Whether every object found validates (those that do are described)."""
    from gctl.store import db, store

    cls = kinds.model(info.kind)
    where = getting.scope(info, namespace, False)
    database = db.Database.open(db_url, create=False)
    with database.read() as session:
        reader = store.Store(session)
        wires = reader.list_wire(cls, where, names=names or None)
        if info is kinds.GPUPOOL and (not names or views.DEFAULT_POOL in names):
            wires = getting.with_default_pool(wires, filled=True)
        missing = sorted(set(names) - {w["metadata"]["name"] for w in wires})
        if missing:
            raise errors.NotFound(getting.not_found(info, missing[0], where))
        if not wires:
            getting.no_resources(info, where)
            return True
        wires, events, invalid = _with_events(reader, cls, wires)
        now, width = datetime.now(UTC), fitting.screen_width(sys.stdout)
        if info is kinds.JOB and any(queue.pending(w) and not queue.held(w, now) for w in wires):
            getting.number_queue(
                wires,
                reader.pending_wires(),
                reader.list_wire(kinds.model(kinds.GPUPOOL.kind)),
                lambda kind, ns, its: reader.list_wire(kinds.model(kind.kind), ns, names=its),
            )
        chain = Chain(reader)  # each namespace's Jobs and Sweeps, read once
        usage = _usage_by_pool(db_url, wires, width) if info is kinds.GPUPOOL else {}
        texts = [
            render(
                w,
                found,
                now,
                related(reader, w, chain, width) + usage.get(w["metadata"]["name"], []),
                width,
            )
            for w, found in zip(wires, events, strict=True)
        ]
    sys.stdout.write("\n\n".join(texts))
    for problem in invalid:
        print(f"error: {problem}", file=sys.stderr)
    return not invalid


def _with_events(
    reader: "store.Store", cls: "type[meta.Resource]", wires: list[views.Wire]
) -> tuple[list[views.Wire], list[list[event.Event]], list[errors.StoredInvalid]]:
    """The objects that validate as stored, with their events; and what is wrong with each of
    the others, as kubectl goes on past a name it does not find."""
    from gctl.store import stored

    kept, events, invalid = [], [], []
    for wire in wires:
        try:
            found = stored.validated(cls, wire) if "uid" in wire["metadata"] else None
        except errors.StoredInvalid as exc:
            invalid.append(exc)
            continue
        kept.append(wire)
        # An event that does not validate is said as such an object is; the others are shown
        events.append([] if found is None else reader.events_for(found, skipped=invalid))
    return kept, events, invalid


def _usage_by_pool(db_url: str | None, pools: list[views.Wire], width: int) -> dict[str, list[str]]:
    """Each pool's Usage section, by name, counted as `get pools` counts it."""
    return {
        p["metadata"]["name"]: pool_usage(p, width)
        for p in getting.with_views(db_url, kinds.GPUPOOL.kind, pools)
    }
