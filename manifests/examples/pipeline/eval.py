"""Step 3: the merged model's mean squared error on held-out data, into eval.txt."""

import common

w, b = common.read_model(common.work() / "merged.txt")
held_out = common.data(seed=1000)
mse = sum((w * x + b - y) ** 2 for x, y in held_out) / len(held_out)
(common.work() / "eval.txt").write_text(f"mse={mse:.5f}\n")
print(f"mse={mse:.5f}")
