"""The flags of the bounds of one response (docs/faults.md): past one, the turn is
``too_large`` or ``timeout``, with what arrived kept."""

from __future__ import annotations

import argparse

from harness.argtypes import positive_float, positive_int
from harness.client.response_limits import Limits


def add_limit_args(parser: argparse.ArgumentParser) -> None:
    p = parser.add_argument_group("response limits (see docs/faults.md)")
    p.add_argument(
        "--total-timeout",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="a request that takes longer than this in all fails as a timeout "
        "(default: the larger of 4 x --request-timeout and 600)",
    )
    for name, default, text in (
        ("max_answer_bytes", Limits.max_answer_bytes, "read at most this much of one answer"),
        ("max_line_bytes", Limits.max_line_bytes, "the longest line of a stream read"),
    ):
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=positive_int,
            default=default,
            metavar="N",
            help=f"{text} (default {default})",
        )


def limits_from(args: argparse.Namespace) -> Limits:
    """The ``Limits`` of a command line parsed with ``add_limit_args``."""
    return Limits(
        max_answer_bytes=args.max_answer_bytes,
        max_line_bytes=args.max_line_bytes,
        total_timeout_s=args.total_timeout,
    )
