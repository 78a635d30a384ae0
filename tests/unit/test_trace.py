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
        ("job_id,submit_s,duration_s,gpus\n1,0,1,1.5\n", "line 2: gpus '1.5' is neither a"),
        ("job_id,submit_s,duration_s,gpus\n1,0,1e30,1\n", "line 2: duration_s '1e30' is more"),
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


def test_a_trace_may_begin_with_a_byte_order_mark(tmp_path: Path) -> None:
    """As a spreadsheet saves a CSV: its first column is still `job_id`."""
    path = tmp_path / "trace.csv"
    path.write_bytes(b"\xef\xbb\xbf" + TRACE.encode())
    assert [j.job_id for j in trace.read_trace(path)] == ["a", "b", "c", "d", "e"]


def test_a_fraction_of_a_gpu_and_a_year_long_job_are_a_trace(tmp_path: Path) -> None:
    text = "job_id,submit_s,duration_s,gpus\n1,0,31536000,0.5\n2,0,1,3\n"
    jobs = trace.read_trace(write(tmp_path, text))
    assert [(j.duration, j.gpus) for j in jobs] == [(31_536_000.0, 0.5), (1.0, 3.0)]


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "DIR"],
        ["replay", "DIR/absent.txt", "--nodes", "2"],
        ["replay", "--nodes", "2", "DIR"],
    ],
)
def test_bench_replay_of_a_path_that_is_no_trace_says_so(
    tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Not read as the name of a benchmark, nor its flags as the suite's: the replay's one
    line names the path and what is wrong with it."""
    from bench import __main__ as suite

    argv = [arg.replace("DIR", str(tmp_path)) for arg in argv]
    assert suite.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"bench replay: {tmp_path}")
    assert "Is a directory" in err or "No such file" in err


def test_the_suites_replay_entry_is_still_a_benchmark_name() -> None:
    from bench import __main__ as suite

    assert not suite.is_replay(["replay"])
    assert not suite.is_replay(["replay", "packing-200", "--db", "postgresql://x/y", "--json"])
    assert suite.is_replay(["replay", "t.csv"])
    assert suite.is_replay(["replay", "--help"])


@pytest.mark.parametrize("scale", ["inf", "nan", "1e-12", "0", "-1"])
def test_bench_replay_takes_the_time_scales_the_virtual_agent_takes(
    tmp_path: Path, scale: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import replay

    path = write(tmp_path, TRACE)
    with pytest.raises(SystemExit) as exited:
        replay.parse_args([str(path), "--time-scale", scale])
    assert exited.value.code == 2
    assert "--time-scale: give a finite number of at least 1e-09" in capsys.readouterr().err
    assert replay.parse_args([str(path), "--time-scale", "1e-9"]).time_scale == 1e-9


def test_jobs_larger_than_a_node_are_clipped_or_skipped(tmp_path: Path) -> None:
    jobs = trace.read_trace(write(tmp_path, TRACE))
    clipped, count, left_out = trace.fit(jobs, 2, "clip")
    assert (count, left_out) == (1, 0)
    assert [j.gpus for j in clipped] == [1, 2, 2, 1, 1]
    skipped, count, left_out = trace.fit(jobs, 2, "skip")
    assert (count, left_out, [j.job_id for j in skipped]) == (1, 1, ["a", "b", "d", "e"])


def test_jobs_larger_than_a_node_span_as_few_nodes_as_hold_them() -> None:
    """n = ceil(G / per node) nodes, ceil(G / n) whole GPUs on each; more nodes than the
    cluster has: left out, and counted."""
    asks = {"small": 8, "16": 16, "12": 12, "20": 20, "fraction": 8.5, "24": 24, "64": 64}
    jobs = [trace.TraceJob(name, 0, 10, gpus) for name, gpus in asks.items()]
    spanned, count, left_out = trace.fit(jobs, 8, "span", nodes=3)
    assert (count, left_out) == (6, 1)  # 64 GPUs would need 8 nodes; 24 fits on 3
    shapes = {j.job_id: (j.nodes, j.gpus) for j in spanned}
    assert shapes == {
        "small": (1, 8),
        "16": (2, 8),
        "12": (2, 6),
        "20": (3, 7),  # 21 GPUs: as even as whole GPUs go
        "fraction": (2, 5),
        "24": (3, 8),
    }
    assert [j.total_gpus for j in spanned] == [8, 16, 12, 21, 10, 24]


def test_lower_bound_takes_the_larger_of_the_two_bounds(tmp_path: Path) -> None:
    jobs = trace.read_trace(write(tmp_path, TRACE))
    # Work: 10 + 40 + 40 + 5 + 10 = 105 GPU-seconds on 4 GPUs from t=0: 26.25 s, more than
    # any submit + duration (b: 20 s, e: 22 s) or any later suffix (e alone: 12 + 2.5).
    assert trace.lower_bound(jobs, 4) == 26.25
    # On 100 GPUs the work spreads out and the longest path wins: e ends at 12 + 10.
    assert trace.lower_bound(jobs, 100) == 22
    # One GPU: 20 GPU-seconds in all, but e cannot end before 12 + 10.
    assert trace.lower_bound([jobs[0], jobs[4]], 1) == 22


def test_the_lower_bound_counts_every_gpu_of_a_multi_node_job() -> None:
    # 2 nodes x 4 GPUs for 10 s and 4 GPUs for 10 s: 120 GPU-seconds on 8 GPUs take 15 s
    # (counting the multi-node job's 4 GPUs once would give 10). Both can only run one after
    # the other on 2 x 4 GPUs, 20 s, so 15 is a bound that holds.
    jobs = [trace.TraceJob("g", 0, 10, 4, nodes=2), trace.TraceJob("a", 0, 10, 4)]
    assert trace.lower_bound(jobs, 8) == 15
    assert trace.fifo_makespan(jobs, nodes=2, gpus_per_node=4) == 20


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

    def reserved(start: float, spare: dict[int, float]) -> trace.Reservation:
        return trace.Reservation(start, spare)  # {node: GPUs to spare on it then}

    assert trace._soonest_start(4, free, running, now=5) == reserved(20, {1: 0})
    assert trace._soonest_start(2, free, running, now=5) == reserved(5, {1: 0})  # node 1 now
    assert trace._soonest_start(1, free, running, now=5) == reserved(5, {1: 1})  # most free
    assert trace._soonest_start(2, [1.0, 0.0], running, now=5) == reserved(20, {1: 0})


def test_a_multi_node_reservation_starts_when_its_last_node_frees() -> None:
    """n nodes: the n that have the GPUs free soonest, from when the n-th does; each node's
    spare GPUs are what is free on it then, so a node that freed early spares what ended
    since."""
    # Node 0: 1 free, 1 GPU ends at 30 and 2 at 50. Node 1: 2 free, 2 end at 20. Node 2: none
    # free, 4 end at 40.
    running = [(50.0, 0, 2.0), (30.0, 0, 1.0), (20.0, 1, 2.0), (40.0, 2, 4.0)]
    free = [1.0, 2.0, 0.0]
    # 2 GPUs on each of 2 nodes: node 1 has them now, node 0 at 30, node 2 at 40. At 30 node 1
    # has 4 free (its 2 ended at 20): 2 to spare; node 0 has 2: none.
    assert trace._soonest_start(2, free, running, now=5, nodes=2) == trace.Reservation(
        30, {1: 2, 0: 0}
    )
    # On all 3: from 40, when node 2's 4 free; node 0 still has 2 free then (its 2 end at 50).
    assert trace._soonest_start(2, free, running, now=5, nodes=3) == trace.Reservation(
        40, {1: 2, 0: 0, 2: 2}
    )
    # 4 on each of 2: node 1 at 20, node 2 at 40 (node 0 only at 50).
    assert trace._soonest_start(4, free, running, now=5, nodes=2) == trace.Reservation(
        40, {1: 0, 2: 0}
    )


def test_the_easy_reference_lets_a_long_job_use_the_gpus_the_reserved_one_will_not_need() -> None:
    jobs = [
        trace.TraceJob("a", 0, 100, 4),
        trace.TraceJob("b", 0, 10, 6),  # waits for a: reserves the node from 100, 2 to spare
        trace.TraceJob("d", 0, 1000, 2),  # outlasts 100, but on those 2: it starts at once
    ]
    assert trace.easy_makespan(jobs, nodes=1, gpus_per_node=8) == 1000


def test_the_fifo_reference_starts_a_multi_node_job_on_distinct_nodes_all_at_once() -> None:
    jobs = [
        trace.TraceJob("a", 0, 10, 2),  # on node 0 until 10
        trace.TraceJob("g", 1, 10, 4, nodes=2),  # 4 on each of 2 nodes: only node 1 has them
        trace.TraceJob("b", 2, 5, 2),  # backfills beside a, 2-7
        trace.TraceJob("c", 12, 1, 1),  # g holds every GPU of both nodes until 20
    ]
    # g starts at 10, when a ends, on both nodes, and holds both until 20; c runs 20-21.
    # (On one node, g would run 1-11 and c 12-13.)
    assert trace.fifo_makespan(jobs, nodes=2, gpus_per_node=4) == 21


def test_a_multi_node_job_takes_the_fullest_nodes_that_have_its_gpus() -> None:
    jobs = [
        trace.TraceJob("x", 0, 100, 1),  # node 0: 3 free
        trace.TraceJob("g", 1, 10, 2, nodes=2),  # nodes 0 and 1: node 2 stays whole
        trace.TraceJob("y", 2, 100, 4),  # so y starts at once on node 2, 2-102
    ]
    assert trace.fifo_makespan(jobs, nodes=3, gpus_per_node=4) == 102  # on 1 and 2: y 11-111
    assert trace.easy_makespan(jobs, nodes=3, gpus_per_node=4) == 102


def test_the_easy_reference_reserves_every_node_of_a_multi_node_job() -> None:
    jobs = [
        trace.TraceJob("a", 0, 10, 4),  # node 0 until 10
        trace.TraceJob("b", 0, 20, 4),  # node 1 until 20
        trace.TraceJob("g", 1, 10, 4, nodes=2),  # reserves nodes 2 (free) and 0 from 10
        trace.TraceJob("c", 2, 30, 2),  # would hold node 2 past 10: waits
        trace.TraceJob("d", 3, 5, 2),  # ends by 10: backfills on node 2, 3-8
    ]
    # g runs 10-20 on nodes 0 and 2; c waits for a node with 2 free: 20-50. Without the
    # reservation on node 2, c runs 2-32 there and g waits for nodes 0 and 1: 20-30.
    assert trace.easy_makespan(jobs, nodes=3, gpus_per_node=4) == 50
    assert trace.fifo_makespan(jobs, nodes=3, gpus_per_node=4) == 32


def test_the_easy_reference_spares_gpus_on_each_reserved_node() -> None:
    jobs = [
        trace.TraceJob("a", 0, 10, 2),  # node 0, 2 of 4 until 10
        trace.TraceJob("b", 0, 10, 4),  # node 1 until 10
        trace.TraceJob("g", 1, 5, 3, nodes=2),  # from 10 on both: 1 GPU to spare on each
        trace.TraceJob("d", 2, 100, 1),  # outlasts 10, but on node 0's spare GPU: 2-102
        trace.TraceJob("e", 3, 90, 1),  # node 0 has 1 free but none to spare: waits
    ]
    # g 10-15 on both nodes, e beside it on node 1 from 10 to 100, d ends at 102. Without
    # node 0's spare GPU, d would wait for g too and end at 110.
    assert trace.easy_makespan(jobs, nodes=2, gpus_per_node=4) == 102


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


def test_replay_json_has_null_for_a_ratio_to_a_lower_bound_of_zero() -> None:
    """JSON has no NaN: every job of no duration makes the ratio 0 / 0."""
    import json

    from bench import replay

    metrics = trace.Metrics(
        jobs=1,
        makespan=0.0,
        lower_bound=0.0,
        jct_mean=0.0,
        jct_p95=0.0,
        queueing_mean=0.0,
        queueing_p95=0.0,
        utilization=0.0,
    )
    figures = replay.report(metrics)
    assert figures["makespan_over_bound"] is None
    assert figures["fifo_reference_makespan_s"] is None  # not worked out here: NaN
    assert json.loads(json.dumps(figures, allow_nan=False))["makespan_s"] == 0.0
