"""A multi-node Job's attempts against a real database, one step at a time, with a fixed clock:
its members bound together, Running once all run, stopped together when one ends badly, and
the member that ended first deciding how the attempt ended."""

from datetime import UTC, datetime, timedelta

from controller import jobs, nodes, placement, scheduling, writing
from gctl.api import binding, job, node
from gctl.store import db, store
from nodeagent import heartbeat
from tests.builders import make_job, put_ready_node, report_attempt, stored

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LATER = T0 + timedelta(seconds=30)


def _bound_gang(
    database: db.Database, name: str, where: list[tuple[str, tuple[int, ...]]], **spec: object
) -> None:
    """Nodes and a Job on len(where) nodes, its first attempt bound as the scheduler binds it
    (one Binding per member, `writing.members_of`), the Job Scheduled."""
    built = make_job(name).gpus(len(where[0][1]))
    built.spec["resources"]["nodes"] = len(where)
    built.spec.update(spec)
    with database.write() as session:
        writer = store.Store(session)
        for node_name, gpus in where:
            put_ready_node(writer, node_name, max(gpus) + 1, T0)
        j = writer.create(built.build())
        request = placement.Request("default", name, gpus=len(where[0][1]), nodes=len(where))
        decided = placement.Placement(request, *where[0], 1.0, members=tuple(where[1:]))
        members = writing.members_of(
            j, 1, decided, placement.Pool(), addresses={where[0][0]: "host-a"}
        )
        writer.create_many(members)
        j.status.phase, j.status.attempts = "Scheduled", 1
        j.status.node, j.status.nodes = where[0][0], [n for n, _ in where]
        j.metadata.finalizers = [job.FINALIZER]
        writer.update(j)
        writer.update_status(j)


def _reconcile(database: db.Database, name: str, now: datetime = LATER) -> None:
    store.transact(database, lambda w: jobs.reconcile(w, "default", name, now))


def _job(database: db.Database, name: str) -> job.Job:
    return stored(database, job.Job, name)


def _member(database: db.Database, name: str) -> binding.Binding:
    return stored(database, binding.Binding, name)


def _events(database: db.Database, name: str) -> list[str]:
    with database.read() as session:
        found = store.Store(session).events_for(_job(database, name))
    return [f"{e.spec.reason}: {e.spec.message}" for e in found]


TWO = [("n1", (0, 1)), ("n2", (0, 1))]


def test_members_are_named_by_rank_and_told_where_rank_0_listens(database: db.Database) -> None:
    _bound_gang(database, "ddp", TWO)
    first, second = _member(database, "ddp-1"), _member(database, "ddp-1-r1")
    assert (first.spec.rank, first.spec.node, second.spec.rank, second.spec.node) == (
        0,
        "n1",
        1,
        "n2",
    )
    for member in (first, second):
        assert member.spec.members == ["n1", "n2"]
        assert member.spec.master_addr == "host-a"
        assert member.spec.master_port == binding.master_port(member.spec.job_uid)
    assert 29500 <= (first.spec.master_port or 0) < 30500


def test_running_once_every_member_runs_and_succeeded_once_every_member_did(
    database: db.Database,
) -> None:
    _bound_gang(database, "ddp", TWO)
    report_attempt(database, "ddp-1", "Running", T0)
    _reconcile(database, "ddp")
    assert _job(database, "ddp").status.phase == "Scheduled"  # rank 1 has not started
    report_attempt(database, "ddp-1-r1", "Running", T0 + timedelta(seconds=1))
    _reconcile(database, "ddp")
    running = _job(database, "ddp")
    assert (running.status.phase, running.status.start_time) == ("Running", T0)
    assert "Started: attempt 1 started on n1, n2" in _events(database, "ddp")
    report_attempt(database, "ddp-1-r1", "Exited", T0, exit_code=0)
    _reconcile(database, "ddp")  # rank 0 still runs: nobody is stopped
    assert _job(database, "ddp").status.phase == "Running"
    assert _member(database, "ddp-1").spec.stop_reason is None
    report_attempt(database, "ddp-1", "Exited", T0, exit_code=0)
    _reconcile(database, "ddp")
    done = _job(database, "ddp")
    assert (done.status.phase, done.status.exit_code) == ("Succeeded", 0)


def test_a_failed_member_stops_the_others_and_fails_the_attempt(database: db.Database) -> None:
    _bound_gang(database, "ddp", [*TWO, ("n3", (0, 1))])
    for name in ("ddp-1", "ddp-1-r1", "ddp-1-r2"):
        report_attempt(database, name, "Running", T0)
    _reconcile(database, "ddp")
    report_attempt(database, "ddp-1-r2", "Exited", T0, exit_code=3)
    _reconcile(database, "ddp")
    assert _member(database, "ddp-1").spec.stop_reason == binding.STOP_MEMBER_ENDED
    assert _member(database, "ddp-1-r1").spec.stop_reason == binding.STOP_MEMBER_ENDED
    assert _job(database, "ddp").status.phase == "Running"  # until they have stopped
    report_attempt(database, "ddp-1", "Exited", T0, exit_code=143)
    _reconcile(database, "ddp")
    assert _job(database, "ddp").status.phase == "Running"
    report_attempt(database, "ddp-1-r1", "Exited", T0, exit_code=143)
    _reconcile(database, "ddp")
    failed = _job(database, "ddp")
    assert (failed.status.phase, failed.status.reason, failed.status.exit_code) == (
        "Failed",
        job.REASON_BACKOFF_LIMIT,
        3,
    )
    assert failed.status.message == (
        "attempt 1 failed: rank 2 on n3: exit code 3; backoffLimit 0 reached"
    )


def test_a_failed_member_with_retries_left_backs_the_whole_job_off(database: db.Database) -> None:
    _bound_gang(database, "ddp", TWO, backoffLimit=2)
    report_attempt(database, "ddp-1", "Running", T0)
    report_attempt(database, "ddp-1-r1", "Exited", T0, exit_code=1)
    _reconcile(database, "ddp")
    report_attempt(database, "ddp-1", "Exited", T0, exit_code=143)
    _reconcile(database, "ddp")
    waiting = _job(database, "ddp")
    assert (waiting.status.phase, waiting.status.reason, waiting.status.failed) == (
        "Pending",
        job.REASON_BACKOFF,
        1,
    )
    assert (waiting.status.node, waiting.status.nodes) == (None, None)


def test_a_preempted_member_requeues_the_job_without_a_failure(database: db.Database) -> None:
    _bound_gang(database, "ddp", TWO)
    for name in ("ddp-1", "ddp-1-r1"):
        report_attempt(database, name, "Running", T0)
    with database.write() as session:
        writer = store.Store(session)
        victim = writer.get(binding.Binding, "ddp-1-r1", "default")
        victim.spec.stop_reason = binding.STOP_PREEMPTED
        writer.update(victim)
    report_attempt(database, "ddp-1-r1", "Exited", T0, exit_code=143)
    _reconcile(database, "ddp")
    assert _member(database, "ddp-1").spec.stop_reason == binding.STOP_MEMBER_ENDED
    report_attempt(database, "ddp-1", "Exited", T0, exit_code=143)
    _reconcile(database, "ddp")
    requeued = _job(database, "ddp")
    assert (requeued.status.phase, requeued.status.reason) == ("Pending", job.REASON_PREEMPTED)
    assert (requeued.status.failed, requeued.status.preemptions) == (0, 1)
    assert "on n2 was preempted" in (requeued.status.message or "")


def test_a_member_lost_with_its_node_requeues_the_job(database: db.Database) -> None:
    _bound_gang(database, "ddp", TWO)
    for name in ("ddp-1", "ddp-1-r1"):
        report_attempt(database, name, "Running", T0)
    with database.write() as session:
        store.Store(session).delete(node.Node, "n2")
    seen: nodes.Seen = {}
    store.transact(database, lambda w: nodes.reconcile(w, "n2", T0, timedelta(seconds=40), seen))
    assert _member(database, "ddp-1-r1").status.phase == "Lost"
    _reconcile(database, "ddp")
    assert _member(database, "ddp-1").spec.stop_reason == binding.STOP_MEMBER_ENDED
    report_attempt(database, "ddp-1", "Exited", T0, exit_code=143)
    _reconcile(database, "ddp")
    requeued = _job(database, "ddp")
    assert (requeued.status.phase, requeued.status.reason) == (
        "Pending",
        job.REASON_ATTEMPT_LOST,
    )
    assert requeued.status.failed == 0


def test_deleting_the_job_stops_every_member_then_removes_them(database: db.Database) -> None:
    _bound_gang(database, "ddp", TWO)
    for name in ("ddp-1", "ddp-1-r1"):
        report_attempt(database, name, "Running", T0)
    with database.write() as session:
        store.Store(session).delete(job.Job, "ddp", "default")
    _reconcile(database, "ddp")
    for name in ("ddp-1", "ddp-1-r1"):
        assert _member(database, name).spec.stop_reason == binding.STOP_DELETED
        report_attempt(database, name, "Exited", T0, exit_code=143)
    _reconcile(database, "ddp")
    with database.read() as session:
        reader = store.Store(session)
        assert reader.find(job.Job, "ddp", "default") is None
        assert reader.list_objects(binding.Binding, "default") == []


def test_a_member_deleted_by_hand_stops_the_rest_and_requeues(database: db.Database) -> None:
    _bound_gang(database, "ddp", TWO)
    report_attempt(database, "ddp-1", "Running", T0)
    with database.write() as session:
        store.Store(session).delete(binding.Binding, "ddp-1-r1", "default")
    _reconcile(database, "ddp")
    assert _member(database, "ddp-1").spec.stop_reason == binding.STOP_MEMBER_ENDED
    report_attempt(database, "ddp-1", "Exited", T0, exit_code=143)
    _reconcile(database, "ddp")
    requeued = _job(database, "ddp")
    assert (requeued.status.phase, requeued.status.reason) == (
        "Pending",
        job.REASON_ATTEMPT_LOST,
    )


def test_past_its_deadline_every_member_is_stopped(database: db.Database) -> None:
    _bound_gang(database, "ddp", TWO, activeDeadlineSeconds=10)
    for name in ("ddp-1", "ddp-1-r1"):
        report_attempt(database, name, "Running", T0)
    _reconcile(database, "ddp", now=T0 + timedelta(seconds=5))
    assert _member(database, "ddp-1").spec.stop_reason is None
    _reconcile(database, "ddp", now=T0 + timedelta(seconds=11))
    for name in ("ddp-1", "ddp-1-r1"):
        assert _member(database, name).spec.stop_reason == binding.STOP_DEADLINE
        report_attempt(database, name, "Exited", T0, exit_code=143)
    _reconcile(database, "ddp", now=T0 + timedelta(seconds=12))
    ended = _job(database, "ddp")
    assert (ended.status.phase, ended.status.reason) == ("Failed", job.REASON_DEADLINE)


def test_a_rerun_stops_every_member_then_runs_the_job_again(database: db.Database) -> None:
    _bound_gang(database, "ddp", TWO)
    for name in ("ddp-1", "ddp-1-r1"):
        report_attempt(database, name, "Running", T0)
    with database.write() as session:
        writer = store.Store(session)
        j = writer.get(job.Job, "ddp", "default")
        j.metadata.annotations[job.ANNOTATION_RERUN] = "token-1"
        writer.update(j)
    _reconcile(database, "ddp")
    for name in ("ddp-1", "ddp-1-r1"):
        assert _member(database, name).spec.stop_reason == binding.STOP_RERUN
        report_attempt(database, name, "Exited", T0, exit_code=143)
    _reconcile(database, "ddp")
    again = _job(database, "ddp")
    assert (again.status.phase, again.status.reason, again.status.rerun) == (
        "Pending",
        job.REASON_RERUN,
        "token-1",
    )
    assert again.status.failed == 0


def test_suspending_stops_every_member_and_requeues(database: db.Database) -> None:
    _bound_gang(database, "ddp", TWO)
    for name in ("ddp-1", "ddp-1-r1"):
        report_attempt(database, name, "Running", T0)
    with database.write() as session:
        writer = store.Store(session)
        j = writer.get(job.Job, "ddp", "default")
        j.spec.suspend = True
        writer.update(j)
    _reconcile(database, "ddp")
    for name in ("ddp-1", "ddp-1-r1"):
        assert _member(database, name).spec.stop_reason == binding.STOP_SUSPENDED
        report_attempt(database, name, "Exited", T0, exit_code=143)
    _reconcile(database, "ddp")
    held = _job(database, "ddp")
    assert (held.status.phase, held.status.reason, held.status.failed) == (
        "Pending",
        "Suspended",
        0,
    )


def test_a_job_bound_ahead_behind_a_member_waits_for_that_member(
    database: db.Database,
) -> None:
    """A Job bound ahead behind the member on n2 (rank 1) names that member's Binding in its
    `after`, not rank 0's on n1 (so its agent on n2 waits for the member there)."""
    gang = make_job("ddp").gpus(1)
    gang.spec["resources"]["nodes"] = 2
    with database.write() as session:
        writer = store.Store(session)
        for name in ("n1", "n2"):
            put_ready_node(writer, name, 1, T0)
        writer.create(gang.build())
        writer.create(make_job("next").on("n2").build())
    store.transact(database, lambda w: scheduling.schedule(w, T0))
    store.transact(database, lambda w: scheduling.schedule(w, T0))  # binding ahead follows
    member = _member(database, "ddp-1-r1")
    assert member.spec.node == "n2"
    follower = _member(database, "next-1")
    assert (follower.spec.node, follower.spec.after) == ("n2", [member.metadata.uid])


def test_members_that_ended_before_the_controller_looked_are_told_started(
    database: db.Database,
) -> None:
    _bound_gang(database, "ddp", TWO)
    for name in ("ddp-1", "ddp-1-r1"):
        report_attempt(database, name, "Exited", T0, exit_code=0)
    _reconcile(database, "ddp")
    assert _job(database, "ddp").status.phase == "Succeeded"
    assert "Started: attempt 1 started on n1, n2" in _events(database, "ddp")


def _schedule(database: db.Database) -> None:
    store.transact(database, lambda w: scheduling.schedule(w, T0))


def _said(database: db.Database, name: str) -> tuple[str, str]:
    """The reason and message of a waiting Job's Scheduled=False condition."""
    said = next(
        c for c in _job(database, name).status.conditions if c.type == job.CONDITION_SCHEDULED
    )
    assert said.status == "False"
    return said.reason, said.message


def test_a_multi_node_job_preempts_on_two_nodes_and_is_bound_once_both_exited(
    database: db.Database,
) -> None:
    with database.write() as session:
        writer = store.Store(session)
        for name in ("n1", "n2"):
            put_ready_node(writer, name, 2, T0)
        writer.create(make_job("low1").gpus(2).on("n1").build())
        writer.create(make_job("low2").gpus(2).on("n2").build())
    _schedule(database)
    for name in ("low1-1", "low2-1"):
        report_attempt(database, name, "Running", T0)
    built = make_job("ddp").gpus(2).priority(10)
    built.spec["resources"]["nodes"] = 2
    with database.write() as session:
        store.Store(session).create(built.build())
    _schedule(database)
    for name, node_name in (("low1", "n1"), ("low2", "n2")):
        assert _member(database, f"{name}-1").spec.stop_reason == binding.STOP_PREEMPTED
        assert (
            f"Preempted: preempted by default/ddp (priority 10) to free GPUs [0,1] on {node_name}"
            in _events(database, name)
        )
    preempting = "preempting 2 lower-priority job(s) on n1, n2: default/low1, default/low2"
    assert f"Preempting: {preempting}" in _events(database, "ddp")
    assert _said(database, "ddp") == ("Unschedulable", preempting)

    report_attempt(database, "low1-1", "Exited", T0, exit_code=143)
    _reconcile(database, "low1", T0)
    assert _job(database, "low1").status.phase == "Pending"  # requeued, n1 held for ddp
    _schedule(database)
    assert _said(database, "ddp")[1] == (
        "waiting for 1 preempted job(s) to stop on n2 (GPUs held for this Job)"
    )
    assert [e for e in _events(database, "ddp") if e.startswith("Preempting")] == [
        f"Preempting: {preempting}"
    ]
    assert _job(database, "low1").status.phase == "Pending"

    report_attempt(database, "low2-1", "Exited", T0, exit_code=143)
    _reconcile(database, "low2", T0)
    _schedule(database)
    bound = _job(database, "ddp")
    assert (bound.status.phase, bound.status.nodes) == ("Scheduled", ["n1", "n2"])
    assert (_member(database, "ddp-1").spec.node, _member(database, "ddp-1-r1").spec.node) == (
        "n1",
        "n2",
    )
    for name in ("low1", "low2"):
        low = _job(database, name)
        assert (low.status.preemptions, low.status.failed) == (1, 0)


def _ended(database: db.Database, name: str, **status: object) -> None:
    """What the agent writes of a member that ended: exactly these status fields."""
    with database.write() as session:
        writer = store.Store(session)
        member = writer.get(binding.Binding, name, "default")
        for field, value in status.items():
            setattr(member.status, field, value)
        writer.update_status(member)


def test_a_member_that_exited_0_before_a_stop_landed_leaves_the_others_running(
    database: db.Database,
) -> None:
    """A stop asked for after the member's process had exited on its own (its agent reports
    `Completed`, not the stop's reason) does not count, as for one node: the others go on,
    rather than being stopped and the Job called Succeeded with rank 0 cut short."""
    _bound_gang(database, "ddp", TWO)
    for name in ("ddp-1", "ddp-1-r1"):
        report_attempt(database, name, "Running", T0)
    _reconcile(database, "ddp")
    with database.write() as session:
        writer = store.Store(session)
        late = writer.get(binding.Binding, "ddp-1-r1", "default")
        late.spec.stop_reason = binding.STOP_PREEMPTED
        writer.update(late)
    _ended(database, "ddp-1-r1", phase="Exited", exit_code=0, reason="Completed", finish_time=T0)
    _reconcile(database, "ddp")
    assert _member(database, "ddp-1").spec.stop_reason is None
    assert _job(database, "ddp").status.phase == "Running"


def test_a_member_lost_without_a_message_says_so_not_exit_code_none(
    database: db.Database,
) -> None:
    _bound_gang(database, "ddp", TWO)
    for name in ("ddp-1", "ddp-1-r1"):
        report_attempt(database, name, "Running", T0)
    _ended(database, "ddp-1-r1", phase="Lost", reason=binding.REASON_LOST, finish_time=T0)
    _reconcile(database, "ddp")
    report_attempt(database, "ddp-1", "Exited", T0, exit_code=143)
    _reconcile(database, "ddp")
    requeued = _job(database, "ddp")
    assert requeued.status.message == (
        "attempt 1 on n2 was lost: rank 1: it ended without an exit record; retrying"
    )


def test_a_member_lost_with_its_node_decides_even_after_another_failed(
    database: db.Database,
) -> None:
    """n1 dies; rank 1 on n2 loses rank 0 and exits 1 at once; n1 is declared lost a node
    timeout later. The attempt was lost, not failed: requeued without spending backoffLimit."""
    _bound_gang(database, "ddp", TWO)
    for name in ("ddp-1", "ddp-1-r1"):
        report_attempt(database, name, "Running", T0)
    _ended(database, "ddp-1-r1", phase="Exited", exit_code=1, reason="Error", finish_time=T0)
    _reconcile(database, "ddp")
    with database.write() as session:
        store.Store(session).delete(node.Node, "n1")
    seen: nodes.Seen = {}
    later = T0 + timedelta(seconds=40)
    store.transact(database, lambda w: nodes.reconcile(w, "n1", later, timedelta(seconds=40), seen))
    assert _member(database, "ddp-1").status.phase == "Lost"
    _reconcile(database, "ddp", now=later)
    requeued = _job(database, "ddp")
    assert (requeued.status.phase, requeued.status.reason, requeued.status.failed) == (
        "Pending",
        job.REASON_ATTEMPT_LOST,
        0,
    )
    assert (requeued.status.message or "").startswith("attempt 1 was lost with node n1: rank 0")


def test_rank_0_listens_at_the_address_its_agent_reports(database: db.Database) -> None:
    """`agent run --address`: where other nodes reach a node (its hostname may not resolve
    on them) is its members' MASTER_ADDR; without one, its hostname."""
    for name, address in (("n1", "10.0.0.7"), ("n2", None)):
        heartbeat.beat(database, name, {}, [_gpu(0)], T0, address=address)
    gang = make_job("ddp").gpus(1)
    gang.spec["resources"]["nodes"] = 2
    gang.spec["placement"] = {"nodes": ["n1", "n2"]}
    with database.write() as session:
        store.Store(session).create(gang.build())
    store.transact(database, lambda w: scheduling.schedule(w, T0))
    first = _member(database, "ddp-1")
    assert (first.spec.node, first.spec.master_addr) == ("n1", "10.0.0.7")
    assert stored(database, node.Node, "n2").status.address is None


def _gpu(index: int) -> node.GPUInfo:
    return node.GPUInfo(index=index, uuid=f"GPU-{index}", model="A100", memory_total=80 * 2**30)
