"""The bodies of `gctl logs` and `gctl run`: the commands that follow Jobs as they run
(`gctl wait` is in `waiting`).

They wait on the change feed and on watchfiles, never on a timer (`following` holds how). The
top level imports no SQLAlchemy and no pydantic: `gctl --help` must stay fast.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gctl.api import errors, kinds
from gctl.cli import following

if TYPE_CHECKING:
    from gctl.api import binding, job
    from gctl.store import db

# -- logs ----------------------------------------------------------------------------------------


def logs(
    *,
    name: str,
    namespace: str | None,
    follow: bool,
    attempt: int | None,
    previous: bool,
    db_url: str | None,
    from_node: bool = False,
    rank: int | None = None,
) -> None:
    from gctl.store import db, notify

    name = _job_name(name)
    if attempt is not None and previous:
        raise errors.Invalid("--attempt and --previous: give one of them")
    database = db.Database.open(db_url, create=False)
    view = following.read_view(database, namespace or kinds.DEFAULT_NAMESPACE, name, rank=rank or 0)
    if view.job is None:
        raise errors.NotFound(f'job "{name}" not found in namespace "{view.namespace}"')
    if rank is not None:
        _check_rank(view.job, rank)
    chosen = _chosen(view, attempt, previous)
    wanted = None if chosen is None else chosen.spec.attempt
    if not follow and (chosen is None or not following.started(chosen)):
        which = f"attempt {wanted} of " if attempt is not None else ""
        which = f"rank {rank} of {which}" if rank else which
        raise errors.NotFound(f"{which}job {name} has not started yet")
    stop = notify.Stop()
    try:
        with following.interruptible(stop):
            if chosen is not None and following.started(chosen):
                following.show(database, chosen, view.revision, follow, stop, from_node=from_node)
                return
            started, view = following.await_view(database, view, _first_started(wanted), stop)
            following.show(database, started, view.revision, follow, stop, from_node=from_node)
    except following.Interrupted:
        raise SystemExit(following.INTERRUPTED) from None


def _check_rank(owner: job.Job, rank: int) -> None:
    """`--rank R` names a member of a multi-node Job: R below its node count."""
    nodes = owner.spec.resources.node_count()
    if nodes == 1:
        raise errors.Invalid(
            f"--rank {rank}: job {owner.name} runs on one node (resources.nodes is not set): "
            "leave --rank out"
        )
    if rank >= nodes:
        raise errors.Invalid(
            f"--rank {rank}: job {owner.name} runs on {nodes} nodes: give a rank from 0 to "
            f"{nodes - 1}"
        )


def _job_name(text: str) -> str:
    """`NAME` or `job/NAME`, as kubectl logs takes a pod."""
    word, slash, name = text.partition("/")
    if not slash:
        return text
    if kinds.by_word(word) is not kinds.JOB or not name:
        raise errors.Invalid(f"{text}: logs are kept for Jobs: give NAME or job/NAME")
    return name


def _chosen(view: following.View, number: int | None, previous: bool) -> binding.Binding | None:
    """The attempt asked for: N, the one before the latest, or the latest (None: none yet)."""
    made = ", ".join(str(a.spec.attempt) for a in view.attempts) or "none"
    if previous:
        if len(view.attempts) < 2:
            raise errors.NotFound(f"job {view.name} has no previous attempt (attempts: {made})")
        return view.attempts[-2]
    if number is not None:
        for attempt in view.attempts:
            if attempt.spec.attempt == number:
                return attempt
        raise errors.NotFound(f"job {view.name} has no attempt {number} (attempts: {made})")
    return view.attempts[-1] if view.attempts else None


def _first_started(number: int | None) -> Callable[[following.View], binding.Binding | None]:
    """Decides when attempt `number` (None: any) has started; fails if it never will."""

    def decide(view: following.View) -> binding.Binding | None:
        started = [
            a for a in view.attempts if following.started(a) and number in (None, a.spec.attempt)
        ]
        if started:
            return started[-1]
        if view.job is None:
            raise errors.NotFound(f"job {view.name} was deleted before it started")
        if view.job.status.phase in following.FINISHED:
            why = view.job.status.message or view.job.status.reason or view.job.status.phase
            raise errors.NotFound(f"job {view.name} finished without starting: {why}")
        return None

    return decide


# -- run -----------------------------------------------------------------------------------------

_SOURCE = "gctl run"
_NAME_ALPHABET = string.ascii_lowercase + string.digits
_SOURCE_PREFIX = re.compile(r'^gctl run: document 1 \((Job "[^"]*")\): ')


def run(
    *,
    command: list[str],
    name: str | None,
    namespace: str | None,
    gpus: str | None,
    gpu_memory: str | None,
    profile: str | None,
    priority: str | None,
    env: list[str],
    pool: str | None,
    labels: list[str],
    attach: bool,
    db_url: str | None,
    node: str | None = None,
    gpu_ids: str | None = None,
    from_node: bool = False,
    nodes: str | None = None,
    depends_on: list[str] | None = None,
    backoff_limit: str | None = None,
    time_limit: str | None = None,
    conda_env: str | None = None,
    gpu_env: str | None = None,
) -> None:
    from gctl.store import db

    if not command:
        raise errors.Invalid("say what to run: gctl run [OPTIONS] -- COMMAND [ARGS]...")
    where = namespace or kinds.DEFAULT_NAMESPACE
    spec: dict[str, Any] = {"command": command, "workingDir": os.getcwd()}
    resources = {
        key: value
        for key, value in (
            ("gpus", _number(gpus)),
            ("gpuMemory", gpu_memory),
            ("profile", profile),
            ("nodes", _number(nodes)),
        )
        if value is not None
    }
    placement = _placement(node, gpu_ids)
    if placement:
        spec["placement"] = placement
        # `--gpu-ids 0,1` alone asks for those two; beside --profile, the profile's count
        # does, as in a manifest, and the ids are the GPUs it may use (`0-3`: any of them).
        if "gpus" in placement and "profile" not in resources:
            resources.setdefault("gpus", len(placement["gpus"]))
    if resources:
        spec["resources"] = resources
    if priority is not None:
        spec["priority"] = _number(priority)
    if env:
        spec["env"] = _pairs("--env", env)
    if pool is not None:
        spec["pool"] = pool
    # The fields the schedulers gctl replaces took on their command lines: retries, a conda
    # environment, Ascend's device variable, a session timeout (srun's --time), and Slurm's
    # --dependency=afterok.
    if time_limit is not None:
        from gctl.cli import waiting

        spec["activeDeadlineSeconds"] = math.ceil(waiting.parse_timeout(time_limit, "--time"))
    if depends_on:
        spec["dependsOn"] = [n for given in depends_on for n in given.split(",") if n]
    for field, value in (
        ("backoffLimit", _number(backoff_limit)),
        ("condaEnv", conda_env),
        ("gpuEnv", gpu_env),
    ):
        if value is not None:
            spec[field] = value
    metadata: dict[str, Any] = {"name": name or _generated_name(), "namespace": where}
    if labels:
        metadata["labels"] = _pairs("-l", [p for given in labels for p in given.split(",")])
    new = _validated(
        {"apiVersion": kinds.API_VERSION, "kind": "Job", "metadata": metadata, "spec": spec}
    )
    database = db.Database.open(db_url)
    created = _create(database, new, generated=name is None)
    print(f"{created.ref()} created", file=sys.stderr if attach else sys.stdout, flush=True)
    if attach:
        raise SystemExit(
            _attach(database, where, created.name, created.metadata.uid, from_node=from_node)
        )


def _generated_name() -> str:
    return "run-" + "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))


def _create(database: db.Database, new: job.Job, generated: bool) -> job.Job:
    """Create the Job; a generated name that is, rarely, taken is drawn again."""
    from gctl.store import store

    for tries_left in (2, 1, 0):

        def create(writer: store.Store, obj: job.Job = new) -> job.Job:
            return writer.create(obj)

        try:
            return store.transact(database, create)
        except errors.AlreadyExists:
            if not generated:
                raise errors.AlreadyExists(
                    f'job "{new.name}" already exists in namespace "{new.namespace}"'
                ) from None
            if not tries_left:
                raise
        renamed = new.metadata.model_copy(update={"name": _generated_name()})
        new = new.model_copy(update={"metadata": renamed})
    raise AssertionError("unreachable")


def _number(text: str | None) -> int | float | str | None:
    """A number from the command line; anything else goes on for the model to refuse."""
    if text is None:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _placement(node: str | None, gpu_ids: str | None) -> dict[str, Any]:
    """spec.placement from --node (one, or `a,b,c`: the nodes it may use) and --gpu-ids
    (`0,1`, `0-3`), as srun's --nodelist and the GPU lists of the schedulers gctl replaces pin
    a job."""
    from gctl.api import selection

    placement: dict[str, Any] = {}
    if node is not None:
        listed = [name for name in node.split(",") if name]
        if len(listed) > 1:
            placement["nodes"] = listed
        else:
            placement["node"] = node
    if gpu_ids is not None:
        try:
            placement["gpus"] = selection.expand_indices([gpu_ids])
        except ValueError as exc:
            raise errors.Invalid(f"--gpu-ids {gpu_ids!r}: {exc}") from None
    return placement


def _pairs(flag: str, given: list[str]) -> dict[str, str]:
    pairs = {}
    for item in given:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise errors.Invalid(f"{flag} {item!r}: use KEY=VALUE")
        pairs[key] = value
    return pairs


def _validated(document: dict[str, Any]) -> job.Job:
    """The same validation as apply; the message names the Job and the field."""
    from gctl.api import job, manifest

    # JSON is YAML; DEL is the one character JSON leaves raw that YAML refuses.
    text = json.dumps(document).replace("\x7f", "\\u007f")
    try:
        (parsed,) = manifest.parse(_SOURCE, text)
    except errors.Invalid as exc:
        raise errors.Invalid(_SOURCE_PREFIX.sub(r"\1: ", str(exc))) from None
    assert isinstance(parsed.obj, job.Job)
    return parsed.obj


@dataclass(frozen=True)
class _Step:
    """What an attached `run` does next: stream `attempt`, or end as the finished Job did."""

    attempt: binding.Binding | None = None
    phase: str = ""
    exit_code: int | None = None
    message: str = ""


def _next_step(shown: int) -> Callable[[following.View], _Step | None]:
    """An attempt after `shown` to stream, else the Job's end, else keep waiting."""

    def decide(view: following.View) -> _Step | None:
        for attempt in view.attempts:
            if attempt.spec.attempt > shown and following.started(attempt):
                return _Step(attempt)
        if view.job is None:
            raise errors.NotFound(f"job {view.name} was deleted")
        status = view.job.status
        if status.phase in following.FINISHED:
            return _Step(None, status.phase, status.exit_code, status.message or "")
        return None

    return decide


def _attach(
    database: db.Database,
    namespace: str,
    name: str,
    uid: str | None,
    *,
    from_node: bool = False,
) -> int:
    """Stream each attempt's output as it starts, from this machine or through its node's
    agent; return the exit code the Job ends with."""
    from gctl.store import notify

    stop = notify.Stop()
    shown = 0
    try:
        with following.interruptible(stop):
            view = following.read_view(database, namespace, name, uid)
            while True:
                step, view = following.await_view(database, view, _next_step(shown), stop)
                if step.attempt is None:
                    return _exit_code(name, step)
                if step.attempt.status.log_path is not None:
                    try:
                        following.show(
                            database, step.attempt, view.revision, True, stop, from_node=from_node
                        )
                    except errors.GctlError as exc:  # its node's agent: silent, lost, refused
                        _unanswered(exc)
                shown = step.attempt.spec.attempt
    except following.Interrupted:
        return _stop_attached(database, namespace, name, uid)


def _unanswered(exc: Exception) -> None:
    """An attempt whose output could not be had (its node does not answer, the attempt was
    lost, the request was refused or dropped): the wait goes on for the next attempt or the
    Job's end (Ctrl-C still deletes the Job), and the command still ends with the Job's exit
    code."""
    print(f"{exc}; waiting for the job to end", file=sys.stderr, flush=True)


def _exit_code(name: str, finished: _Step) -> int:
    if finished.phase == "Succeeded":
        return 0
    print(f"job.gctl/{name} failed: {finished.message}", file=sys.stderr)
    return finished.exit_code or 1


def _stop_attached(database: db.Database, namespace: str, name: str, uid: str | None) -> int:
    """Ctrl-C while attached: delete the Job, which stops its process, and wait until it is
    gone; a second Ctrl-C stops waiting."""
    from gctl.api import job
    from gctl.store import feed, notify, store

    revision = following.read_view(database, namespace, name, uid).revision
    try:
        _, gone = store.transact(
            database, lambda writer: writer.delete(job.Job, name, namespace, uid=uid)
        )
    except (errors.NotFound, errors.Conflict):  # gone already, or replaced
        gone = True
    print(f"interrupted: job.gctl/{name} deleted, stopping its process", file=sys.stderr)
    if gone:
        return following.INTERRUPTED
    stop = notify.Stop()
    with following.interruptible(stop), feed.Watch(database, since=revision, stop=stop) as changes:
        for batch in changes:
            if any(c.uid == uid and c.type == "DELETED" for c in batch):
                break
    return following.INTERRUPTED
