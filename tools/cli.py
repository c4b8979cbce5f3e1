"""The `arrangedb` command: the demo, the pager's spill demo, and inspecting spill dirs.

One entry point (declared in pyproject.toml) so `make demo` and people debugging a
spill directory on a worker need no Python snippets.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from arrangedb.pager import BudgetExceeded, SpillError, parse_size


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add_spill_demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", type=_size, default="64MiB",
                   help="memory budget, e.g. 64MiB, 1g (default: 64MiB)")
    p.add_argument("--factor", type=_positive_int, default=8,
                   help="data generated, as a multiple of the budget (default: 8)")
    p.add_argument("--spill-dir", default=None,
                   help="spill root (default: $ARRANGEDB_SPILL_DIR, else the temp dir)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="arrangedb", description="arrangedb: a spill-to-disk storage engine for "
                                      "differential-dataflow arrangements")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("demo", help="the end-to-end demo (extra arguments are passed through)",
                   add_help=False)
    _add_spill_demo_args(sub.add_parser(
        "spill-demo", help="write several times the memory budget through page files and "
                           "scan it back, watching RSS"))
    inspect = sub.add_parser("inspect", help="list the versions of a checkpoint directory and "
                                             "the page files of it or of a spill directory, "
                                             "with regions, codecs and checksum status")
    inspect.add_argument("spill_dir", metavar="PATH")
    return parser


def _spill_demo(args) -> int:
    from arrangedb.tools.spill_demo import run

    result = run(budget=args.budget, factor=args.factor, spill_dir=args.spill_dir,
                 out=sys.stderr)
    return 0 if result["within_budget"] else 1


def _demo(rest: list[str]) -> int:
    if importlib.util.find_spec("arrangedb.tools.demo") is not None:
        return importlib.import_module("arrangedb.tools.demo").main(rest) or 0
    fallback = argparse.ArgumentParser(prog="arrangedb demo",
                                       description="(the spill demo stands in for the demo)")
    _add_spill_demo_args(fallback)
    return _spill_demo(fallback.parse_args(rest))


def _inspect(path: str) -> int:
    from arrangedb.tools.inspection import (format_inspect, format_versions, inspect_dir,
                                         inspect_versions)

    versions = inspect_versions(path)
    if versions is not None:
        print(format_versions(versions) + "\n")
    rows = inspect_dir(path)
    print(format_inspect(rows))
    ok = all(r["ok"] for r in rows) and not any("error" in v for v in versions or [])
    return 0 if ok else 1


def main(argv=None) -> int:
    """Run one subcommand; exit status 0 ok, 1 a check failed (corrupt file, RSS over
    bound), 2 a usage or environment error (bad arguments, unusable spill dir)."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "demo":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        if args.command == "demo":
            return _demo(rest)
        if args.command == "spill-demo":
            return _spill_demo(args)
        return _inspect(args.spill_dir)
    except (SpillError, FileNotFoundError, NotADirectoryError) as e:
        print(f"arrangedb {args.command}: {e}", file=sys.stderr)
        return 2
    except BudgetExceeded as e:
        print(f"arrangedb {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\narrangedb {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
