"""Which GPUs a GPUPool's selector picks: the one rule the scheduler and `gctl get pools` share.

Plain Python on plain values (no pydantic), so the CLI applies it to listed wire dicts without
validating them. Every criterion given must hold; one left out (None) holds for every GPU.
"""

import fnmatch
import re
from collections.abc import Collection, Iterable, Mapping

_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def expand_indices(items: Iterable[int | str]) -> list[int]:
    """`[0, "2-4", "6,7"]` -> `[0, 2, 3, 4, 6, 7]`; raise ValueError on a malformed item."""
    found: set[int] = set()
    for item in items:
        if isinstance(item, int):
            found.add(item)
            continue
        for part in item.split(","):
            match = _RANGE.match(part)
            if match is None:
                raise ValueError(f"{part.strip()!r} is not a GPU index or a range like 0-3")
            low = int(match.group(1))
            high = int(match.group(2) or low)
            if high < low:
                raise ValueError(f"range {part.strip()!r} runs backwards")
            found.update(range(low, high + 1))
    return sorted(found)


def model_matches(model: str, pattern: str) -> bool:
    """A GPU model against a pattern such as `*A100*`: a glob, in any case."""
    return fnmatch.fnmatchcase(model.lower(), pattern.lower())


def takes_node(
    name: str,
    labels: Mapping[str, str],
    nodes: Collection[str] | None,
    node_labels: Iterable[tuple[str, str]],
) -> bool:
    """Whether a node is one the selector's node names and node labels pick."""
    if nodes is not None and name not in nodes:
        return False
    return all(labels.get(k) == v for k, v in node_labels)


def takes_gpu(index: int, model: str, gpus: Collection[int] | None, gpu_model: str | None) -> bool:
    """Whether a GPU of a picked node is one the selector's indices and model pattern pick."""
    if gpus is not None and index not in gpus:
        return False
    return gpu_model is None or model_matches(model, gpu_model)
