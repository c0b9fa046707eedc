"""The ``harness`` command: parse, call, print, map errors to exit codes.

Exit codes: 0 all gates passed; 1 a gate failed (``compare``: a significant regression);
2 bad usage or configuration; 3 infrastructure (a server would not start, an endpoint
unreachable); 128 + N when signal N stopped the run (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, NoReturn

from harness import __version__
from harness.argtypes import positive_float as _positive_float
from harness.argtypes import positive_int as _positive_int
from harness.argtypes import workers as workers_arg
from harness.cli.gates import EXIT_USAGE, add_gate_args, print_failure_line
from harness.cli.inspection import cmd_classify, cmd_compare, cmd_merge, cmd_replay, cmd_report
from harness.client import DEFAULT_REQUEST_TIMEOUT
from harness.errors import HarnessError


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line that says what to fix, not the whole usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


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

    run = sub.add_parser("run", help="drive concurrent tool-call sessions and judge every turn")
    run.add_argument(
        "--scenario", type=Path, help="workload TOML (default: scenarios/coding_agent.toml)"
    )
    run.add_argument(
        "--sessions", type=_positive_int, help="sessions per variant (default: the scenario's)"
    )
    run.add_argument(
        "--concurrency", type=_positive_int, help="requests in flight at most (default: sessions)"
    )
    run.add_argument(
        "--workers",
        type=workers_arg,
        metavar="N|auto",
        help="processes driving each variant's sessions, each with its own event loop and "
        "client (default: auto: one per core from 256 requests in flight on, one below)",
    )
    run.add_argument(
        "--ab",
        action="append",
        default=[],
        metavar="FACTOR=L1,L2",
        help="a factor and its levels; repeat for a matrix (the first level is the baseline)",
    )
    run.add_argument(
        "--target",
        type=Path,
        metavar="FILE",
        help="target file: how each factor level becomes a server (launch, endpoint or hook "
        "mode; default: scenarios/targets/sim.toml, the simulator)",
    )
    run.add_argument(
        "--target-var",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a [vars] entry of the target file; repeatable",
    )
    run.add_argument("--endpoint", help="base URL of one server already up (no --ab)")
    run.add_argument("--model", help="model name sent in requests (default: the target's)")
    run.add_argument(
        "--repeats",
        type=_positive_int,
        default=1,
        help="run each variant this many times, interleaved (ABAB...)",
    )
    run.add_argument(
        "--order", choices=("abab", "abba"), default="abab", help="how repeats interleave"
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (variants, order, commands, URLs) and start nothing",
    )
    run.add_argument(
        "--run-timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="stop the whole run after this long (exit code 3)",
    )
    run.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue an interrupted run without redoing finished sessions",
    )
    run.add_argument(
        "--until-significant",
        action="store_true",
        help="add --sessions more sessions per variant, round after round, until every "
        "comparison with the baseline is decided or --max-sessions is spent",
    )
    run.add_argument(
        "--max-sessions",
        type=_positive_int,
        metavar="N",
        help="with --until-significant: the most sessions per variant",
    )
    run.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        metavar="NAME",
        help="environment variable holding the API key (sent as a bearer token)",
    )
    run.add_argument("--turns", type=_positive_int, help="max turns per session")
    run.add_argument(
        "--max-context",
        type=_positive_int,
        help="end a session once its prompt has this many tokens",
    )
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--out", type=Path, help="run folder (default: reports/<run-id>)")
    run.add_argument("--no-stream", action="store_true", help="send non-streamed requests")
    run.add_argument(
        "--on-corruption",
        choices=("retry", "stop"),
        default="retry",
        help="re-send a corrupted turn (keeps the load) or end its session",
    )
    run.add_argument(
        "--request-timeout",
        type=_positive_float,
        default=DEFAULT_REQUEST_TIMEOUT,
        metavar="SECONDS",
        help="a request with no byte for this long fails as a timeout",
    )
    run.add_argument(
        "--speed",
        type=_positive_float,
        default=None,
        help="simulator only: divide its latencies by this factor",
    )
    run.add_argument("--no-progress", action="store_true", help="no live progress display")
    run.add_argument(
        "--strict-variants",
        action="store_true",
        help="stop (exit 2) when a variant's server does not confirm its levels: a failed "
        "verify rule, or the same reported configuration as a variant that differs in one "
        "factor (default: a warning in the summary and report)",
    )
    _add_followup_args(run)
    _add_shard_args(run)
    add_gate_args(run)
    add_trace_args(run)

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
    add_gate_args(mrg)

    _add_replay_parser(sub)
    add_trace_parser(sub)

    cls = sub.add_parser("classify", help="classify saved outputs (JSONL) without a run")
    cls.add_argument("input", nargs="?", type=Path, help="input JSONL (default: stdin)")
    cls.add_argument("-o", "--output", type=Path, help="output JSONL (default: stdout)")
    return parser


def _add_shard_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("spread over hosts (merged by `harness merge`)")
    g.add_argument(
        "--shard",
        metavar="I/K",
        help="run the I-th of K deterministic slices of every variant's sessions (whole fork "
        "families; the same seed gives every host the same slices), with its share of "
        "--concurrency; gates go to `harness merge`",
    )
    g.add_argument(
        "--start-at",
        metavar="TIME",
        help="with --shard: begin the load at this wall time (unix seconds, or ISO 8601 with "
        "its zone), so the shards start together",
    )


def _add_followup_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("transcripts and lone re-runs (see docs/replay.md)")
    g.add_argument(
        "--keep-transcripts",
        action="store_true",
        help="keep the exact requests of every session in transcripts.jsonl "
        "(corrupted sessions are always kept)",
    )
    g.add_argument(
        "--confirm",
        action="store_true",
        help="after each variant's load, re-send every corrupted turn once alone and mark it "
        "confirmed_under_load (clean alone) or reproduces_alone (confirm.jsonl)",
    )
    g.add_argument(
        "--reference-sessions",
        type=_positive_int,
        default=0,
        metavar="K",
        help="after each variant's load, run K of its sessions again one at a time and report "
        "how often a loaded tool call differs from the lone one (reference.jsonl)",
    )


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
        "run's target file)",
    )
    rp.add_argument("--model", help="model name (default: the one recorded)")
    rp.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="NAME")
    rp.add_argument(
        "--request-timeout",
        type=_positive_float,
        default=DEFAULT_REQUEST_TIMEOUT,
        metavar="SECONDS",
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sim"]:
        from harness.sim.main import main as sim_main

        return sim_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "run":
            from harness.cli.run import cmd_run

            return cmd_run(args)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "compare":
            return cmd_compare(args)
        if args.command == "merge":
            return cmd_merge(args)
        if args.command == "classify":
            return cmd_classify(args)
        if args.command == "replay":
            return cmd_replay(args)
        if args.command == "trace":
            from harness.cli.run import cmd_trace

            return cmd_trace(args)
    except HarnessError as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        if args.command == "run":  # CI reads the last line of a run: it says the run failed
            print_failure_line(None, exc.exit_code, str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE


def add_trace_args(run: argparse.ArgumentParser) -> None:
    """The run flags of recorded traces and raw mode (docs/traces.md)."""
    g = run.add_argument_group("recorded traces and raw mode (see docs/traces.md)")
    g.add_argument(
        "--workload",
        type=Path,
        metavar="FILE.jsonl",
        help="replay recorded conversations (one per line, OpenAI chat format) as the sessions",
    )
    g.add_argument(
        "--workload-mode",
        choices=("replay", "continue"),
        default="replay",
        help="replay: send each recorded request as it was; continue: the live answers make "
        "the history, recorded tool results where the live call matches (default: replay)",
    )
    g.add_argument(
        "--pace",
        choices=("recorded", "fast"),
        default="recorded",
        help="send turns at the recorded offsets, or as fast as the concurrency allows",
    )
    g.add_argument(
        "--api",
        choices=("chat", "completions", "generate"),
        default="chat",
        help="chat: the server parses tool calls; completions (/v1/completions) or generate "
        "(SGLang /generate): the harness renders the prompt and parses the raw output",
    )


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
