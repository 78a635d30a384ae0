"""`gctl describe`: an object as a person reads it, like kubectl describe.

Spec and status print as an indented tree with Title Case keys; conditions and events as tables.
"""

import re
import shlex
from datetime import datetime
from typing import Any

from gctl.api import event
from gctl.cli import printers

_WORD_BREAK = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_ACRONYMS = {"Gpu": "GPU", "Gpus": "GPUs", "Uid": "UID", "Ttl": "TTL", "Id": "ID"}


def title(key: str) -> str:
    """`ttlSecondsAfterFinished` -> `TTL Seconds After Finished`."""
    words = _WORD_BREAK.sub(" ", key).split(" ")
    return " ".join(_ACRONYMS.get(w.capitalize(), w[:1].upper() + w[1:]) for w in words)


def _tree(value: Any, indent: int) -> list[str]:
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        width = max((len(title(k)) for k in value), default=0) + 2
        for key, item in value.items():
            label = f"{title(key)}:"
            if isinstance(item, dict) and item:
                lines.append(f"{pad}{label}")
                lines.extend(_tree(item, indent + 1))
            elif isinstance(item, list) and item and any(isinstance(i, dict) for i in item):
                lines.append(f"{pad}{label}")
                for element in item:
                    lines.extend(_tree(element, indent + 1))
                    lines.append("")
            else:
                lines.append(f"{pad}{label.ljust(width)}{_scalar(item)}")
    else:
        lines.append(f"{pad}{_scalar(value)}")
    return lines


def _scalar(value: Any) -> str:
    if isinstance(value, list):
        return shlex.join(str(v) for v in value) if value else printers.NONE
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or printers.NONE
    if value is None or value == "":
        return printers.NONE
    return str(value)


def _table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(headers[i]), *(len(r[i]) for r in rows)) for i in range(len(headers))]
    rule = ["-" * len(h) for h in headers]
    return [
        indent + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in [headers, rule, *rows]
    ]


def render(wire: dict[str, Any], events: list[event.Event], now: datetime) -> str:
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
        "Created": f"{created} ({printers.age(created, now)} ago)" if created else None,
    }
    if metadata.get("deletionTimestamp"):
        head["Deleting Since"] = metadata["deletionTimestamp"]
    if "namespace" not in metadata:
        del head["Namespace"]
    if wire["kind"] == "Job":
        head |= _queue(wire, now)
    lines = [f"{key + ':':<14}{_scalar(value)}" for key, value in head.items()]
    lines.append("Spec:")
    lines.extend(_tree(wire["spec"], 1))
    status = dict(wire["status"])
    conditions = status.pop("conditions", [])
    lines.append("Status:")
    lines.extend(_tree(status, 1) if status else ["  " + printers.NONE])
    lines.append("Conditions:" if conditions else f"Conditions:   {printers.NONE}")
    if conditions:
        rows = [
            [
                c["type"],
                c["status"],
                c.get("reason", ""),
                printers.age(c.get("lastTransitionTime"), now),
                c.get("message", ""),
            ]
            for c in conditions
        ]
        lines.extend(_table(["Type", "Status", "Reason", "Age", "Message"], rows))
    lines.append("Events:" if events else f"Events:       {printers.NONE}")
    if events:
        rows = [_event_row(e, now) for e in events]
        lines.extend(_table(["Type", "Reason", "Age", "From", "Message"], rows))
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
            found["Queue"] = f"position {position} in pool {pool}"
        if eta := status.get("estimatedStartTime"):
            when = printers.until(eta, now)
            found["Starts"] = f"{eta} ({when})" if when == "now" else f"{eta} (in {when})"
    if preemptions := status.get("preemptions"):
        found["Preemptions"] = f"{preemptions} (requeued each time, not counted as failures)"
    return {key: value for key, value in found.items() if value}


def _event_row(e: event.Event, now: datetime) -> list[str]:
    def ago(moment: datetime) -> str:
        return printers.human_duration((now - moment).total_seconds())

    seen = e.spec.last_timestamp or e.metadata.creation_timestamp
    when = ago(seen) if seen else "?"
    if e.spec.count > 1 and e.spec.first_timestamp:
        when += f" (x{e.spec.count} over {ago(e.spec.first_timestamp)})"
    return [e.spec.type, e.spec.reason, when, e.spec.source or "-", e.spec.message]
