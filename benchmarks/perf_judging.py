"""The judging pool's throughput: turns classified per second per core, at realistic sizes.

    python benchmarks/perf_judging.py                 # 2,000 answers of each shape
    taskset -c 0 python benchmarks/perf_judging.py    # the caller and its judge on one core

Answers shaped like the growing-context workload's (``null_endpoint.py``): about 430
characters of reasoning, a two-sentence preamble and one ``read_file`` call, either parsed by
the server (``parsed``: OpenAI ``tool_calls``) or left in the content as DSML (``raw``: the
harness parses it), with the last 8,000 characters of tool results as the detector's context,
and the scenario's six tool schemas. The same answers are classified on this process's loop
(``classify_turn`` called directly) and through a one-process ``Judge`` (batches of 20, as
answers arrive in one pass of a busy event loop). Figures: CPU per turn in the judging process
(read from /proc, its warm-up excluded), turns/s per core (its inverse), the calling process's
CPU per turn (the loop's share: pickling and the pipes), and inline CPU per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from harness.dialects import dsml
from harness.dialects.base import ToolCall
from harness.drive.judging import Ask, Judge
from harness.workload.scenario import load_scenario
from harness.workload.tools import padding_text

PREAMBLE = "I will read the module that fails first, then fix the import it needs. "
REASONING = (
    "The user wants the failing test fixed. The traceback points at the loader, so the "
    "module that builds the registry is where to start; after that the test itself, to see "
    "which fixture it expects. Reading one file at a time keeps the context small enough, "
    "and the tool returns the whole file, so one call is enough for each of them here."
)


def asks(shape: str, n: int) -> list[Ask]:
    tools = load_scenario().openai_tools()
    out = []
    for i in range(n):
        call = ToolCall("read_file", {"path": f"src/pkg/module_{i}.py"})
        if shape == "raw":
            content, calls, source = dsml.encode_turn(PREAMBLE, [call]), [], "raw"
        else:
            args = json.dumps(call.arguments)
            content, calls, source = PREAMBLE, [{"name": call.name, "arguments": args}], "server"
        context = padding_text(i, 2200)[-8000:]
        out.append(Ask(content, REASONING, calls, tools, "tool_calls", "dsml-v4", source, context))
    return out


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(shape: str, n: int) -> dict[str, Any]:
    work = asks(shape, n)
    for a in work[:50]:
        a.classify()  # warm this process too
    c0 = time.process_time()
    inline = [a.classify() for a in work]
    inline_ms = 1000 * (time.process_time() - c0) / n
    judge = Judge(1)
    await asyncio.to_thread(judge.wait_ready)
    judge.attach()
    try:
        (pid,) = judge.pids()
        j0, c0, t0 = cpu_seconds(pid), time.process_time(), time.perf_counter()
        pooled = []
        for k in range(0, n, 20):
            pooled += await asyncio.gather(*(judge.classify(a) for a in work[k : k + 20]))
        wall = time.perf_counter() - t0
        judge_ms = 1000 * (cpu_seconds(pid) - j0) / n
        caller_ms = 1000 * (time.process_time() - c0) / n
    finally:
        judge.close(wait=True)
    assert pooled == inline, "the pool's verdicts differ from the loop's"
    return {
        "shape": shape,
        "answers": n,
        "answer_chars": round(sum(len(a.content) + len(a.reasoning) for a in work) / n),
        "inline_ms": round(inline_ms, 3),
        "judge_ms": round(judge_ms, 3),
        "turns_per_s_per_core": round(1000 / judge_ms) if judge_ms else None,
        "caller_ms": round(caller_ms, 3),
        "wall_turns_per_s": round(n / wall),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answers", type=int, default=2000)
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    rows = [asyncio.run(measure(shape, args.answers)) for shape in ("parsed", "raw")]
    print(
        "| answers | chars (reasoning + content) | judging process CPU ms/turn | turns/s per core "
        "| calling loop CPU ms/turn | inline CPU ms/turn |\n|---|---:|---:|---:|---:|---:|"
    )
    for r in rows:
        print(
            f"| {r['shape']} | {r['answer_chars']} | {r['judge_ms']:.2f} "
            f"| {r['turns_per_s_per_core']:,} | {r['caller_ms']:.3f} | {r['inline_ms']:.2f} |"
        )
    print(f"\n(load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after)")


if __name__ == "__main__":
    main()
