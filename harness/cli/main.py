"""The ``harness`` command: parse, call, print, map errors to exit codes.

Exit codes: 0 all gates passed; 1 a gate failed (``compare``: a significant regression);
2 bad usage or configuration; 3 infrastructure (a server would not start, an endpoint
unreachable); 128 + N when signal N stopped the run (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).
"""

from __future__ import annotations

import argparse
import difflib
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from harness import __version__
from harness.argtypes import DefaultsHelpFormatter
from harness.argtypes import positive_float as _positive_float
from harness.argtypes import positive_int as _positive_int
from harness.cli.bisect import add_bisect_parser, cmd_bisect, split_run_args
from harness.cli.gates import EXIT_USAGE, add_gate_args, print_failure_line
from harness.cli.limit_flags import add_limit_args
from harness.cli.run_options import add_run_command_args, add_scoring_api
from harness.client import DEFAULT_REQUEST_TIMEOUT
from harness.errors import EXIT_SIGINT, EnvironmentFailure, HarnessError


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line that says what to fix (and what was probably meant), not the
    whole usage block."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        hint = did_you_mean(self, message)
        text = f"{self.prog}: error: {message}{hint} (see: {self.prog} --help)"
        sys.stderr.write(text + "\n")
        raise UsageExit(text)


class UsageExit(SystemExit):
    """The exit of a usage error, with its one line (``main`` ends a run's stdout with it)."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_USAGE)
        self.message = message


#: The commands whose last line on stdout is the one-line JSON result.
RESULT_COMMANDS = ("run", "report", "merge")


def _command(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def _options(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string of ``parser`` and of its subcommands."""
    out = list(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += [o for o in _options(sub) if o not in out]
    return out


def did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    """ "; did you mean --sessions?" for a mistyped option or command (difflib)."""
    unknown = re.match(r"unrecognized arguments: (.+)", message)
    if unknown:
        guesses, misplaced = [], []
        known = _options(parser)
        words = unknown.group(1).split()
        argv: list[str] = getattr(parser, "argv", [])
        for i, word in enumerate(argv[1:-1], 1):  # --ab FACTOR LEVELS: the '=' left out
            if argv[i - 1] == "--ab" and "=" not in word and argv[i + 1] in words:
                return (
                    f"; --ab takes FACTOR=LEVELS with '=': did you mean --ab {word}={argv[i + 1]}?"
                )
        for word in words:
            flag = word.split("=", 1)[0]
            if flag in known:  # right name, wrong place (e.g. -v after the command)
                misplaced.append(flag)
            elif flag.startswith("-"):
                guesses += difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        if misplaced:
            return f"; {' '.join(misplaced)} belongs to another place on the command line"
        return f"; did you mean {' '.join(guesses)}?" if guesses else ""
    choice = re.match(r"argument [^:]+: invalid choice: '([^']*)' \(choose from (.+)\)", message)
    if choice:
        options = re.findall(r"'([^']*)'", choice.group(2))
        guesses = difflib.get_close_matches(choice.group(1), options, n=1, cutoff=0.5)
        return f"; did you mean {guesses[0]}?" if guesses else ""
    return ""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="harness",
        description="Concurrency stress-test and corruption detector for LLM inference servers.",
    )
    parser.add_argument("--version", action="version", version=f"harness {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )

    run = sub.add_parser(
        "run",
        help="drive concurrent tool-call sessions and judge every turn",
        description="Drive concurrent multi-turn tool-call sessions against each variant's "
        "server, judge every turn, write the run folder and the report, apply the CI gates.",
    )
    add_run_command_args(run)

    sim = sub.add_parser("sim", help="serve the embedded DeepSeek-V4-like endpoint", add_help=False)
    sim.add_argument("sim_args", nargs=argparse.REMAINDER)

    rep = sub.add_parser("report", help="rebuild summary, plots and report from a run folder")
    rep.add_argument("run_dir", type=Path)
    add_gate_args(rep)

    cmp_ = sub.add_parser("compare", help="compare two runs variant by variant")
    cmp_.add_argument("run_a", type=Path)
    cmp_.add_argument("run_b", type=Path)

    mrg = sub.add_parser(
        "merge", help="make one run folder of the shards of a run (harness run --shard I/K)"
    )
    mrg.add_argument("shard_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    mrg.add_argument("-o", "--out", type=Path, required=True, help="the merged run folder")
    mrg.add_argument(
        "--shards",
        type=_positive_int,
        metavar="K",
        help="how many shards the run has (default: what the shards say); a missing one "
        "fails as infrastructure (exit 3)",
    )
    mrg.add_argument(
        "--judge",
        action="append",
        default=[],
        metavar="[VARIANT=]URL",
        help="score the merged run's flagged turns teacher-forced on this idle server of the "
        "run's model, as a run in one process does after each variant's load (no shard "
        "judges: the healthy reference is the whole variant's); a URL alone serves every "
        "variant, VARIANT=URL one of them (repeat it; e.g. index_k=bf16=http://gpu2:30000); "
        "without it the rates rest on the text detector alone",
    )
    mrg.add_argument(
        "--judge-concurrency",
        type=_positive_int,
        metavar="N",
        help="the judge's scores in flight at once (default: the run's --judge-concurrency)",
    )
    add_scoring_api(mrg, "the --judge server")
    add_gate_args(mrg)

    _add_replay_parser(sub)
    add_trace_parser(sub)
    add_bisect_parser(sub)

    cls = sub.add_parser("classify", help="classify saved outputs (JSONL) without a run")
    cls.add_argument("input", nargs="?", type=Path, help="input JSONL (default: stdin)")
    cls.add_argument("-o", "--output", type=Path, help="output JSONL (default: stdout)")
    cls.add_argument(
        "--dialect",
        default="auto",
        metavar="auto|NAME",
        help='the dialect of lines without a "dialect" of their own (default: auto, the '
        "one whose markup appears)",
    )
    cls.add_argument(
        "--judge",
        metavar="URL",
        help="also score each output teacher-forced on a server of the same model, after its "
        'prompt ("messages" + "tools", else "context"): judge_nll, judge_confirmed; a line '
        'written at "temperature": 0 gets the greedy check too (judge_gap; docs/judge.md)',
    )
    add_scoring_api(cls, "the --judge server")
    return parser


def _add_replay_parser(sub: Any) -> None:
    rp = sub.add_parser(
        "replay",
        help="re-send a recorded request of a run, alone and under load, and count corruption",
    )
    rp.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    rp.add_argument("--session", type=int, required=True, help="session index")
    rp.add_argument("--variant", help="variant label (needed when several recorded the session)")
    rp.add_argument(
        "--repeat", type=int, help="which repeat of the variant (needed when several did)"
    )
    rp.add_argument("--turn", type=int, help="turn to re-send (default: the first corrupted turn)")
    rp.add_argument(
        "--attempt", type=int, help="which send of the turn (default: the first corrupted one)"
    )
    rp.add_argument(
        "--count",
        "--repeat-count",
        dest="count",
        type=_positive_int,
        default=10,
        metavar="N",
        help="sends per condition (default 10)",
    )
    rp.add_argument(
        "--load",
        type=int,
        default=0,
        metavar="C",
        help="also send N times while C other sessions of the run's scenario load the server",
    )
    rp.add_argument(
        "--endpoint",
        help="server to replay against (default: relaunch the variant's server from the "
        "copy of the target file kept in the run folder)",
    )
    rp.add_argument(
        "--target",
        type=Path,
        metavar="FILE",
        help="relaunch the variant's server from this target file instead of the run's copy",
    )
    rp.add_argument(
        "--target-var",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a [vars] entry for the relaunch (needed again for those run.json masks)",
    )
    rp.add_argument("--model", help="model name (default: the one recorded)")
    rp.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="NAME")
    rp.add_argument(
        "--request-timeout",
        type=_positive_float,
        default=DEFAULT_REQUEST_TIMEOUT,
        metavar="SECONDS",
    )
    add_limit_args(rp)


def _command_of(name: str | None) -> Callable[[argparse.Namespace], int] | None:
    """The function of a command, its module loaded now: ``harness --help`` and a mistyped
    flag load none of them."""
    if name == "bisect":
        return cmd_bisect
    if name in ("run", "trace"):
        from harness.cli import run  # lazy: the run stack (numpy; the reason above)

        return run.cmd_run if name == "run" else run.cmd_trace
    from harness.cli import inspection  # lazy: numpy, jsonschema, the run stack (above)

    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "report": inspection.cmd_report,
        "compare": inspection.cmd_compare,
        "merge": inspection.cmd_merge,
        "classify": inspection.cmd_classify,
        "replay": inspection.cmd_replay,
    }
    return commands.get(name or "")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sim"]:
        from harness.sim.main import main as sim_main  # lazy: starlette, uvicorn

        return sim_main(argv[1:])
    parser = build_parser()
    parser.argv = argv  # type: ignore[attr-defined]  # the hints read the command line
    argv, run_args = split_run_args(argv)  # harness bisect ... -- RUN_ARGS
    try:
        args = parser.parse_args(argv)
    except UsageExit as exc:  # CI reads the last line: it says the command failed
        if _command(argv) in RESULT_COMMANDS:
            print_failure_line(None, EXIT_USAGE, exc.message)
        raise
    args.argv = argv  # the command line as typed (run.json, the report)
    if run_args:
        args.run_args = run_args
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        command = _command_of(args.command)
        if command is not None:
            return command(args)
    except HarnessError as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        if args.command in RESULT_COMMANDS:  # CI reads the last line: it says what failed
            print_failure_line(None, exc.exit_code, str(exc))
        return exc.exit_code
    except OSError as exc:  # the harness's own environment (a full disk, a read-only folder)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"harness: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EnvironmentFailure.exit_code
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return EXIT_SIGINT
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE


def add_trace_parser(sub: Any) -> None:
    tr = sub.add_parser("trace", help="recorded traces: convert a request log into a trace")
    tsub = tr.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    conv = tsub.add_parser("convert", help="group a request log (JSONL) into conversations")
    conv.add_argument("log", type=Path, help="request log, one JSON request per line")
    conv.add_argument("-o", "--output", type=Path, help="trace file (default: stdout)")
    cmp_ = tsub.add_parser("compare", help="chat run vs raw run: server parser or model?")
    cmp_.add_argument("chat_run", type=Path)
    cmp_.add_argument("raw_run", type=Path)


if __name__ == "__main__":
    sys.exit(main())
