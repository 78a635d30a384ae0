"""Memory quantities and GPU counts."""

import pytest

from gctl.api import quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24Gi", 24 * 2**30),
        ("24GiB", 24 * 2**30),
        ("24GB", 24 * 10**9),
        ("24G", 24 * 10**9),
        ("500Mi", 500 * 2**20),
        ("1.5Gi", 3 * 2**29),
        (" 80 Gi ", 80 * 2**30),
        (1024, 1024),
        ("1024", 1024),
    ],
)
def test_parse_bytes(text: object, expected: int) -> None:
    assert quantity.parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("-5Gi", "not a memory quantity"),
        ("12Qi", "not a memory quantity"),
        ("Gi", "not a memory quantity"),
        ("0", "greater than zero"),
        ("0.5", "whole number of bytes"),
        ("2Ti", "more memory than any GPU"),
        (True, "memory quantity"),
        (3.5, "memory quantity"),
    ],
)
def test_parse_bytes_refuses(text: object, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        quantity.parse_bytes(text)


@pytest.mark.parametrize("gpus", [0, 0.25, 0.5, 1, 2, 8])
def test_gpu_counts_accepted(gpus: float) -> None:
    assert quantity.check_gpus(gpus) == gpus


@pytest.mark.parametrize(
    ("gpus", "complaint"), [(-1, "negative"), (1.5, "neither"), (4096, "more than one node")]
)
def test_gpu_counts_refused(gpus: float, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        quantity.check_gpus(gpus)


@pytest.mark.parametrize(
    ("count", "text"), [(24 * 2**30, "24Gi"), (1536 * 2**20, "1.5Gi"), (512, "512")]
)
def test_format_bytes(count: int, text: str) -> None:
    assert quantity.format_bytes(count) == text
