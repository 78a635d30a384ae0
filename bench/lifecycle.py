"""The least CPU a Job's durable lifecycle costs in gctl's object model, for throughput-1000.

Jobs already stored go through what every Job of throughput-1000 goes through, written
through the Store and nothing else: the scheduler's bind (a Binding made, the Job Scheduled,
an Event), the agent's start (the Binding Running), the Job Running (an Event), the agent's
exit record (the Binding Exited) and the Job Succeeded (an Event): seven object writes and
three Events, each step one committed transaction over a round of Jobs, as the controller
and the agent batch them (8: one per GPU of throughput-1000; or all at once). No planning, no
processes, no waiting: what remains is the cost of the records alone, the floor under any
design of the controller and the agent that keeps every state change durable.
"""

import time
from collections.abc import Callable
from datetime import UTC, datetime

from gctl.api import binding, job, meta
from gctl.store import db, events, store

SOURCE = "bench/lifecycle"


def cpu_ms_per_job(url: str, jobs: int, per_round: int) -> float:
    """CPU milliseconds (this process) per Job, in rounds of `per_round` Jobs."""
    database = db.Database.open(url)
    try:
        prefix = f"r{per_round}-"
        with database.write() as session:
            store.Store(session).create_many([_job(f"{prefix}{i}") for i in range(jobs)])
        start = time.process_time()
        for first in range(0, jobs, per_round):
            names = [f"{prefix}{i}" for i in range(first, min(jobs, first + per_round))]
            for step in STEPS:
                with database.write() as session:
                    step(store.Store(session), names)
        return (time.process_time() - start) * 1000 / jobs
    finally:
        database.close()


def _job(name: str) -> job.Job:
    return job.Job(
        metadata=meta.ObjectMeta(name=name, namespace="default"),
        spec=job.JobSpec(command=["true"]),
    )


def _bind(writer: store.Store, names: list[str]) -> None:
    found = writer.find_many(job.Job, "default", names)
    writer.create_many(
        [
            binding.Binding(
                metadata=meta.ObjectMeta(name=f"{j.name}-1", namespace="default"),
                spec=binding.BindingSpec(
                    job_name=j.name, job_uid=j.metadata.uid or "", attempt=1, node="n1", gpus=[0]
                ),
            )
            for j in found
        ]
    )
    _jobs_to(writer, found, "Scheduled", "Scheduled")


def _binding_to(phase: str) -> Callable[[store.Store, list[str]], None]:
    def step(writer: store.Store, names: list[str]) -> None:
        attempts = writer.find_many(binding.Binding, "default", [f"{n}-1" for n in names])
        with writer.batched():
            for b in attempts:
                b.status.phase = phase  # type: ignore[assignment]
                b.status.start_time = b.status.start_time or datetime.now(UTC)
                b.status.exit_code = 0 if phase == "Exited" else None
                writer.update_status(b)

    return step


def _job_to(phase: str, reason: str) -> Callable[[store.Store, list[str]], None]:
    def step(writer: store.Store, names: list[str]) -> None:
        _jobs_to(writer, writer.find_many(job.Job, "default", names), phase, reason)

    return step


def _jobs_to(writer: store.Store, found: list[job.Job], phase: str, reason: str) -> None:
    with writer.batched():
        for j in found:
            j.status.phase = phase  # type: ignore[assignment]
            writer.update_status(j)
    writer.record_events([events.Occurrence(j, reason, phase, source=SOURCE) for j in found])


STEPS = (
    _bind,
    _binding_to("Running"),
    _job_to("Running", "Started"),
    _binding_to("Exited"),
    _job_to("Succeeded", "Completed"),
)
