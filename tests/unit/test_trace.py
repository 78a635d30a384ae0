"""Reading job traces and the replay's metrics, on a hand-made five-job trace (bench.trace)."""

from pathlib import Path

import pytest

from bench import trace

TRACE = """\
job_id,submit_s,duration_s,gpus,vc
d,10,5,1,x
a,0,10,1,x
b,0,20,2,y
c,5,10,4,x
e,12,10,1,z
"""
# What happened to each job on 4 GPUs: (submit, start, finish, gpus).
RUNS = {
    "a": (0, 0, 10, 1),
    "b": (0, 0, 20, 2),
    "c": (5, 22, 32, 4),  # waits for 4 free GPUs
    "d": (10, 10, 15, 1),
    "e": (12, 12, 22, 1),
}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_reads_jobs_in_submission_order_and_ignores_other_columns(tmp_path: Path) -> None:
    jobs = trace.read_trace(write(tmp_path, TRACE))
    assert [j.job_id for j in jobs] == ["a", "b", "c", "d", "e"]
    assert jobs[2] == trace.TraceJob("c", 5.0, 10.0, 4.0)
    assert [j.job_id for j in trace.read_trace(write(tmp_path, TRACE), limit=2)] == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("job_id,submit_s,gpus\n1,0,1\n", "missing column 'duration_s'"),
        ("job_id,submit_s,duration_s,gpus\n1,0,ten,1\n", "line 2: duration_s 'ten' is not"),
        ("job_id,submit_s,duration_s,gpus\n1,-5,1,1\n", "line 2: submit_s '-5' must be 0"),
        ("job_id,submit_s,duration_s,gpus\n1,0,1,0\n", "line 2: gpus must be above 0"),
    ],
)
def test_a_bad_trace_is_one_line_naming_the_row_and_field(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(trace.TraceError, match=message):
        trace.read_trace(write(tmp_path, text))


def test_a_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(trace.TraceError, match="No such file"):
        trace.read_trace(tmp_path / "absent.csv")


def test_jobs_larger_than_a_node_are_clipped_or_skipped(tmp_path: Path) -> None:
    jobs = trace.read_trace(write(tmp_path, TRACE))
    clipped, count = trace.fit(jobs, 2, "clip")
    assert count == 1
    assert [j.gpus for j in clipped] == [1, 2, 2, 1, 1]
    skipped, count = trace.fit(jobs, 2, "skip")
    assert (count, [j.job_id for j in skipped]) == (1, ["a", "b", "d", "e"])


def test_lower_bound_takes_the_larger_of_the_two_bounds(tmp_path: Path) -> None:
    jobs = trace.read_trace(write(tmp_path, TRACE))
    # Work: 10 + 40 + 40 + 5 + 10 = 105 GPU-seconds on 4 GPUs from t=0: 26.25 s, more than
    # any submit + duration (b: 20 s, e: 22 s) or any later suffix (e alone: 12 + 2.5).
    assert trace.lower_bound(jobs, 4) == 26.25
    # On 100 GPUs the work spreads out and the longest path wins: e ends at 12 + 10.
    assert trace.lower_bound(jobs, 100) == 22
    # One GPU: 20 GPU-seconds in all, but e cannot end before 12 + 10.
    assert trace.lower_bound([jobs[0], jobs[4]], 1) == 22


def test_metrics_of_a_known_schedule() -> None:
    records = [trace.Record(s, b, f, g) for s, b, f, g in RUNS.values()]
    result = trace.metrics(records, total_gpus=4, bound=26.25)
    assert result.jobs == 5
    assert result.makespan == 32
    assert result.jct_mean == pytest.approx((10 + 20 + 27 + 5 + 10) / 5)
    assert result.jct_p95 == 27
    assert result.queueing_mean == pytest.approx(17 / 5)
    assert result.queueing_p95 == 17
    assert result.utilization == pytest.approx(105 / (4 * 32))
    assert result.ratio == pytest.approx(32 / 26.25)


def test_the_makespan_counts_from_when_the_submissions_began() -> None:
    """A replay creates its first Job a moment after it began submitting; the bound counts
    from the first submission as scheduled, so the makespan must too."""
    records = [trace.Record(s + 0.2, b + 0.2, f + 0.2, g) for s, b, f, g in RUNS.values()]
    assert trace.metrics(records, total_gpus=4, bound=26.25).makespan == pytest.approx(32)
    assert trace.metrics(records, 4, 26.25, start=0.0).makespan == pytest.approx(32.2)


def test_the_fifo_reference_backfills_and_packs_nodes(tmp_path: Path) -> None:
    jobs = trace.read_trace(write(tmp_path, TRACE))
    # One node of 4 GPUs: a and b start at 0 (3 GPUs); c (4) waits for both; d and e backfill
    # meanwhile (d at 10 when a ends, e at 12 beside it), so c starts at 22 when e ends: 32.
    assert trace.fifo_makespan(jobs, nodes=1, gpus_per_node=4) == 32
    # Two nodes of 4: c fits on the second one at once: the longest path, b, ends at 20 and
    # e (submitted at 12, 10 s) at 22.
    assert trace.fifo_makespan(jobs, nodes=2, gpus_per_node=4) == 22


def test_the_easy_reference_holds_the_reserved_node_for_the_first_job_that_waits(
    tmp_path: Path,
) -> None:
    jobs = trace.read_trace(write(tmp_path, TRACE))
    # One node of 4 GPUs: c (4 GPUs, at 5) reserves the node for 20, when b ends. d (5 s, at
    # 10) ends by then and backfills; e (10 s, at 12) would end at 22 and waits behind c,
    # which runs 20-30: e runs 30-40. FIFO started c at 22, after e.
    assert trace.easy_makespan(jobs, nodes=1, gpus_per_node=4) == 40
    # Two nodes: c starts at once on the second, and nothing is reserved.
    assert trace.easy_makespan(jobs, nodes=2, gpus_per_node=4) == 22


def test_the_easy_reservation_is_where_the_job_could_start_soonest() -> None:
    # Node 0: 1 GPU free, a job of 2 GPUs ends at 50 and one of 1 GPU at 30. Node 1: 2 free,
    # a job of 2 GPUs ends at 20. Running: (finish, node, gpus).
    running = [(50.0, 0, 2.0), (30.0, 0, 1.0), (20.0, 1, 2.0)]
    free = [1.0, 2.0]
    # (start, node, GPUs to spare on it then)
    assert trace._soonest_start(4, free, running, now=5) == (20, 1, 0)
    assert trace._soonest_start(2, free, running, now=5) == (5, 1, 0)  # fits node 1 now
    assert trace._soonest_start(1, free, running, now=5) == (5, 1, 1)  # both now: most free
    assert trace._soonest_start(2, [1.0, 0.0], running, now=5) == (20, 1, 0)  # 30 on node 0


def test_the_easy_reference_lets_a_long_job_use_the_gpus_the_reserved_one_will_not_need() -> None:
    jobs = [
        trace.TraceJob("a", 0, 100, 4),
        trace.TraceJob("b", 0, 10, 6),  # waits for a: reserves the node from 100, 2 to spare
        trace.TraceJob("d", 0, 1000, 2),  # outlasts 100, but on those 2: it starts at once
    ]
    assert trace.easy_makespan(jobs, nodes=1, gpus_per_node=8) == 1000


def test_the_longest_first_reference_starts_the_longest_waiting_job_first() -> None:
    jobs = [
        trace.TraceJob("a", 0, 10, 1),  # holds the one GPU until 10; then b, c and d wait
        trace.TraceJob("b", 1, 5, 1),
        trace.TraceJob("c", 2, 5, 1),
        trace.TraceJob("d", 3, 50, 1),
    ]
    # Oldest first: b 10-15, c 15-20, d 20-70. Longest first: d 10-60, then b and c: 70 too,
    # on one GPU; with two GPUs the long job starting first is what counts.
    assert trace.easy_makespan(jobs, nodes=1, gpus_per_node=1) == 70
    assert trace.longest_first_makespan(jobs, nodes=1, gpus_per_node=1) == 70
    two = [trace.TraceJob("x", 0, 10, 2), *jobs[1:]]  # x holds both GPUs until 10
    assert trace.easy_makespan(two, nodes=1, gpus_per_node=2) == 65  # b, c 10-15, d 15-65
    assert trace.longest_first_makespan(two, nodes=1, gpus_per_node=2) == 60  # d 10-60


def test_replay_table_names_every_makespan_whole(capsys: pytest.CaptureFixture[str]) -> None:
    """Each reference makespan's label is printed whole ("ideal LongestFirst's" lost its noun),
    and the figures stay in one column."""
    from bench import replay

    metrics = trace.Metrics(
        jobs=3,
        makespan=7300.0,
        lower_bound=7260.0,
        jct_mean=4000.0,
        jct_p95=7200.0,
        queueing_mean=1800.0,
        queueing_p95=4500.0,
        utilization=0.78,
        fifo_makespan=7260.0,
        easy_makespan=7260.0,
        longest_first_makespan=7260.0,
    )
    replay.print_table(metrics)
    lines = capsys.readouterr().out.splitlines()
    labels = [line.split("  ")[0] for line in lines]
    for name in ("FIFO", "EASY", "LongestFirst"):
        assert f"ideal {name}'s makespan" in labels
    assert len({len(line) for line in lines[:-2]}) == 1  # header and the seconds rows align
