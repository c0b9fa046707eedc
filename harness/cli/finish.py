"""The end of ``harness run``: the exit code, the report, the table and the one-line result.

The exit code says the worst that happened, in this order: a stop signal (128 + its number:
130 Ctrl-C, 143 SIGTERM, 129 SIGHUP), a refused configuration (2), infrastructure (3: a
server that died, stopped answering or could not be judged, the run timeout), a failed gate
(1). The last line on stdout is a JSON object whose ``passed`` is true exactly when the exit
code is 0, with the code, the signal that interrupted the run (or null) and why it failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from harness.cli.gates import apply_gates, print_failure_line, print_replays, report_build
from harness.drive.session import EXHAUSTED
from harness.errors import EXIT_GATE, EXIT_INFRA, EXIT_OK, EXIT_USAGE
from harness.labels import is_corrupted, server_failure
from harness.record import safejson
from harness.record.outcomes import death_line
from harness.record.rundir import SESSIONS_FILE, TURNS_FILE, RunDir
from harness.record.turns import jsonl_rows
from harness.run import stopsignals
from harness.run.execute import VariantOutcome
from harness.run.options import RunOptions

#: A variant with more than this share of transport errors cannot be judged (exit code 3).
MAX_TRANSPORT_ERROR_RATE = 0.5
#: ... nor one with more than this share of its sessions ended with their attempts exhausted.
MAX_EXHAUSTED_SHARE = 0.5


def _interrupted_code(interrupted: str) -> int:
    return stopsignals.exit_code(signal.Signals[interrupted])


def _died_line(outcome: VariantOutcome) -> str:
    """A variant that stopped early; a server that died: when, and its last log lines."""
    death = outcome.server_death
    if not death:
        return f"harness: variant {outcome.label}: {outcome.error}"
    said = "\n".join(f"    {line}" for line in (death.get("last_lines") or [])[-4:])
    return (
        f"harness: variant {outcome.label}: {outcome.error}: {death_line(death)}; the last "
        f"lines of its log ({death.get('log')}):\n{said}"
    )


def finish_run(
    args: argparse.Namespace,
    opts: RunOptions,
    run_id: str,
    outcomes: list[VariantOutcome],
    interrupted: str | None,
    infra: str | None,
    t0: float,
    said: Collection[str] = (),
) -> int:
    """After the load: the report, the table, the gates and the one-line JSON result, whose
    ``passed`` is true exactly when the exit code is 0. ``said``: the lines announced during
    the run (a warning said there is not said again). After a fatal error (a refused
    configuration, infrastructure) there is no table of zeros, and the error is the last line
    before the result line."""
    report = report_build()
    turns_path = opts.out_dir / TURNS_FILE
    nothing_ran = not turns_path.exists() or turns_path.stat().st_size == 0
    refused = [o for o in outcomes if o.exit_code == EXIT_USAGE]
    died = [o for o in outcomes if o.error and o.exit_code != EXIT_USAGE]
    if interrupted:
        code = _interrupted_code(interrupted)
    elif refused:
        code = EXIT_USAGE
    else:
        code = EXIT_INFRA if (infra or died or nothing_ran) else EXIT_OK
    problem = (
        f"interrupted by {interrupted}"
        if interrupted
        else refused[0].error
        if refused
        else infra or (died[0].error if died else None)
    )
    # the errors are the last lines a person sees, each said once
    errors = [f"harness: error: {o.error}" for o in refused]
    errors += [_died_line(o) for o in died]
    if nothing_ran:
        problem = problem or "no turn was recorded"
        if not any(problem in line for line in errors):
            errors.append(f"harness: error: {problem}")
        _say(errors)
        print_failure_line(run_id, code or EXIT_INFRA, problem, interrupted)
        return code or EXIT_INFRA
    RunDir(opts.out_dir).mark_meta(interrupted=interrupted)
    try:  # (the line inside: a Ctrl-C right after it is printed is caught here too)
        print(f"writing the report in {opts.out_dir} ...", file=sys.stderr, flush=True)
        summary = report.write_report(opts.out_dir)
    except KeyboardInterrupt:  # Ctrl-C while the report is written: the turns are all kept
        problem = "interrupted by SIGINT while the report was written"
        errors.append(
            f"harness: {problem}; every turn done is in {turns_path}: write the report "
            f"with: harness report {opts.out_dir}"
        )
        _say(errors)
        print_failure_line(run_id, _interrupted_code("SIGINT"), problem, "SIGINT")
        return _interrupted_code("SIGINT")
    for warning in summary.get("server_warnings") or []:
        if f"warning: {warning}" not in said:  # said during the run already: not twice
            print(f"harness: warning: {warning}", file=sys.stderr)
    unjudged = unjudged_variants(summary, opts.out_dir)
    if unjudged and code in (EXIT_OK, EXIT_GATE):
        code = EXIT_INFRA
        problem = "cannot judge " + "; ".join(unjudged)
        errors.append(f"harness: error: {problem}")
    if not code or any(v.get("sessions") for v in summary["variants"]):
        print(report.format_table(summary))  # not a table of zeros after a fatal error
    own = sum(v.get("harness_errors") or 0 for v in summary["variants"])
    if own:
        print(
            f"harness: {own} turns failed in the harness itself (harness_error, counted for "
            "no variant; the tracebacks are in the log above)",
            file=sys.stderr,
        )
    print_replays(summary)
    print(f"run folder: {opts.out_dir}  ({time.perf_counter() - t0:.0f}s)")
    if interrupted or infra:
        errors.append(
            f"harness: {problem}; the report covers the turns done so far "
            f"(continue with: harness run --resume {opts.out_dir})"
        )
    _say(errors)
    return apply_gates(args, summary, run_code=code, run_problem=problem, interrupted=interrupted)


def _say(lines: list[str]) -> None:
    sys.stdout.flush()  # after what stdout holds: the errors come last on a terminal
    for line in lines:
        print(line, file=sys.stderr, flush=True)


def unjudged_variants(summary: Any, run_dir: Path) -> list[str]:
    """Variants that cannot be judged, each with why: more than half of their requests failed
    in transport, or more than half of their sessions ran out of attempts on transport
    failures (a server that stopped answering part-way fails a share of the turns, but ends
    every session). A session that ran out of attempts on corrupted answers is a finding."""
    ended: dict[str, int] = {}
    spent: list[tuple[str, int, int]] = []  # the sessions that ran out of attempts
    path = run_dir / SESSIONS_FILE
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                row = json.loads(line)
                label = row["variant"]
                ended[label] = ended.get(label, 0) + 1
                if row.get("ended") == EXHAUSTED:
                    spent.append((label, row["repeat"], row["session"]))
    exhausted: dict[str, int] = {}
    if spent:  # (turns.jsonl read only then: a long run's is hundreds of MB)
        last_failed: dict[tuple[str, int, int], bool] = {}
        for _, rec in jsonl_rows(run_dir / TURNS_FILE, safejson.loads):
            if not isinstance(rec, dict):
                continue
            key = (rec.get("variant", ""), rec.get("repeat", 0), rec.get("session", -1))
            # a send the server failed because its output was no text is corrupted
            # (verdict.turn.failure_verdict), not a transport failure
            last_failed[key] = server_failure(rec.get("transport_error")) and not is_corrupted(
                str(rec.get("label") or "")
            )
        for key in spent:
            if last_failed.get(key):
                exhausted[key[0]] = exhausted.get(key[0], 0) + 1
    out = []
    for v in summary["variants"]:
        label = v["label"]
        if (v.get("transport_error_rate") or 0) > MAX_TRANSPORT_ERROR_RATE:
            out.append(f"{label} (too many transport errors to judge: {v['transport_errors']} "
                       f"of {v['turns'] - v.get('cancelled_turns', 0)} requests)")  # fmt: skip
        elif exhausted.get(label, 0) > MAX_EXHAUSTED_SHARE * ended.get(label, 0):
            out.append(f"{label} ({exhausted[label]} of {ended[label]} sessions ended with "
                       "their attempts exhausted by transport failures)")  # fmt: skip
    return out
