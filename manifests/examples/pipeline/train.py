"""Step 1, once per seed: fit y = w*x + b by gradient descent; write model-<seed>.txt."""

import argparse

import common

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, required=True)
seed = parser.parse_args().seed
w = b = 0.0
points = common.data(seed)
for _ in range(300):
    gw = sum((w * x + b - y) * x for x, y in points) * 2 / len(points)
    gb = sum((w * x + b - y) for x, y in points) * 2 / len(points)
    w, b = w - 0.3 * gw, b - 0.3 * gb
(common.work() / f"model-{seed}.txt").write_text(f"w={w:.4f} b={b:.4f}\n")
print(f"seed {seed}: w={w:.4f} b={b:.4f}")
