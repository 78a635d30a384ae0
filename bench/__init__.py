"""Benchmarks for gctl's object store and CLI, run as `python -m bench [NAME ...]`.

`bench.store` holds the benchmarks themselves (CLI cold start, applying and listing 10,000 Jobs,
watch latency), `bench.jobs` those of running jobs under `gctl up`, `bench.scheduler` the
scheduling passes, `bench.scale` the big cluster (virtual nodes, `bench.sim`) and the deep queue,
`bench.throughput` throughput, packing and idle cost, `bench.replay` trace replay (`bench.trace`:
reading traces, the metrics and the lower bound); `bench.__main__` parses the arguments,
prepares a scratch database (a temporary SQLite file, or a throwaway PostgreSQL database with
`--db`), runs them and prints the table.
Timing budgets are reported, not enforced: the exit status is 0 even when one is over budget,
unless `--strict` is given. A benchmark that cannot measure what it claims (a command fails, the
output has the wrong number of lines) is an error and always makes the exit status non-zero.
"""
