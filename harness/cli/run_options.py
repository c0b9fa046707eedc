"""The options of ``harness run``, in groups by what they are for (``--help`` shows each
default). Building them imports nothing heavy."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.argtypes import judges as judges_arg
from harness.argtypes import positive_float as _positive_float
from harness.argtypes import positive_int as _positive_int
from harness.argtypes import probability as _share
from harness.argtypes import workers as workers_arg
from harness.cli.gates import add_gate_args
from harness.cli.limit_flags import add_limit_args
from harness.client import DEFAULT_REQUEST_TIMEOUT

DEMO_HELP = (
    "index_k=fp8 against bf16, 48 sessions, the simulator's fault odds x6 and its latencies /4 "
    "(under a minute on two cores); other flags still apply"
)


def add_run_command_args(run: argparse.ArgumentParser) -> None:
    """Every flag of ``harness run``."""
    add_run_args(run)
    add_limit_args(run)
    _add_shard_args(run)
    add_gate_args(run)
    add_trace_args(run)


def run_defaults() -> dict[str, Any]:
    """Every ``harness run`` flag with its default (a resumed run's saved flags go over
    them: the run.json of an earlier version may lack later flags)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_run_command_args(parser)
    return vars(parser.parse_args([]))


def add_run_args(run: argparse.ArgumentParser) -> None:
    w = run.add_argument_group("workload: what each session does")
    w.add_argument(
        "--demo",
        action="store_true",
        help="a short run that shows corruption on the simulator: " + DEMO_HELP,
    )
    w.add_argument(
        "--scenario",
        type=Path,
        metavar="FILE",
        help="workload TOML (default: scenarios/coding_agent.toml)",
    )
    w.add_argument(
        "--sessions",
        type=_positive_int,
        metavar="N",
        help="sessions per variant (default: the scenario's)",
    )
    w.add_argument(
        "--turns",
        type=_positive_int,
        metavar="N",
        help="max turns per session (default: the scenario's)",
    )
    w.add_argument(
        "--max-context",
        type=_positive_int,
        metavar="TOKENS",
        help="end a session once its prompt has this many tokens (default: the scenario's)",
    )
    w.add_argument(
        "--seed", type=int, default=1, metavar="N", help="seeds the sessions and the simulator"
    )

    v = run.add_argument_group("variants and servers")
    v.add_argument(
        "--ab",
        action="append",
        default=[],
        metavar="FACTOR=L1,L2",
        help="a factor and its levels; repeat for a matrix (the first level is the baseline)",
    )
    v.add_argument(
        "--target",
        type=Path,
        metavar="FILE",
        help="target file: how each factor level becomes a server (launch, endpoint or hook "
        "mode; default: scenarios/targets/sim.toml, the simulator)",
    )
    v.add_argument(
        "--target-var",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a [vars] entry of the target file; repeatable",
    )
    v.add_argument("--endpoint", metavar="URL", help="base URL of one server already up (no --ab)")
    v.add_argument(
        "--ready-timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="wait this long for a server to become ready, a closed port too (default: a "
        "server already up 10s, a closed port said after 2s; one started: the target "
        "file's [ready] timeout_s)",
    )
    v.add_argument(
        "--dialect",
        metavar="auto|NAME",
        help="the tool-call dialect the model writes (default: the scenario's; 'auto' in the "
        "shipped ones: decided from the served model's name, else settled by the first turn "
        "with markup; the names are in docs/dialects.md)",
    )
    v.add_argument("--model", help="model name sent in requests (default: the target's)")
    v.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        metavar="NAME",
        help="environment variable holding the API key (sent as a bearer token)",
    )
    v.add_argument(
        "--repeats",
        type=_positive_int,
        default=1,
        metavar="R",
        help="run each variant this many times, interleaved (ABAB...)",
    )
    v.add_argument(
        "--order", choices=("abab", "abba"), default="abab", help="how repeats interleave"
    )
    v.add_argument(
        "--speed",
        type=_positive_float,
        default=None,
        metavar="X",
        help="simulator only: divide its latencies by this factor (default: 1)",
    )
    v.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (variants, order, commands, URLs) and start nothing",
    )
    v.add_argument(
        "--detect",
        metavar="RATE:BASELINE[:DEFF]",
        help="with --dry-run: the turns and sessions a variant needs to tell a turn corruption "
        "rate of RATE from BASELINE (e.g. 0.0003:0.0001), at 80%% power; DEFF: the turn "
        "design effect an earlier run's report gave (default 1: turns independent)",
    )

    load = run.add_argument_group("load and requests")
    load.add_argument(
        "--concurrency",
        type=_positive_int,
        metavar="N",
        help="requests in flight at most (default: --sessions)",
    )
    load.add_argument(
        "--workers",
        type=workers_arg,
        metavar="N|auto",
        help="processes driving each variant's sessions, each with its own event loop and "
        "client (default: auto: one per core from 256 requests in flight on, one below)",
    )
    load.add_argument(
        "--judges",
        type=judges_arg,
        metavar="N|auto",
        help="processes classifying the answers, off the event loop that times the requests "
        "(default: auto: one per usable core, shared by the --workers; 0: on the event loop)",
    )
    load.add_argument("--no-stream", action="store_true", help="send non-streamed requests")
    load.add_argument(
        "--on-corruption",
        choices=("retry", "stop"),
        default="retry",
        help="re-send a corrupted turn (keeps the load) or end its session",
    )
    load.add_argument(
        "--request-timeout",
        type=_positive_float,
        default=DEFAULT_REQUEST_TIMEOUT,
        metavar="SECONDS",
        help="a request with no byte for this long fails as a timeout",
    )

    ctl = run.add_argument_group("run control")
    ctl.add_argument(
        "--run-timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="stop the whole run after this long (exit code 3)",
    )
    ctl.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue an interrupted run without redoing finished sessions",
    )
    ctl.add_argument(
        "--until-significant",
        action="store_true",
        help="add --sessions more sessions per variant, round after round, until every "
        "comparison with the baseline is decided or --max-sessions is spent",
    )
    ctl.add_argument(
        "--max-sessions",
        type=_positive_int,
        metavar="N",
        help="with --until-significant: the most sessions per variant",
    )

    v.add_argument(
        "--strict-variants",
        action="store_true",
        help="stop (exit 2) when a variant's server does not confirm its levels: a failed "
        "verify rule, or the same reported configuration as a variant that differs in one "
        "factor (default: a warning in the summary and report)",
    )

    out = run.add_argument_group("output and progress")
    out.add_argument("--out", type=Path, metavar="DIR",
                     help="run folder (default: reports/<run-id>)")  # fmt: skip
    out.add_argument("--no-progress", action="store_true", help="no progress display or lines")
    out.add_argument(
        "--progress-interval",
        type=_positive_float,
        default=30.0,
        metavar="SECONDS",
        help="without a terminal (CI logs): a progress line per running variant this often",
    )
    _add_followup_args(run)
    _add_oracle_args(run)


def _add_oracle_args(p: argparse.ArgumentParser) -> None:
    o = p.add_argument_group("exact oracles (see docs/oracles.md)")
    o.add_argument(
        "--oracle",
        action="append",
        choices=("replay", "spec_accept", "kv_canary"),
        default=[],
        help="repeatable. replay: after each variant's load, re-send every send (or "
        "--oracle-sample of them) alone and compare it with the loaded output; exact on a "
        "server in a deterministic mode, at temperature 0 or with a fixed seed "
        "(oracle_replay.jsonl). spec_accept: SGLang's per-request speculative counters "
        "(return_meta_info; needs --no-stream) judged by the accept-length and accept-rate "
        "rules. kv_canary: SGLang's 'kv_canary violation' log lines, tied to the sends in "
        "flight (oracle_alarms.jsonl)",
    )
    o.add_argument(
        "--spec-accept-min-length",
        type=_positive_float,
        default=1.4,
        metavar="TOKENS",
        help="spec_accept: an average accept length below this is an alarm ...",
    )
    o.add_argument(
        "--spec-accept-min-tokens",
        type=int,
        default=128,
        metavar="N",
        help="... when the request generated more than N tokens",
    )
    o.add_argument(
        "--spec-accept-max-rate",
        type=_share,
        default=0.96,
        metavar="SHARE",
        help="spec_accept: an accept rate above this is an alarm (degraded attention)",
    )
    o.add_argument(
        "--server-log",
        type=Path,
        metavar="FILE",
        help="kv_canary with --endpoint: the server's log file to read as the run goes "
        "(a launched server's own log is read without it)",
    )
    o.add_argument(
        "--oracle-sample",
        type=_share,
        default=1.0,
        metavar="SHARE",
        help="with --oracle replay: the share of the sends re-sent alone (seeded)",
    )
    o.add_argument(
        "--oracle-concurrency",
        type=_positive_int,
        default=1,
        metavar="N",
        help="with --oracle replay on a server in a deterministic mode: N sessions' re-sends "
        "at once (each session's in order, one cache flush before them all); a send that "
        "differs is re-sent once more alone before it counts as diverged (docs/oracles.md); "
        "1: one at a time, a flush before each session",
    )
    o.add_argument(
        "--passkeys",
        action="store_true",
        help="plant random ids in early tool results and ask for them back later as a tool "
        "argument; a wrong or missing one is a context failure, checked exactly, beside the "
        "model's own recall measured alone (oracle_passkey.jsonl)",
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
        "--canary",
        action="store_true",
        help="score fixed probe texts teacher-forced (prompt logprobs, no generation) alone "
        "before each variant's load, during it at --canary-rate, and alone after it; "
        "report their KL against the alone scores (canary.jsonl; docs/judge.md)",
    )
    g.add_argument(
        "--canary-rate",
        type=_positive_float,
        default=1.0,
        metavar="PER_S",
        help="canary requests a second during the load (at most 4 at once)",
    )
    add_scoring_api(g, "the server")
    g.add_argument(
        "--judge",
        choices=("auto", "off"),
        default="auto",
        help="auto: after each variant's load the model scores the turns the text detector "
        "flagged, alone and teacher-forced, where the server can score (SGLang, vLLM, "
        "llama.cpp, the simulator); a suspect it confirms counts in the headline rate "
        "(structural + confirmed), the others are reported apart; off: the headline rests on "
        "the text detector alone (structural + suspect)",
    )
    g.add_argument(
        "--judge-sample",
        type=_share,
        default=0.1,
        metavar="SHARE",
        help="the share of the passed turns also scored teacher-forced "
        "(seeded), beside every flagged one (judge.jsonl, judge_nll in turns.jsonl)",
    )
    g.add_argument(
        "--judge-concurrency",
        type=_positive_int,
        default=1,
        metavar="N",
        help="the judge's scores in flight at once on the idle server (the first one alone: a "
        "server that cannot score is told once); a score beside others that the rule could "
        "confirm is scored again alone (docs/judge.md); 1 (the default): one at a time, for "
        "a server whose scores may move with what runs beside them",
    )
    g.add_argument(
        "--reference-sessions",
        type=_positive_int,
        default=0,
        metavar="K",
        help="after each variant's load, run K of its sessions again one at a time and report "
        "how often a loaded tool call differs from the lone one (reference.jsonl)",
    )


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


def add_scoring_api(parser: Any, server: str) -> None:
    """``--scoring-api``: how ``server`` scores a given text (run, merge and classify)."""
    parser.add_argument(
        "--scoring-api",
        choices=("auto", "sglang", "vllm", "llamacpp"),
        default="auto",
        help=f"how {server} scores a given text (auto: from /server_info or /props)",
    )
