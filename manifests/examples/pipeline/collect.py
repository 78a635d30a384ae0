"""Step 4: one report of what the steps before wrote, in report.txt."""

import common

work = common.work()
lines = [f"{path.stem}: {path.read_text().strip()}" for path in sorted(work.glob("model-*.txt"))]
lines.append(f"merged: {(work / 'merged.txt').read_text().strip()}")
evaluated = work / "eval.txt"
lines.append(f"eval: {evaluated.read_text().strip()}" if evaluated.exists() else "eval: skipped")
(work / "report.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
