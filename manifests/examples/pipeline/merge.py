"""Step 2: average the models of every seed into merged.txt."""

import common

models = sorted(common.work().glob("model-*.txt"))
if not models:
    raise SystemExit("no model-*.txt in $WORK: did train run?")
weights = [common.read_model(path) for path in models]
w = sum(m[0] for m in weights) / len(weights)
b = sum(m[1] for m in weights) / len(weights)
(common.work() / "merged.txt").write_text(f"w={w:.4f} b={b:.4f}\n")
# A new merge: an evaluation of an earlier run's no longer holds (a run without eval says so).
(common.work() / "eval.txt").unlink(missing_ok=True)
print(f"merged {len(models)} models: w={w:.4f} b={b:.4f}")
