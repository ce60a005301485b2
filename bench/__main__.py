"""`make bench`: every benchmark in one run, printed as one table of figures and targets.

SQLite by default; `BENCH_DATABASE_URL=postgres://user@host:port/name` runs the same
benchmarks on PostgreSQL (in a fresh database beside `name`). Each benchmark is also a script
of its own (`python -m bench.hotpath`, `bench.resume`, `bench.page`, `bench.idle`,
`bench.failover`, `bench.workspace`, `bench.warm`, `bench.opencode`, `bench.isolation`,
`bench.scale`, `bench.repository`, `bench.preview`, `bench.search`, `bench.terminal`,
`bench.fork`, `bench.wake`, `bench.first_answer`).

    .venv/bin/python -m bench [--quick]
        [--only hotpath,opencode,resume,page,idle,failover,workspace,warm,isolation,scale,
                repository,preview,search,terminal,fork,wake,first_answer]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys

from .harness import Figure, Site

BENCHMARKS = [
    "hotpath", "opencode", "resume", "page", "idle", "failover", "workspace", "warm",
    "isolation", "scale", "repository", "preview", "search", "terminal", "fork", "wake",
    "first_answer",
]  # fmt: skip


def print_table(database: str, figures: list[Figure]) -> None:
    print(f"\n{'figure':<48} {'measured':>16}  {'target':<24} held  ({database})")
    for f in figures:
        held = "-" if f.held is None else ("yes" if f.held else "NO")
        value = f"{f.value:,.2f} {f.unit}" if f.value < 100 else f"{f.value:,.0f} {f.unit}"
        print(f"{f.name:<48} {value:>16}  {f.target:<24} {held:<4}  {f.detail}")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and sockets")
    parser.add_argument("--only", default=",".join(BENCHMARKS))
    args = parser.parse_args()
    figures: list[Figure] = []
    site = Site()
    try:
        site.setup_django()
        for name in args.only.split(","):
            module = importlib.import_module(f"bench.{name}")
            print(f"running {name} ...", file=sys.stderr, flush=True)
            options = {
                "hotpath": {"rounds": 10 if args.quick else 30},
                "opencode": {"runs": 3 if args.quick else 5},
                "resume": {"runs": 3 if args.quick else 5},
                "page": {"runs": 3 if args.quick else 7},
                "idle": {"sockets": 1000 if args.quick else 10_000},
                "failover": {"rounds": 5 if args.quick else 10},
                "workspace": {"rounds": 3 if args.quick else 7},
                "warm": {"runs": 2 if args.quick else 3},
                "isolation": {"rounds": 6 if args.quick else 15},
                "repository": {"rounds": 3 if args.quick else 5},
                "preview": {"rounds": 50 if args.quick else 200},
                "search": {
                    "events": 20_000 if args.quick else 100_000,
                    "rounds": 5 if args.quick else 20,
                },
                "terminal": {"keystrokes": 100 if args.quick else 300},
                "fork": {"rounds": 3 if args.quick else 5},
                "wake": {"runs": 2 if args.quick else 3},
                "first_answer": {"rounds": 3 if args.quick else 7},
                "scale": {
                    "sessions": 100 if args.quick else 400,
                    "cluster_sessions": 150 if args.quick else 600,
                },
            }[name]
            figures += asyncio.run(module.run(site, **options))
    finally:
        site.close()
    print_table(site.database, figures)


if __name__ == "__main__":
    main()
