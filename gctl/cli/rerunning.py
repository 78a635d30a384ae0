"""`gctl rerun job NAME`: ask the controller to run a Job again, in whatever phase it is.

The command only writes a request: a fresh token in the Job's `gctl/rerun` annotation (and the
reason in `gctl/rerun-reason`), through an ordinary metadata update, which does not move the
generation. The Job controller acts on a token it has not seen (`status.rerun` holds the last
one): it stops a running attempt, puts a finished Job back in the queue, and records an Event.
So a rerun survives a controller that is down when it is asked for.
"""

from __future__ import annotations

from datetime import UTC, datetime

from gctl.api import errors, kinds

DEFAULT_REASON = "gctl rerun"


def token(now: datetime) -> str:
    """A fresh rerun token: the UTC time, to the microsecond (`2026-01-01T00:00:00.000001Z`)."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rerun(
    *,
    resource: str,
    names: list[str],
    namespace: str | None,
    reason: str | None,
    db_url: str | None,
) -> None:
    from gctl.api import job
    from gctl.store import db, store

    name = _job_name(resource, names)
    where = namespace or kinds.DEFAULT_NAMESPACE
    database = db.Database.open(db_url, create=False)

    def work(writer: store.Store) -> job.Job:
        found = writer.find(job.Job, name, where)
        if found is None:
            raise errors.NotFound(f'job "{name}" not found in namespace "{where}"')
        if found.metadata.deletion_timestamp is not None:
            raise errors.Forbidden(f'job "{name}" is being deleted: it cannot be rerun')
        annotations = dict(found.metadata.annotations)
        fresh = token(datetime.now(UTC))
        if annotations.get(job.ANNOTATION_RERUN) == fresh:  # two reruns in one microsecond
            fresh += "-1"
        annotations[job.ANNOTATION_RERUN] = fresh
        annotations[job.ANNOTATION_RERUN_REASON] = reason or DEFAULT_REASON
        found.metadata.annotations = annotations
        return writer.update(found)

    updated = store.transact(database, work)
    print(f"{updated.ref()} rerun requested")


def _job_name(resource: str, names: list[str]) -> str:
    """`job NAME` or `job/NAME`: exactly one Job."""
    word, slash, name = resource.partition("/")
    info = kinds.by_word(word)
    if info is not kinds.JOB:
        raise errors.Invalid(f"rerun {resource}: only jobs can be rerun (gctl rerun job NAME)")
    given = ([name] if slash else []) + names
    if len(given) != 1 or not given[0]:
        raise errors.Invalid(f"rerun {resource}: name exactly one job (gctl rerun job NAME)")
    return given[0]
