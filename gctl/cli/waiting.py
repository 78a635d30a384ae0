"""The body of `gctl wait`, like kubectl wait, and the `--timeout` durations that every waiting
command takes (`parse_timeout`: wait, apply --force, drain --wait).

It follows the change feed until every object meets its goal; a timer only ends the wait at
--timeout. The top level imports no SQLAlchemy and no pydantic: `gctl --help` must stay fast.
"""

from __future__ import annotations

import math
import re
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gctl.api import errors, kinds, quantity
from gctl.cli import following

if TYPE_CHECKING:
    from gctl.store import db

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_timeout(text: str, flag: str = "--timeout") -> float:
    """`30s`, `10m`, `1h30m`, `500ms`, or a bare number of seconds, given with `flag`."""
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise errors.Invalid(
                f"{flag} {text!r}: use a duration such as 30s, 10m, 1h, or seconds"
            ) from None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds < 0:
        raise errors.Invalid(f"{flag} {text!r}: must be a duration of zero or more")
    if seconds > quantity.MAX_DURATION_SECONDS:  # a thread waits at most ~292 years
        raise errors.Invalid(f"{flag} {text!r}: must be at most a year (365d)")
    return seconds


@dataclass(frozen=True)
class Goal:
    """`--for`: a condition type with the status wanted, or deletion (type None)."""

    type: str | None
    status: str = "True"

    def met(self, wire: dict[str, Any] | None) -> bool:
        if wire is None:
            return self.type is None
        return self.type is not None and any(
            c.get("type", "").lower() == self.type.lower() and c.get("status") == self.status
            for c in wire.get("status", {}).get("conditions", [])
        )


def parse_goal(text: str) -> Goal:
    if text.lower() == "delete":
        return Goal(None)
    what, eq, rest = text.partition("=")
    if what.lower() == "condition" and eq and rest:
        type_, eq, value = rest.partition("=")
        status = {"true": "True", "false": "False", "unknown": "Unknown"}.get(
            value.lower() if eq else "true"
        )
        if type_ and status is not None:
            return Goal(type_, status)
    raise errors.Invalid(
        f"--for {text!r}: use condition=TYPE (e.g. condition=Complete), "
        "condition=TYPE=false, or delete"
    )


def wait(
    *,
    resource: str,
    names: list[str],
    conditions: list[str],
    timeout: str,
    namespace: str | None,
    db_url: str | None,
) -> None:
    from gctl.store import db, store

    if not conditions:
        raise errors.Invalid("--for: say what to wait for: condition=TYPE or delete")
    goals = [parse_goal(text) for text in conditions]
    seconds = parse_timeout(timeout)
    info, names = _targets(resource, names)
    where = (namespace or kinds.DEFAULT_NAMESPACE) if info.namespaced else ""
    database = db.Database.open(db_url, create=False)
    with database.read() as session:
        reader = store.Store(session)
        revision = reader.current_revision()
        found = {
            w["metadata"]["name"]: w
            for w in reader.list_wire(kinds.model(info.kind), where or None, names=names)
        }
    waiting = {}
    for name in dict.fromkeys(names):
        if name not in found and not any(g.type is None for g in goals):
            raise errors.NotFound(store_not_found(info, name, where))
        waiting[name] = found.get(name)
    _settle(info, waiting, goals)
    if waiting and seconds > 0:
        _wait_for(
            database=database,
            info=info,
            where=where,
            revision=revision,
            waiting=waiting,
            goals=goals,
            seconds=seconds,
        )
    for name in sorted(waiting):
        print(
            f"error: timed out waiting for the condition on {info.plural}/{name}", file=sys.stderr
        )
    if waiting:
        raise SystemExit(1)


def _targets(resource: str, names: list[str]) -> tuple[kinds.KindInfo, list[str]]:
    """`KIND NAME...` or `KIND/NAME...`, as kubectl wait takes them; one kind at a time."""
    if "/" not in resource:
        info = kinds.by_word(resource)
        if not names:
            raise errors.Invalid(f"name the {info.plural} to wait for: KIND/NAME or KIND NAME...")
        return info, names
    found: list[str] = []
    infos = set()
    for text in [resource, *names]:
        word, slash, name = text.partition("/")
        if not slash or not name:
            raise errors.Invalid(f"{text}: give every object as KIND/NAME, or KIND NAME...")
        infos.add(kinds.by_word(word))
        found.append(name)
    if len(infos) > 1:
        raise errors.Invalid("wait for one kind at a time")
    return infos.pop(), found


def store_not_found(info: kinds.KindInfo, name: str, where: str) -> str:
    place = f' in namespace "{where}"' if info.namespaced else ""
    return f'{info.kind.lower()} "{name}" not found{place}'


def _settle(
    info: kinds.KindInfo, waiting: dict[str, dict[str, Any] | None], goals: list[Goal]
) -> None:
    """Print and drop the objects (None: deleted) that meet a goal."""
    for name, wire in list(waiting.items()):
        if any(goal.met(wire) for goal in goals):
            print(f"{info.kind.lower()}.gctl/{name} condition met", flush=True)
            del waiting[name]


def _wait_for(
    *,
    database: db.Database,
    info: kinds.KindInfo,
    where: str,
    revision: int,
    waiting: dict[str, dict[str, Any] | None],
    goals: list[Goal],
    seconds: float,
) -> None:
    """Follow the feed until every object meets a goal, the time is up, or Ctrl-C."""
    from gctl.store import feed, notify

    stop = notify.Stop()
    timer = threading.Timer(seconds, stop.set)
    timer.daemon = True
    timer.start()
    try:
        with (
            following.interruptible(stop) as interrupted,
            feed.Watch(database, since=revision, kinds=[info.kind], stop=stop) as changes,
        ):
            for batch in changes:
                for change in batch:
                    if change.name in waiting and change.namespace == where:
                        deleted = change.type == "DELETED"
                        if deleted and not any(g.type is None for g in goals):
                            raise errors.NotFound(
                                f"{info.kind.lower()}.gctl/{change.name} was deleted while "
                                "waiting for the condition"
                            )
                        waiting[change.name] = None if deleted else change.object
                _settle(info, waiting, goals)
                if not waiting:
                    return
        if interrupted.is_set():
            raise SystemExit(following.INTERRUPTED)
    finally:
        timer.cancel()
