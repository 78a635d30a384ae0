"""`gctl cordon`, `drain` and `uncordon`: closing GPUs, or whole nodes, to new work.

A target is `gpuN` (GPU N of the only node, or of `--node`), `NODE/gpuN`, `node NAME` or a bare
node name, as kubectl takes one. Each command reads the Nodes, works out their new specs with
the pure functions below, and writes them with compare-and-set in one transaction
(`store.transact`), so an agent's heartbeat landing in between costs a retry, never the
cordon. `drain --evict` sets each active Binding's `spec.stopReason` to Evicted in the same
transaction, as kubectl drain evicts from the client: the agent stops the attempt and the
controller requeues its Job. `drain --wait` then follows the change feed until no Binding
holds the targets any more.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gctl.api import errors
from gctl.cli import cells, following, views

if TYPE_CHECKING:
    from gctl.api import node
    from gctl.store import db, store

_GPU = re.compile(r"^gpu(\d+)$", re.IGNORECASE)
_NODE_WORDS = ("node", "nodes", "no")
_LISTED = 6  # nodes named in an error line before "..."

# Reasons of the Events recorded on a Node.
REASON_CORDONED = "Cordoned"
REASON_DRAINING = "Draining"
REASON_DRAINED = "Drained"
REASON_EVICTING = "Evicting"
REASON_UNCORDONED = "Uncordoned"


@dataclass(frozen=True)
class Target:
    """A GPU of a node, or a whole node (`gpu` None); `node` None: the only node."""

    node: str | None
    gpu: int | None = None

    def ref(self) -> str:
        """As results print it: `gpu box2/gpu0`, `node/box2`."""
        return f"node/{self.node}" if self.gpu is None else f"gpu {self.node}/gpu{self.gpu}"

    def holds(self, bound: dict[str, Any]) -> bool:
        """Whether a Binding (wire) is on this GPU or node."""
        spec = bound["spec"]
        return spec["node"] == self.node and (self.gpu is None or self.gpu in spec.get("gpus", []))


# -- naming the targets ------------------------------------------------------------------------


def parse_targets(verb: str, words: list[str], node_flag: str | None) -> list[Target]:
    """`gpu0`, `box2/gpu1`, `node box2 box3`, `node/box2` or `box2` -> targets, unresolved."""
    if not words:
        raise errors.Invalid(f"say what to {verb}: gpuN, NODE/gpuN or node NAME")
    if words[0].lower() in _NODE_WORDS:
        if len(words) == 1:
            raise errors.Invalid(f"name the node: gctl {verb} node NAME")
        if node_flag is not None:
            raise errors.Invalid("--node goes with gpuN; name whole nodes after the word node")
        return list(dict.fromkeys(Target(name) for name in words[1:]))
    targets = []
    for word in words:
        head, slash, tail = word.rpartition("/")
        gpu = _GPU.match(tail)
        if slash and head.lower() in _NODE_WORDS and gpu is None:
            targets.append(Target(tail))
        elif slash:
            if not head or gpu is None:
                raise errors.Invalid(f"{word}: name a GPU as NODE/gpuN, a node as node/NAME")
            if node_flag is not None and node_flag != head:
                raise errors.Invalid(f"{word} is on node {head}, but --node says {node_flag}")
            targets.append(Target(head, int(gpu[1])))
        elif gpu is not None:
            targets.append(Target(node_flag, int(gpu[1])))
        elif node_flag is not None:
            raise errors.Invalid(f"{word}: with --node, name GPUs as gpuN")
        else:
            targets.append(Target(word))
    return list(dict.fromkeys(targets))


def _names(nodes: Iterable[str]) -> str:
    ordered = sorted(nodes)
    shown = ", ".join(ordered[:_LISTED])
    return shown + (", ..." if len(ordered) > _LISTED else "")


def span(indices: Iterable[int]) -> str:
    """`[0, 1, 2, 3, 6]` -> `0-3,6`: a set of GPUs, in order."""
    return cells.index_ranges(sorted(set(indices)))


def resolve(targets: list[Target], nodes: dict[str, node.Node]) -> list[Target]:
    """Name the node of every `gpuN`; refuse a node or GPU that is not there."""
    resolved = []
    for target in targets:
        name = target.node
        if name is None:
            if not nodes:
                raise errors.NotFound(
                    "no nodes yet: start an agent (gctl up, or gctl agent run on each GPU host)"
                )
            if len(nodes) > 1:
                raise _ambiguous(target.gpu, nodes)
            name = next(iter(nodes))
        found = nodes.get(name)
        if found is None:
            hint = f"; for GPU {name} say gpu{name}" if name.isdigit() else ""
            known = f" (nodes: {_names(nodes)})" if nodes else " (no nodes yet)"
            raise errors.NotFound(f'node "{name}" not found{known}{hint}')
        indices = [g.index for g in found.status.gpus]
        if target.gpu is not None and target.gpu not in indices:
            has = f"its GPUs: {span(indices)}" if indices else "it reports no GPUs"
            raise errors.NotFound(f'node "{name}" has no GPU {target.gpu} ({has})')
        resolved.append(Target(name, target.gpu))
    return list(dict.fromkeys(resolved))


def _ambiguous(gpu: int | None, nodes: dict[str, node.Node]) -> errors.GctlError:
    """A bare `gpuN` among several nodes: the example to copy names a node that has GPU N,
    since nodes of different sizes need not all have it."""
    having = sorted(
        n for n, found in nodes.items() if any(g.index == gpu for g in found.status.gpus)
    )
    if not having:
        return errors.NotFound(f"gpu{gpu}: no node has GPU {gpu} (nodes: {_names(nodes)})")
    return errors.Invalid(
        f"gpu{gpu}: several nodes: say {having[0]}/gpu{gpu} (nodes: {_names(nodes)})"
    )


# -- the new specs: pure -----------------------------------------------------------------------


def cordoned(spec: node.NodeSpec, gpu: int | None) -> node.NodeSpec:
    if gpu is None:
        return spec.model_copy(update={"unschedulable": True})
    if spec.closed(gpu):
        return spec
    return spec.model_copy(update={"cordoned_gpus": sorted({*spec.cordoned_gpus, gpu})})


def drained(spec: node.NodeSpec, gpu: int | None) -> node.NodeSpec:
    """Draining also cordons a whole node, as kubectl drain does first."""
    if gpu is None:
        return spec.model_copy(update={"unschedulable": True, "draining": True})
    if spec.draining or gpu in spec.draining_gpus:
        return spec
    return spec.model_copy(
        update={
            "draining_gpus": sorted({*spec.draining_gpus, gpu}),
            "cordoned_gpus": [i for i in spec.cordoned_gpus if i != gpu],
        }
    )


def uncordoned(spec: node.NodeSpec, gpu: int | None) -> node.NodeSpec:
    """A node's cordon and drain, or one GPU's; a GPU's own state outlives its node's."""
    if gpu is None:
        return spec.model_copy(update={"unschedulable": False, "draining": False})
    return spec.model_copy(
        update={
            "cordoned_gpus": [i for i in spec.cordoned_gpus if i != gpu],
            "draining_gpus": [i for i in spec.draining_gpus if i != gpu],
        }
    )


def _state(spec: node.NodeSpec, gpu: int | None) -> str:
    """ "draining", "cordoned" or "uncordoned", as a word after "already"."""
    if gpu is None:
        return "draining" if spec.draining else "cordoned" if spec.unschedulable else "uncordoned"
    return (spec.gpu_state(gpu) or "uncordoned").lower()


_EDITS = {"cordon": cordoned, "drain": drained, "uncordon": uncordoned}
_REASONS = {"cordon": REASON_CORDONED, "drain": REASON_DRAINING, "uncordon": REASON_UNCORDONED}


@dataclass(frozen=True)
class Outcome:
    target: Target
    changed: bool
    before: str  # the state it was in: draining, cordoned or uncordoned
    still_closed: str | None = None  # after uncordon: what else keeps it closed


def _remaining(spec: node.NodeSpec, target: Target) -> str | None:
    """What still closes a target after uncordon: its node's state, or its GPUs' own."""
    if target.gpu is not None:
        if spec.draining or spec.unschedulable:
            state = "draining" if spec.draining else "cordoned"
            return f"node {target.node} is still {state}: gctl uncordon node {target.node}"
        return None
    closed = sorted({*spec.cordoned_gpus, *spec.draining_gpus})
    if not closed:
        return None
    return (
        f"GPUs {span(closed)} of node {target.node} stay closed: "
        f"gctl uncordon {' '.join(f'{target.node}/gpu{i}' for i in closed)}"
    )


def edit(verb: str, writer: store.Store, targets: list[Target]) -> list[Outcome]:
    """Apply `verb` to the targets' Nodes with compare-and-set; an Event for each change."""
    from gctl.api import node

    nodes = {n.name: n for n in writer.lock_objects(node.Node)}
    resolved = resolve(targets, nodes)
    outcomes = []
    for name in dict.fromkeys(t.node for t in resolved):
        assert name is not None
        current = nodes[name]
        spec = current.spec
        changes = []
        for target in (t for t in resolved if t.node == name):
            before = _state(spec, target.gpu)
            new = _EDITS[verb](spec, target.gpu)
            if new != spec:
                changes.append(target)
            outcomes.append(Outcome(target, new != spec, before))
            spec = new
        if changes:
            current.spec = spec
            current = writer.update(current)
            for target in changes:
                what = "node" if target.gpu is None else f"GPU {target.gpu}"
                done = "draining" if verb == "drain" else f"{verb}ed"
                writer.record_event(
                    current, _REASONS[verb], f"{what} {done}", source=f"gctl {verb}"
                )
        nodes[name] = current
    if verb != "uncordon":
        return outcomes
    return [
        Outcome(o.target, o.changed, o.before, _remaining(nodes[str(o.target.node)].spec, o.target))
        for o in outcomes
    ]


def evict(writer: store.Store, targets: list[Target]) -> list[dict[str, Any]]:
    """Ask the agent to stop every attempt on the targets, for its Job to be requeued; the
    Bindings (wire) asked. One already being stopped, for any reason, is left as it is."""
    from gctl.api import binding, node

    asked = []
    for name in dict.fromkeys(t.node for t in targets):
        on_node = writer.active_bindings(name)
        owner = writer.get(node.Node, str(name))
        for bound in on_node:
            wire = bound.wire()
            if bound.spec.stop_reason or not any(t.holds(wire) for t in targets):
                continue
            if binding.movable(bound.spec, bound.status):
                continue  # bound ahead, not started: moved off a closed GPU (given back first)
            bound.spec.stop_reason = binding.STOP_EVICTED
            writer.update(bound)
            asked.append(wire)
            writer.record_event(
                owner,
                REASON_EVICTING,
                f"job {_job(wire)} (attempt {bound.spec.attempt}, "
                f"GPUs {span(bound.spec.gpus) or 'none'}): stopped to be requeued",
                source="gctl drain",
            )
    return asked


def _job(bound: dict[str, Any]) -> str:
    return f"{bound['metadata'].get('namespace', 'default')}/{bound['spec']['jobName']}"


def _busy(database: db.Database, targets: list[Target]) -> tuple[int, dict[str, dict[str, Any]]]:
    """The head revision, then the Bindings that hold the targets (so a watch from that revision
    misses no change to them)."""
    from gctl.store import store

    with database.read() as session:
        reader = store.Store(session)
        revision = reader.current_revision()
        held = {
            str(b.metadata.uid): b.wire()
            for name in dict.fromkeys(t.node for t in targets)
            for b in reader.active_bindings(name)
        }
    return revision, {
        uid: w for uid, w in held.items() if views.holding(w) and any(t.holds(w) for t in targets)
    }


# -- the commands ------------------------------------------------------------------------------


def cordon(*, words: list[str], node_flag: str | None, db_url: str | None) -> None:
    _open_or_close("cordon", words, node_flag, db_url)


def uncordon(*, words: list[str], node_flag: str | None, db_url: str | None) -> None:
    _open_or_close("uncordon", words, node_flag, db_url)


def _open_or_close(verb: str, words: list[str], node_flag: str | None, db_url: str | None) -> None:
    from gctl.store import db, store

    targets = parse_targets(verb, words, node_flag)
    database = db.Database.open(db_url, create=False)
    outcomes = store.transact(database, lambda writer: edit(verb, writer, targets))
    for outcome in outcomes:
        ref = outcome.target.ref()
        if outcome.changed:
            print(f"{ref} {verb}ed")
        else:
            print(f"{ref} already {outcome.before if verb == 'cordon' else 'uncordoned'}")
        if outcome.still_closed:
            print(f"warning: {outcome.still_closed}", file=sys.stderr)


def drain(
    *,
    words: list[str],
    node_flag: str | None,
    evicting: bool,
    wait: bool,
    timeout: str | None,
    db_url: str | None,
) -> None:
    """Close the targets, evict what runs there if asked, and say which are empty already;
    with --wait (or a --timeout) follow the feed until the rest are."""
    from gctl.cli import waiting
    from gctl.store import db, store

    seconds = waiting.parse_timeout(timeout) if timeout is not None else None
    targets = parse_targets("drain", words, node_flag)
    database = db.Database.open(db_url, create=False)

    def work(writer: store.Store) -> tuple[list[Outcome], list[dict[str, Any]]]:
        outcomes = edit("drain", writer, targets)
        asked = evict(writer, [o.target for o in outcomes]) if evicting else []
        return outcomes, asked

    outcomes, asked = store.transact(database, work)
    targets = [o.target for o in outcomes]
    revision, busy = _busy(database, targets)
    _report(outcomes, asked, busy)
    held = [t for t in targets if _holding(t, busy)]
    if busy and (wait or seconds is not None):
        _wait_empty(
            database,
            revision=revision,
            targets=targets,
            busy=busy,
            seconds=seconds,
            timeout=timeout,
            evicting=evicting,
        )
        emptied = [o.target for o in outcomes if o.changed or o.target in held]
    else:
        if busy:
            then = "the agent stops them" if evicting else "they finish first"
            print(f"still there: {_left(busy)}; {then} (--wait waits for them)", file=sys.stderr)
        emptied = [o.target for o in outcomes if o.changed and o.target not in held]
    if emptied:
        _drained(database, emptied)


def _holding(target: Target, busy: dict[str, dict[str, Any]]) -> bool:
    return any(target.holds(w) for w in busy.values())


def _report(
    outcomes: list[Outcome], asked: list[dict[str, Any]], busy: dict[str, dict[str, Any]]
) -> None:
    """What the drain found: targets with jobs left are draining; empty ones that were
    draining before are already drained (newly empty ones are reported drained after)."""
    for outcome in outcomes:
        ref = outcome.target.ref()
        if _holding(outcome.target, busy):
            print(f"{ref} {'draining' if outcome.changed else 'already draining'}")
        elif not outcome.changed:
            print(f"{ref} already drained")
    sys.stdout.flush()
    for bound in asked:
        spec = bound["spec"]
        where = f"{spec['node']}, GPUs {span(spec.get('gpus', [])) or 'none'}"
        print(f"evicting job {_job(bound)} (attempt {spec['attempt']} on {where})", file=sys.stderr)


def _drained(database: db.Database, targets: list[Target]) -> None:
    """Say so, and record it on each Node."""
    from gctl.api import node
    from gctl.store import store

    def work(writer: store.Store) -> None:
        for target in targets:
            what = "node" if target.gpu is None else f"GPU {target.gpu}"
            owner = writer.get(node.Node, str(target.node))
            writer.record_event(owner, REASON_DRAINED, f"{what} drained", source="gctl drain")

    store.transact(database, work)
    for target in targets:
        print(f"{target.ref()} drained")


def _wait_empty(
    database: db.Database,
    *,
    revision: int,
    targets: list[Target],
    busy: dict[str, dict[str, Any]],
    seconds: float | None,
    timeout: str | None,
    evicting: bool,
) -> None:
    """Follow the change feed until no Binding holds the targets. `busy` (by uid) is kept up to
    date: what is left when the time is up (an error) or at Ctrl-C (exit 130)."""
    from gctl.store import feed, notify

    print(f"waiting for {_left(busy)}", file=sys.stderr, flush=True)
    stop = notify.Stop()
    timer = threading.Timer(seconds, stop.set) if seconds else None
    if seconds == 0:
        stop.set()  # checked once already
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        with (
            following.interruptible(stop) as interrupted,
            feed.Watch(database, since=revision, kinds=["Binding"], stop=stop) as changes,
        ):
            for batch in changes:
                for change in batch:
                    _follow(
                        change.uid,
                        None if change.type == "DELETED" else change.object,
                        targets,
                        busy,
                    )
                if not busy:
                    return
        if interrupted.is_set():
            raise SystemExit(following.INTERRUPTED)
    finally:
        if timer is not None:
            timer.cancel()
    hint = "is the agent of that node running?" if evicting else "--evict requeues them"
    raise errors.GctlError(f"timed out after {timeout} waiting for {_left(busy)} ({hint})")


def _follow(
    uid: str, wire: dict[str, Any] | None, targets: list[Target], busy: dict[str, dict[str, Any]]
) -> None:
    """One Binding's change (None: deleted): it ended, or, rarely, it was bound to a target just
    as the drain began (a scheduler that read the Node before the drain was written)."""
    holds = wire is not None and views.holding(wire) and any(t.holds(wire) for t in targets)
    if uid in busy and not holds:
        ended = busy.pop(uid)
        phase = "deleted" if wire is None else wire["status"].get("phase", "ended")
        print(
            f"job {_job(ended)} ended ({phase}); left: {_left(busy)}", file=sys.stderr, flush=True
        )
    elif uid not in busy and holds:
        assert wire is not None
        busy[uid] = wire
        print(f"job {_job(wire)} was bound there as the drain began", file=sys.stderr)


def _left(busy: dict[str, dict[str, Any]]) -> str:
    """`2 job(s): default/a, default/b`, or `none`."""
    if not busy:
        return "none"
    return f"{len(busy)} job(s): " + ", ".join(sorted({_job(w) for w in busy.values()}))
