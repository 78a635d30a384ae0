"""What the pipeline's steps share: the work directory and a small data set."""

import os
import random
from pathlib import Path


def work() -> Path:
    """$WORK, where each step writes its output and reads the ones before it."""
    path = Path(os.environ.get("WORK", "/tmp/gctl-pipeline"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def data(seed: int, n: int = 200) -> list[tuple[float, float]]:
    """Points on y = 3x + 1 with noise: what "training" fits."""
    rng = random.Random(seed)
    return [(x, 3 * x + 1 + rng.gauss(0, 0.1)) for x in (rng.uniform(-1, 1) for _ in range(n))]


def read_model(path: Path) -> tuple[float, float]:
    fields = dict(line.split("=", 1) for line in path.read_text().split())
    return float(fields["w"]), float(fields["b"])
