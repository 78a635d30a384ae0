"""The cells of `gctl get`'s tables: for each kind, its columns (and those -o wide adds) and
how each cell reads a wire dict; ages and durations written as kubectl writes them.

Cells read wire dicts (as stored), never validated models: `gctl get` over thousands of
objects must not pay for validation. A plain table's cells are short enough for 100 columns
(the free text last, which the table fits); -o wide may show more (WIDE_CELLS), and says it
short where that loses nothing (`0-7` for eight GPUs).
"""

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from gctl.api import kinds, quantity
from gctl.cli import views

Wire = dict[str, Any]
Read = Callable[[Wire, datetime], str]
Column = tuple[str, Read]
NONE = "<none>"


def human_duration(seconds: float) -> str:
    """kubectl's HumanDuration: 45s, 3m20s, 15m, 5h30m, 20h, 3d4h, 30d, 2y100d."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    years, rest = divmod(days, 365)
    if hours < 24 * 365 * 8 and rest:
        return f"{years}y{rest}d"
    return f"{years}y"


def parse_time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def age(text: str | None, now: datetime) -> str:
    moment = parse_time(text)
    return NONE if moment is None else human_duration((now - moment).total_seconds())


def _created(w: Wire, now: datetime) -> str:
    return age(w["metadata"].get("creationTimestamp"), now)


def _job_status(w: Wire, _now: datetime) -> str:
    if w["metadata"].get("deletionTimestamp"):
        return "Terminating"
    phase: str = w["status"].get("phase", "Pending")
    if phase == "Pending" and w["spec"].get("suspend"):
        return "Suspended"
    return phase


def _job_duration(w: Wire, now: datetime) -> str:
    """How long the Job's run has lasted, as kubectl's DURATION and squeue's TIME say it: from
    its first attempt's start to its completion, or to now while it runs or waits to retry (its
    run goes on); none before it started, nor once a preemption, an eviction, a suspend, a lost
    attempt or a rerun has requeued it, which end the run (controller.outcomes._SAME_RUN)."""
    status = w["status"]
    start = parse_time(status.get("startTime"))
    if start is None:
        return NONE
    end = parse_time(status.get("completionTime")) or now
    return human_duration((end - start).total_seconds())


def _job_gpus(w: Wire, _now: datetime) -> str:
    """`2`, `0.5x8Gi` (a share of a GPU with 8Gi of its memory); a multi-node Job's per node,
    then how many nodes: `4/node*2`, `4x80Gi/node*2`. Not `2x4`, which reads as 2 GPUs of 4
    bytes each (a memory quantity may be a bare number of bytes)."""
    resources = w["spec"].get("resources", {})
    if "gpus" not in resources and resources.get("profile"):
        text = str(resources["profile"])  # the count comes from the GPUProfile
    else:
        text = quantity.format_gpus(float(resources.get("gpus", 1)))
    memory = resources.get("gpuMemory")
    text = f"{text}x{memory}" if memory else text
    nodes = int(resources.get("nodes") or 1)
    return f"{text}/node*{nodes}" if nodes > 1 else text


def _job_node(w: Wire, _now: datetime) -> str:
    """The node it runs on; a multi-node Job's rank 0 and how many more: `box1+3`."""
    status = w["status"]
    node = status.get("node")
    if node is None:
        return NONE
    more = len(status.get("nodes") or []) - 1
    return f"{node}+{more}" if more > 0 else str(node)


def _pending(read: Callable[[Wire, datetime], str]) -> Callable[[Wire, datetime], str]:
    """A column that only means something while the Job waits in its queue."""

    def pending_only(w: Wire, now: datetime) -> str:
        return read(w, now) if w["status"].get("phase", "Pending") == "Pending" else NONE

    return pending_only


def until(text: str | None, now: datetime) -> str:
    """How long until a moment: `12m`; `now` once it has passed."""
    moment = parse_time(text)
    if moment is None:
        return NONE
    seconds = (moment - now).total_seconds()
    return "now" if seconds < 1 else human_duration(seconds)


def _job_eta(w: Wire, now: datetime) -> str:
    return until(w["status"].get("estimatedStartTime"), now)


def _job_reason(w: Wire, _now: datetime) -> str:
    """Why the Job is where it is: its status's reason, else why it is not scheduled (the
    scheduler says that of a Job it cannot place in its Scheduled condition alone), as kubectl
    shows a pending pod's `Unschedulable`."""
    status = w["status"]
    if status.get("reason"):
        return str(status["reason"])
    conditions = status.get("conditions", [])
    scheduled = next((c for c in conditions if c["type"] == "Scheduled"), None)
    if scheduled is not None and scheduled["status"] == "False" and scheduled.get("reason"):
        return str(scheduled["reason"])
    return NONE


def index_ranges(indices: Sequence[int]) -> str:
    """GPU indices written short, in their order: `0-7` for eight, `0-2,5`, `3,1`."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def value_at(w: Wire, path: Sequence[str]) -> Any:
    """The value at `path` in a wire dict; None where there is none."""
    value: Any = w
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _gpu_ids(*path: str) -> Callable[[Wire, datetime], str]:
    def read(w: Wire, _now: datetime) -> str:
        value = value_at(w, path)
        return index_ranges([int(i) for i in value]) if value else NONE

    return read


def field(*path: str, default: str = NONE) -> Callable[[Wire, datetime], str]:
    def read(w: Wire, _now: datetime) -> str:
        value = value_at(w, path)
        if value is None or value in ([], ""):
            return default
        if isinstance(value, list):
            return ",".join(str(item) for item in value)
        return str(value)

    return read


def _pool_selector(w: Wire, _now: datetime) -> str:
    selector = w["spec"].get("selector", {})
    parts = []
    if nodes := selector.get("nodes"):
        parts.append("nodes=" + ",".join(nodes))
    if labels := selector.get("nodeLabels"):
        parts.extend(f"{k}={v}" for k, v in labels.items())
    if model := selector.get("gpuModel"):
        parts.append(f"model={model}")
    if gpus := selector.get("gpus"):
        parts.append("gpus=" + ",".join(str(g) for g in gpus))
    return " ".join(parts) or "<all>"


def _view(key: str) -> Callable[[Wire, datetime], str]:
    """A cell from what `views` worked out for the object (absent: `-o` of a watch)."""

    def read(w: Wire, _now: datetime) -> str:
        value = w.get(views.VIEW, {}).get(key)
        return NONE if value is None else str(value)

    return read


# gctl.api.sweep's REASON_NAME_TAKEN and REASON_NO_FILES, written out: tables import no models.
_SWEEP_PROBLEMS = frozenset({"NameTaken", "NoFilesMatched"})


def _sweep_status(w: Wire, _now: datetime) -> str:
    """The phase; a Pending Sweep that something stops shows why (NameTaken, NoFilesMatched),
    as kubectl shows a waiting Pod's reason."""
    if w["metadata"].get("deletionTimestamp"):
        return "Terminating"
    status = w["status"]
    phase = str(status.get("phase", "Pending"))
    if phase == "Pending" and status.get("reason") in _SWEEP_PROBLEMS:
        return str(status["reason"])
    return phase


def _sweep_done(w: Wire, _now: datetime) -> str:
    """`12/20`: Jobs that succeeded, of all the Sweep's points."""
    status = w["status"]
    return f"{status.get('succeeded', 0)}/{status.get('total', 0)}"


def _sweep_source(w: Wire, _now: datetime) -> str:
    spec = w["spec"]
    if "files" in spec:
        return f"files={spec['files']}"
    if "matrix" in spec:
        return "matrix=" + ",".join(sorted(spec["matrix"]))
    return f"items={len(spec.get('items', []))}"


_SOURCE_WIDTH = 36  # so that an ApplySet's row fits 100 columns; -o yaml shows it whole


def _pool_allows(w: Wire, _now: datetime) -> str:
    """What a pool allows of fractions, preemption and backfill (what it does not list is
    off): one column for -o wide, as kubectl lists a node's ROLES."""
    spec = w["spec"]
    allowed = [
        word
        for word, key, default in (
            ("fractions", "allowFractions", True),
            ("preemption", "preemption", True),
            ("backfill", "backfill", False),
        )
        if spec.get(key, default)
    ]
    return ",".join(allowed) or NONE


def _applyset_source(w: Wire, _now: datetime) -> str:
    """The directory a set comes from, its end kept when it is long: `...ts/experiments`."""
    return _applyset_source_in(w, _SOURCE_WIDTH)


def _applyset_source_in(w: Wire, room: int) -> str:
    """The same in `room` columns (a long set name leaves it less: QA's 26-character one made
    the line 102 columns)."""
    text = str(w["spec"].get("source") or NONE)
    return text if len(text) <= room else "..." + text[-(room - 3) :]


def _applyset_synced(w: Wire, _now: datetime) -> str:
    conditions = w["status"].get("conditions", [])
    synced = next((c for c in conditions if c["type"] == "Synced"), None)
    return NONE if synced is None else str(synced["status"])


def _applyset_reason(w: Wire, _now: datetime) -> str:
    conditions = w["status"].get("conditions", [])
    synced = next((c for c in conditions if c["type"] == "Synced"), None)
    return NONE if synced is None else str(synced.get("reason") or NONE)


def _node_status(w: Wire, _now: datetime) -> str:
    if views.VIEW in w:
        return str(w[views.VIEW]["status"])
    return views.node_status(w, busy=None)


_VENDOR = "NVIDIA "  # dropped in tables: every NVIDIA model name starts with it; width is scarce


def _node_gpus(w: Wire, _now: datetime) -> str:
    """`3/8`: GPUs a gctl job holds (whole or a share), of all the node's (views.gpu_counts);
    the total alone where no view was worked out."""
    gpus = w["status"].get("gpus", [])
    fake = " (fake)" if any(g.get("fake") for g in gpus) else ""
    view = w.get(views.VIEW)
    held = f"{view['allocated']}/" if view is not None else ""
    return f"{held}{len(gpus)}{fake}"


def _node_model(w: Wire, _now: datetime) -> str:
    models = sorted({str(g.get("model", "?")) for g in w["status"].get("gpus", [])})
    return ",".join(m.removeprefix(_VENDOR) or m for m in models) or NONE


_DESCRIPTION_WIDTH = 52  # so that a profile's row fits 100 columns; -o yaml shows it whole


def _description(w: Wire, _now: datetime) -> str:
    text = " ".join(str(w["spec"].get("description", "")).split())
    if len(text) > _DESCRIPTION_WIDTH:
        text = text[: _DESCRIPTION_WIDTH - 3].rstrip() + "..."
    return text or NONE


def _event_object(w: Wire, _now: datetime) -> str:
    ref = w["spec"].get("involvedObject", {})
    return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"


def _event_last_seen(w: Wire, now: datetime) -> str:
    return age(w["spec"].get("lastTimestamp") or w["metadata"].get("creationTimestamp"), now)


def _event_text(w: Wire, _now: datetime) -> str:
    """The message on one line (-o wide: its count has a column of its own)."""
    return " ".join(str(w["spec"].get("message", "")).split())


def _event_message(w: Wire, now: datetime) -> str:
    count = w["spec"].get("count", 1)
    message = _event_text(w, now)
    return f"{message} (x{count})" if count > 1 else message


_NAME: Column = ("NAME", field("metadata", "name"))
_AGE: Column = ("AGE", _created)

COLUMNS: dict[str, tuple[list[Column], list[Column]]] = {
    # kind: (default columns, extra columns for -o wide)
    "Job": (
        [
            _NAME,
            ("STATUS", _job_status),
            ("GPUS", _job_gpus),
            ("POOL", field("spec", "pool", default="default")),
            ("PRIORITY", field("spec", "priority", default="0")),
            _AGE,
        ],
        [
            ("NODE", _job_node),
            ("GPU-IDS", _gpu_ids("status", "gpus")),
            ("ATTEMPTS", field("status", "attempts", default="0")),
            ("EXIT", field("status", "exitCode")),
            ("DURATION", _job_duration),
            ("POS", _pending(field("status", "queuePosition"))),
            ("ETA", _pending(_job_eta)),
            ("REASON", _job_reason),
        ],
    ),
    "Sweep": (
        [
            _NAME,
            ("DONE", _sweep_done),
            ("RUNNING", field("status", "running", default="0")),
            ("PENDING", field("status", "pending", default="0")),
            ("FAILED", field("status", "failed", default="0")),
            ("STATUS", _sweep_status),
            _AGE,
        ],
        [
            ("MAX-PARALLEL", field("spec", "maxParallel")),
            ("OVER", _sweep_source),
            ("REASON", field("status", "reason")),
        ],
    ),
    "ApplySet": (
        [
            _NAME,
            ("SOURCE", _applyset_source),
            ("MEMBERS", lambda w, _now: str(len(w["status"].get("members", [])))),
            ("SYNCED", _applyset_synced),
            ("LAST SYNC", lambda w, now: age(w["status"].get("lastSyncTime"), now)),
            _AGE,
        ],
        [
            ("REASON", _applyset_reason),
            ("POLICY", field("spec", "onSpecChange", default="Refuse")),
            ("DRIFT-REVERTED", field("status", "driftReverted", default="0")),
        ],
    ),
    "GPUPool": (
        [
            _NAME,
            ("GPUS", _view("gpus")),
            ("ALLOCATED", _view("allocated")),
            ("RUNNING", _view("running")),
            ("QUEUED", _view("queued")),  # the Jobs `get jobs -o wide` gives a POS
            ("HELD", _view("held")),  # pending, but out of the queue (gctl.api.queue.held)
            ("POLICY", field("spec", "policy", default="binpack")),
            _AGE,
        ],
        [
            ("AHEAD", _view("ahead")),  # Scheduled, bound ahead to a busy GPU
            ("JOBS/GPU", field("spec", "maxJobsPerGPU")),  # none: as many as fractions allow
            ("ORDER", field("spec", "queueOrder", default="FIFO")),
            ("ALLOWS", _pool_allows),
            ("SELECTOR", _pool_selector),
        ],
    ),
    "GPUProfile": (
        [
            _NAME,
            ("GPUS", field("spec", "gpus", default="1")),
            ("MEMORY", field("spec", "gpuMemory")),
            ("MODEL", field("spec", "gpuModel")),
            ("DESCRIPTION", _description),
        ],
        [_AGE],
    ),
    "Node": (
        [_NAME, ("STATUS", _node_status), ("GPUS", _node_gpus), ("MODEL", _node_model), _AGE],
        [
            # The node's GPUs not counted in GPUS, as views.gpu_counts sorts them.
            ("FREE", _view("free")),
            ("CORDONED", _view("cordoned")),
            ("OTHER", _view("other")),  # held by processes gctl did not start
            ("HEARTBEAT", lambda w, now: age(w["status"].get("heartbeatTime"), now)),
            ("VERSION", field("status", "agentVersion")),
        ],
    ),
    "Binding": (
        [
            _NAME,
            ("JOB", field("spec", "jobName")),
            ("NODE", field("spec", "node")),
            ("GPUS", _gpu_ids("spec", "gpus")),
            ("PHASE", field("status", "phase")),
            _AGE,
        ],
        [
            ("PID", field("status", "pid")),
            ("EXIT", field("status", "exitCode")),
            ("RANK", field("spec", "rank")),  # a multi-node attempt's member; none alone
        ],
    ),
    "Event": (
        [
            ("LAST SEEN", _event_last_seen),
            ("TYPE", field("spec", "type")),
            ("REASON", field("spec", "reason")),
            ("OBJECT", _event_object),
            ("MESSAGE", _event_message),  # FREE_TEXT: last even in -o wide
        ],
        [("SOURCE", field("spec", "source")), ("COUNT", field("spec", "count"))],
    ),
}


# -- gpus: rows of views.gpu_rows(), a view of Nodes and Bindings, not a stored kind -------


def _bytes(value: int | None) -> str:
    return "?" if value is None else quantity.format_bytes(int(value))


def _gpu_memory(row: Wire, _now: datetime) -> str:
    """`79.3/80Gi`: used and total, the unit said once when both share it."""
    if row["memoryUsed"] is None and row["memoryTotal"] is None:
        return NONE
    used, total = _bytes(row["memoryUsed"]), _bytes(row["memoryTotal"])
    unit = total.lstrip("0123456789.")
    if unit and used.endswith(unit) and used[: -len(unit)].replace(".", "").isdigit():
        used = used[: -len(unit)]
    return f"{used}/{total}"


def _gpu_model(row: Wire, _now: datetime) -> str:
    model = str(row["model"] or NONE)
    return model.removeprefix(_VENDOR) or model


def _gpu_util(row: Wire, _now: datetime) -> str:
    return NONE if row["utilization"] is None else f"{row['utilization']}%"


_JOBS_WIDTH = 24  # names past this show as +N, so that a shared GPU's row fits 100 columns


def _gpu_holders(row: Wire) -> list[str]:
    names = []
    for holder in row["jobs"]:
        name = holder["name"]
        if holder["namespace"] != kinds.DEFAULT_NAMESPACE:
            name = f"{holder['namespace']}/{name}"
        share = float(holder["share"])
        names.append(f"{name}({share:g})" if 0 < share < 1 else name)
    return names


def _gpu_all_jobs(row: Wire, _now: datetime) -> str:
    """-o wide: every job on the GPU."""
    return ",".join(_gpu_holders(row)) or NONE


def jobs_within(names: Sequence[str], room: int) -> str:
    """As many of `names` as fit in `room` columns, then `+N` for the rest. The first is
    always shown, cut with `...` (its share kept) where even it does not fit beside its `+N`,
    as a long message is cut: a sweep's Job names run to 40 characters and more, and one whole
    pushed a row past the line."""
    if not names:
        return NONE
    shown = list(names[:1])
    for name in names[1:]:
        rest = len(names) - len(shown) - 1
        more = f",+{rest}" if rest else ""
        if len(",".join([*shown, name])) + len(more) > room:
            break
        shown.append(name)
    hidden = len(names) - len(shown)
    more = f",+{hidden}" if hidden else ""
    if len(shown) == 1:
        shown[0] = _cut_name(shown[0], room - len(more))
    return ",".join(shown) + more


def _cut_name(name: str, room: int) -> str:
    """`name` in `room` columns, ending in `...` when cut; a share, `(0.25)`, stays where a
    letter of the name still fits beside it."""
    if len(name) <= room:
        return name
    share = name[name.index("(") :] if name.endswith(")") else ""
    if room - len(share) - 3 < 1:
        share = ""
    return name[: max(room - len(share) - 3, 1)] + "..." + share


def _gpu_jobs(row: Wire, _now: datetime) -> str:
    return jobs_within(_gpu_holders(row), _JOBS_WIDTH)


def _gpu_jobs_in(row: Wire, room: int) -> str:
    return jobs_within(_gpu_holders(row), min(room, _JOBS_WIDTH))


def _gpu_other(row: Wire, _now: datetime) -> str:
    """GPU memory held by processes gctl did not start; `?` when NVML cannot tell."""
    processes = row["foreignProcesses"]
    if not processes:
        return NONE
    known = [p["usedMemory"] for p in processes if p["usedMemory"] is not None]
    return quantity.format_bytes(sum(known)) if known else "?"


def _gpu_other_pids(row: Wire, _now: datetime) -> str:
    return ",".join(str(p["pid"]) for p in row["foreignProcesses"]) or NONE


GPU_VIEW = "GPU"  # the key of the gpus table in COLUMNS; rows come from views.gpu_rows()
COLUMNS[GPU_VIEW] = (
    [
        ("NODE", field("node")),
        ("GPU", field("index")),
        ("MODEL", _gpu_model),
        ("MEMORY", _gpu_memory),
        ("UTIL", _gpu_util),
        ("JOBS", _gpu_jobs),
        ("OTHER", _gpu_other),  # memory of processes gctl did not start
        ("STATUS", field("status")),
    ],
    [("UUID", field("uuid")), ("OTHER-PIDS", _gpu_other_pids)],
)

# Columns before the last that give way, by table: where the first rows printed would pass the
# line, each is narrowed to what the others leave it (printers.Table), read with that room.
NARROWING: dict[tuple[str, str], Callable[[Wire, int], str]] = {
    (GPU_VIEW, "JOBS"): _gpu_jobs_in,  # a long model and a long sweep Job's name
    ("ApplySet", "SOURCE"): _applyset_source_in,  # a long set name
}

FREE_TEXT = "MESSAGE"  # a column printed last, as kubectl's `get events` does: it gives way
# Cells that -o wide shows whole, in place of what the plain table shortens.
WIDE_CELLS: dict[tuple[str, str], Callable[[Wire, datetime], str]] = {
    ("Event", FREE_TEXT): _event_text,  # its count has a column there
    (GPU_VIEW, "JOBS"): _gpu_all_jobs,
}


def labels(w: Wire, _now: datetime) -> str:
    labels = w["metadata"].get("labels", {})
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or NONE
