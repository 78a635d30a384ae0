"""First-fit placement over plain snapshots: no database, no processes."""

import pytest

from controller import placement
from controller.placement import GPU, Request, Snapshot, Usage

GI = 2**30


def cluster(*nodes: tuple[str, int, str, int]) -> Snapshot:
    """nodes: (name, gpu count, model, memory in GiB)."""
    gpus = [
        GPU(name, i, model, memory * GI)
        for name, count, model, memory in nodes
        for i in range(count)
    ]
    return Snapshot(gpus=gpus, nodes=[n[0] for n in nodes])


def req(name: str, gpus: float, **extra: object) -> Request:
    return Request("default", name, gpus, **extra)  # type: ignore[arg-type]


def where(placed: list[placement.Placement]) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {p.request.name: (p.node, p.gpus) for p in placed}


def test_whole_gpus_stay_on_one_node() -> None:
    snapshot = cluster(("a", 2, "A100", 80), ("b", 4, "A100", 80))
    placed = placement.place(snapshot, [req("big", 3), req("two", 2), req("one", 1)])
    assert where(placed) == {"big": ("b", (0, 1, 2)), "two": ("a", (0, 1)), "one": ("b", (3,))}


def test_nothing_fits_when_no_node_has_enough() -> None:
    assert (
        placement.place(cluster(("a", 2, "A100", 80), ("b", 2, "A100", 80)), [req("big", 3)]) == []
    )


def test_fractions_share_a_gpu_up_to_one() -> None:
    snapshot = cluster(("a", 1, "A100", 80))
    placed = placement.place(snapshot, [req("h1", 0.5), req("h2", 0.5), req("h3", 0.5)])
    assert where(placed) == {"h1": ("a", (0,)), "h2": ("a", (0,))}
    assert snapshot.usage[("a", 0)] == Usage(share=1.0, jobs=2)


def test_thirds_fit_despite_rounding() -> None:
    placed = placement.place(cluster(("a", 1, "A100", 80)), [req(f"t{i}", 1 / 3) for i in range(3)])
    assert len(placed) == 3


def test_whole_gpu_does_not_take_a_shared_one_and_fraction_skips_a_full_one() -> None:
    snapshot = cluster(("a", 2, "A100", 80))
    snapshot.usage[("a", 0)] = Usage(share=0.25, jobs=1)
    placed = placement.place(snapshot, [req("whole", 1), req("quarter", 0.5)])
    assert where(placed) == {"whole": ("a", (1,)), "quarter": ("a", (0,))}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"node": "b"}, ("b", (0,))),
        ({"pinned": (1,)}, ("a", (1,))),
        ({"node": "b", "pinned": (1,)}, ("b", (1,))),
        ({"gpu_model": "*h100*"}, ("b", (0,))),
        ({"gpu_model": "A100"}, ("a", (0,))),
        ({"gpu_memory": 60 * GI}, ("b", (0,))),
        ({"gpu_memory": 100 * GI}, None),
        ({"node": "nowhere"}, None),
    ],
)
def test_constraints(
    extra: dict[str, object], expected: tuple[str, tuple[int, ...]] | None
) -> None:
    snapshot = cluster(("a", 2, "A100", 40), ("b", 2, "NVIDIA H100 80GB HBM3", 80))
    placed = placement.place(snapshot, [req("j", 1, **extra)])
    assert (where(placed).get("j")) == expected


def test_cpu_only_jobs_need_a_node_but_no_gpu() -> None:
    snapshot = cluster(("a", 1, "A100", 80))
    snapshot.usage[("a", 0)] = Usage(share=1.0, jobs=1)
    (placed,) = placement.place(snapshot, [req("collect", 0)])
    assert (placed.node, placed.gpus, placed.share) == ("a", (), 0.0)
    assert placement.place(Snapshot(gpus=[], nodes=[]), [req("collect", 0)]) == []


def test_queue_order_is_respected_but_a_blocked_job_does_not_block_others() -> None:
    snapshot = cluster(("a", 2, "A100", 80))
    placed = placement.place(snapshot, [req("first", 1), req("huge", 4), req("second", 1)])
    assert [p.request.name for p in placed] == ["first", "second"]
