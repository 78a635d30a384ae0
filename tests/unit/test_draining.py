"""Naming cordon and drain targets, and the Node specs they lead to: pure, no database."""

from collections.abc import Callable

import pytest

from gctl.api import errors, meta, node
from gctl.cli import draining
from gctl.cli.draining import Target


@pytest.mark.parametrize(
    ("words", "node_flag", "targets"),
    [
        (["gpu0"], None, [Target(None, 0)]),
        (["GPU3", "gpu3"], None, [Target(None, 3)]),
        (["gpu1"], "box1", [Target("box1", 1)]),
        (["box2/gpu1", "gpu0"], "box2", [Target("box2", 1), Target("box2", 0)]),
        (["box2/gpu1"], None, [Target("box2", 1)]),
        (["node", "box2", "box3"], None, [Target("box2"), Target("box3")]),
        (["nodes", "box2"], None, [Target("box2")]),
        (["node/box2"], None, [Target("box2")]),
        (["box2"], None, [Target("box2")]),  # kubectl cordon NODE
        (["gpu.lab.example/gpu7"], None, [Target("gpu.lab.example", 7)]),
    ],
)
def test_parse_targets(words: list[str], node_flag: str | None, targets: list[Target]) -> None:
    assert draining.parse_targets("cordon", words, node_flag) == targets


@pytest.mark.parametrize(
    ("words", "node_flag", "says"),
    [
        ([], None, "say what to cordon"),
        (["node"], None, "name the node"),
        (["node", "box1"], "box1", "--node goes with gpuN"),
        (["box2/gpu1"], "box1", "box2/gpu1 is on node box2, but --node says box1"),
        (["box2/mem0"], None, "name a GPU as NODE/gpuN"),
        (["/gpu0"], None, "name a GPU as NODE/gpuN"),
        (["box2"], "box1", "with --node, name GPUs as gpuN"),
    ],
)
def test_parse_targets_refuses(words: list[str], node_flag: str | None, says: str) -> None:
    with pytest.raises(errors.Invalid, match=says.replace("-", r"\-")):
        draining.parse_targets("cordon", words, node_flag)


def _node(name: str, gpus: int = 4) -> node.Node:
    return node.Node(
        metadata=meta.ObjectMeta(name=name),
        status=node.NodeStatus(
            gpus=[node.GPUInfo(index=i, uuid=f"u{i}", model="m") for i in range(gpus)]
        ),
    )


def test_resolve_names_the_only_node() -> None:
    nodes = {"box1": _node("box1")}
    targets = [Target(None, 2), Target("box1", 2), Target("box1")]
    assert draining.resolve(targets, nodes) == [Target("box1", 2), Target("box1")]


@pytest.mark.parametrize(
    ("target", "nodes", "error", "says"),
    [
        (
            Target(None, 0),
            ["b", "a"],
            errors.Invalid,
            "gpu0: several nodes: say a/gpu0 (nodes: a, b)",
        ),
        (Target(None, 0), [], errors.NotFound, "no nodes yet"),
        (Target("c"), ["a", "b"], errors.NotFound, 'node "c" not found (nodes: a, b)'),
        (Target("2"), ["a"], errors.NotFound, "for GPU 2 say gpu2"),
        (Target("a", 4), ["a"], errors.NotFound, 'node "a" has no GPU 4 (its GPUs: 0-3)'),
    ],
)
def test_resolve_refuses(
    target: Target, nodes: list[str], error: type[errors.GctlError], says: str
) -> None:
    with pytest.raises(error) as raised:
        draining.resolve([target], {name: _node(name) for name in nodes})
    assert says in str(raised.value)


def test_a_bare_gpu_among_several_nodes_is_shown_on_a_node_that_has_it() -> None:
    """Nodes of different sizes: the example to copy must name a node with that GPU."""
    nodes = {"a-small": _node("a-small", gpus=2), "b-big": _node("b-big", gpus=8)}
    with pytest.raises(errors.Invalid) as raised:
        draining.resolve([Target(None, 5)], nodes)
    assert str(raised.value) == "gpu5: several nodes: say b-big/gpu5 (nodes: a-small, b-big)"
    with pytest.raises(errors.NotFound) as missing:
        draining.resolve([Target(None, 9)], nodes)
    assert str(missing.value) == "gpu9: no node has GPU 9 (nodes: a-small, b-big)"


def test_resolve_lists_a_few_nodes_only() -> None:
    nodes = {f"n{i:02}": _node(f"n{i:02}") for i in range(20)}
    with pytest.raises(errors.Invalid) as raised:
        draining.resolve([Target(None, 0)], nodes)
    assert str(raised.value).endswith("n05, ...)")


def test_a_node_without_gpus_says_so() -> None:
    with pytest.raises(errors.NotFound, match="it reports no GPUs"):
        draining.resolve([Target("a", 0)], {"a": _node("a", gpus=0)})


def spec(**fields: object) -> node.NodeSpec:
    return node.NodeSpec.model_validate(fields)


@pytest.mark.parametrize(
    ("edit", "before", "gpu", "after"),
    [
        (draining.cordoned, {}, 1, {"cordonedGPUs": [1]}),
        (draining.cordoned, {"cordonedGPUs": [3]}, 1, {"cordonedGPUs": [1, 3]}),
        (draining.cordoned, {"drainingGPUs": [1]}, 1, {"drainingGPUs": [1]}),
        (draining.cordoned, {"unschedulable": True}, 1, {"unschedulable": True}),
        (draining.cordoned, {}, None, {"unschedulable": True}),
        (draining.drained, {"cordonedGPUs": [1, 2]}, 1, {"cordonedGPUs": [2], "drainingGPUs": [1]}),
        (draining.drained, {"draining": True}, 1, {"draining": True}),
        (draining.drained, {}, None, {"unschedulable": True, "draining": True}),
        (
            draining.uncordoned,
            {"cordonedGPUs": [1], "drainingGPUs": [1, 2]},
            1,
            {"drainingGPUs": [2]},
        ),
        (
            draining.uncordoned,
            {"unschedulable": True, "draining": True, "cordonedGPUs": [0]},
            None,
            {"cordonedGPUs": [0]},
        ),
        (draining.uncordoned, {"unschedulable": True}, 1, {"unschedulable": True}),
    ],
)
def test_spec_edits(
    edit: Callable[[node.NodeSpec, int | None], node.NodeSpec],
    before: dict[str, object],
    gpu: int | None,
    after: dict[str, object],
) -> None:
    assert edit(spec(**before), gpu) == spec(**after)


@pytest.mark.parametrize(
    ("indices", "text"),
    [([], ""), ([3], "3"), ([0, 1, 2, 3], "0-3"), ([6, 0, 1, 2, 3, 9, 10], "0-3,6,9-10")],
)
def test_span(indices: list[int], text: str) -> None:
    assert draining.span(indices) == text


def test_target_holds_bindings_on_its_gpu_or_node() -> None:
    bound = {"spec": {"node": "a", "gpus": [1, 2]}}
    cpu_only = {"spec": {"node": "a", "gpus": []}}
    assert Target("a", 2).holds(bound)
    assert not Target("a", 0).holds(bound)
    assert not Target("b", 1).holds(bound)
    assert Target("a").holds(bound)
    assert Target("a").holds(cpu_only)
    assert not Target("a", 0).holds(cpu_only)
