"""A stand-in for training: read one TOML config, write what it would train to --out."""

import argparse
import tomllib
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--config", required=True)
parser.add_argument("--out", required=True)
args = parser.parse_args()
config = tomllib.loads(Path(args.config).read_text())
out = Path(args.out)
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(f"trained {config['name']}: hidden={config['hidden']} lr={config['lr']}\n")
print(out.read_text().strip())
