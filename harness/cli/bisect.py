"""``harness bisect FACTOR --good LEVEL --bad LEVEL -- RUN_ARGS``: which level of a factor
(a release of the engine) first corrupts, or first stops corrupting (harness.run.bisect)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from harness.errors import EXIT_OK, UsageError


def add_bisect_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bisect",
        help="find the first good (or bad) level of a factor: an engine's releases",
        description="Run the levels of FACTOR between --bad and --good down the middle, one "
        "run each (harness run RUN_ARGS --ab FACTOR=LEVEL), until two neighbours differ; a "
        "level is bad when its server dies or its sessions corrupt significantly more than "
        "the good end's. Finished runs in --out are reused. Example: harness bisect llamacpp "
        "--good 0.1.12 --bad 0.1.10 --registry xllamacpp --out reports/bisect -- --target "
        "scenarios/targets/llamacpp_versions.toml --scenario scenarios/kv_churn.toml",
    )
    p.add_argument("factor", help="the factor whose levels are bisected (of the target file)")
    p.add_argument("--good", required=True, metavar="LEVEL", help="a level known to be good")
    p.add_argument("--bad", required=True, metavar="LEVEL", help="a level known to be bad")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--levels", metavar="L1,L2,...", help="the levels in their order (oldest first)"
    )
    where.add_argument(
        "--registry",
        metavar="PACKAGE",
        help="the levels are the release versions of PACKAGE on the package registry",
    )
    p.add_argument("--out", type=Path, help="the bisect's folder (default: reports/bisect-<time>)")
    p.add_argument(
        "--alpha",
        type=float,
        default=0.01,
        help="a level is bad when its sessions corrupt more than the good end's at one-sided "
        "p below this (default 0.01)",
    )
    p.set_defaults(run_args=[])  # after --: the arguments of each harness run (split_run_args)


def split_run_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``harness bisect ... -- RUN_ARGS``: (the bisect's own arguments, each run's)."""
    if argv[:1] != ["bisect"] or "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def cmd_bisect(args: argparse.Namespace) -> int:
    from harness.run.bisect import (  # lazy: pandas (the runs' turns), not for --help
        Bisect,
        between,
        registry_versions,
    )

    run_args = list(args.run_args)
    if "--ab" in run_args or "--out" in run_args:
        raise UsageError("harness bisect sets --ab and --out of each run itself: leave them out")
    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha must be between 0 and 1, got {args.alpha}")
    if args.levels:
        levels = [lv.strip() for lv in args.levels.split(",") if lv.strip()]
    else:
        levels = registry_versions(args.registry)
        for end in (args.good, args.bad):
            if end not in levels:
                raise UsageError(f"{end} is not a release of {args.registry} on the registry")
    order = between(levels, args.good, args.bad)
    out = args.out or Path("reports") / time.strftime("bisect-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    print(f"bisect {args.factor}: {len(order)} levels from bad {order[0]} to good {order[-1]}: "
          f"{', '.join(order)}", file=sys.stderr)  # fmt: skip
    bisect = Bisect(args.factor, out, run_args, alpha=args.alpha,
                    say=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
    last_bad, first_good = bisect.search(order)
    result = bisect.report(last_bad, first_good, order)
    older_bad = levels.index(last_bad) < levels.index(first_good)
    what = (
        f"fixed in {args.factor}={first_good} (the last bad level: {last_bad})"
        if older_bad
        else f"broken in {args.factor}={last_bad} (the last good level: {first_good})"
    )
    runs = sum(1 for r in bisect.results.values() if not r.reused)
    print(f"bisect: {what}; {len(bisect.results)} levels judged, {runs} run now; {out}")
    print(json.dumps({"passed": True, "exit_code": EXIT_OK, **result}, separators=(",", ":")))
    return EXIT_OK
