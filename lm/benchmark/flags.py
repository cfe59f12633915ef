"""``lm bench``'s flags and command, which ``lm/cli.py`` hands on. Light to import (the command
line builds its parser from it on every start); the battery is imported when it runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def add_overrides(parser: argparse.ArgumentParser, help: str) -> None:
    """``--set KEY=VALUE ...`` into ``overrides``: lm train's, lm compare's and lm bench's."""
    parser.add_argument(
        "--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
        help=help,
    )  # fmt: skip


def add_bench_parser(sub: Any, jobs: Callable[[str], int | str]) -> None:
    """``lm bench`` among the command line's subcommands; ``jobs`` reads ``--jobs``."""
    b = sub.add_parser(
        "bench",
        help="run one position scheme through a fixed battery (the length curve and six tasks) "
        "and write its card against the builtin schemes' references (docs/bench.md)",
    )
    b.add_argument(
        "--position",
        required=True,
        metavar="SPEC",
        help="a builtin scheme (rope, alibi, ...) or one of your own: path/to/file.py:Class or "
        "module:Class",
    )
    add_overrides(b, "override config keys in every benchmark, e.g. --set model.rope_base=500")
    b.add_argument(
        "--quick",
        action="store_true",
        help="1 seed, smaller budgets and no passkey, against the quick references (full: 3 seeds)",
    )
    b.add_argument(
        "--out", help="folder of the runs and the card (default: runs/bench/NAME, NAME-quick)"
    )
    b.add_argument(
        "--jobs",
        type=jobs,
        default=1,
        help="runs trained at once, as lm compare --jobs (default 1; auto: decided on the "
        "length curve's shape)",
    )
    b.add_argument("--quiet", action="store_true", help="no progress bars or notes")


def bench_command(args: argparse.Namespace) -> int:
    from lm.benchmark.run import bench
    from lm.training.optim import without_dynamo_import

    without_dynamo_import()  # the battery's runs may train in this process

    _, markdown = bench(
        args.position, args.overrides, args.quick, args.out, args.jobs, quiet=args.quiet
    )
    print(markdown)
    return 0
