"""CPU cost of each part of one harness turn, measured alone (no network), in microseconds.

    python benchmarks/perf_parts.py             # the fixed-context cases
    python benchmarks/perf_parts.py --workload  # the growing-context workload (perf_workload.py)

The parts a turn goes through after the transport: parse the stream (93 SSE events of the
null endpoint's answer), classify the turn, run the fake tool, encode the next request body
(2k and 80k contexts), write the record; and building a session's first prompt.

``--workload``: the same parts on the turns of ``perf_workload.py`` (the default coding-agent
scenario, 12 turns growing from 2k to about 35k tokens, the null endpoint's raw answers: a DSML
tool call in the content): each part per turn, averaged over a session's 12 turns.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import null_endpoint  # noqa: E402

from harness.client.output import TurnOutput  # noqa: E402
from harness.client.sse import ChatEvents, LineSplitter  # noqa: E402
from harness.drive.judging import Ask, frame  # noqa: E402
from harness.drive.session import SessionPlan, first_messages  # noqa: E402
from harness.record.turns import TurnWriter  # noqa: E402
from harness.verdict import classify_turn  # noqa: E402
from harness.workload.scenario import load_scenario  # noqa: E402
from harness.workload.tools import run_tool  # noqa: E402


def per_call_us(fn: Callable[[], object], seconds: float = 0.5) -> float:
    fn()
    n = 0
    t0 = time.process_time()
    while time.process_time() - t0 < seconds:
        fn()
        n += 1
    return (time.process_time() - t0) / n * 1e6


def unframe(raw: bytes) -> bytes:
    """The SSE bytes inside a chunked-encoding body."""
    body, i = b"", 0
    while i < len(raw):
        j = raw.index(b"\r\n", i)
        size = int(raw[i:j], 16)
        body += raw[j + 2 : j + 2 + size]
        i = j + 2 + size + 2
    return body


def grow(session: Any, answers: list[tuple[bytes, TurnOutput]]) -> tuple[Any, ...]:
    """A session's 12 turns, each answered with one of the null endpoint's answers: the
    bodies sent, the contexts, outputs and verdicts, and the CPU the tools took (us)."""
    bodies: list[dict[str, object]] = []
    contexts: list[str] = []
    outs: list[TurnOutput] = []
    verdicts = []
    tool_us = 0.0
    for turn in range(12):
        bodies.append(dict(session.body(turn), messages=list(session.messages)))
        contexts.append(session.context_text)
        sse, out = answers[turn % len(answers)]
        out = TurnOutput(**{**out.__dict__, "prompt_tokens": len(orjson.dumps(bodies[-1])) // 4})
        verdict = classify_turn(out.content, reasoning=out.reasoning, tools=session.tools,
                                finish_reason=out.finish_reason, dialect="dsml-v4",
                                context=session.context_text or None)  # fmt: skip
        outs.append(out)
        verdicts.append(verdict)
        t0 = time.process_time()
        session._extend(turn, out, verdict.tool_calls)
        tool_us += (time.process_time() - t0) * 1e6
    return bodies, contexts, outs, verdicts, tool_us


def workload() -> None:
    """Each part of a turn of the growing-context workload, per turn."""
    import asyncio

    from harness.client.chat import ChatClient
    from harness.dialects.registry import markup_spans
    from harness.drive.session import Session, Shared
    from harness.record.payload import HistoryEncoder
    from harness.record.transcripts import chat_payload
    from harness.record.turns import TurnWriter as Writer

    scenario = load_scenario()
    canned = null_endpoint.Canned(6, "raw")
    answers = []
    for framed, _, _ in canned.streams:
        sse = unframe(framed) + b"data: [DONE]\n\n"
        acc = ChatEvents(TurnOutput(), 0.0)
        acc.read(sse, 1.0)
        acc.finish()
        answers.append((sse, acc.out))
    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp, Writer(Path(tmp) / "t.jsonl") as writer:

        async def build(seed: int) -> Session:
            client = ChatClient("http://127.0.0.1:9", model="m")
            shared = Shared(client, scenario, writer, {"run_id": "r", "variant": "v"})
            plan = SessionPlan(0, seed, scenario.tasks[0], scenario.steps, 12,
                               scenario.start_context, scenario.max_context)  # fmt: skip
            return Session(plan, shared)

        for seed in (1, 12345):  # the first builds the tools' corpus (once per process)
            session = asyncio.run(build(seed))
            bodies, contexts, outs, verdicts, tool_us = grow(session, answers)
        kb = sum(len(orjson.dumps(b)) for b in bodies) / len(bodies) / 1024
        rows.append((f"run the tools and grow the history (12 turns, {kb:.0f} KB a request)",
                     tool_us / 12))  # fmt: skip
        sse = answers[0][0]

        def parse() -> None:
            acc = ChatEvents(TurnOutput(), 0.0)
            for i in range(0, len(sse), 1400):  # reads of the endpoint's chunks, as they come
                acc.read(sse[i : i + 1400], 1.0)
            acc.finish()

        rows.append(("parse the stream (raw DSML answer)", per_call_us(parse)))

        def classify_all() -> None:
            for out, context in zip(outs, contexts, strict=True):
                classify_turn(out.content, reasoning=out.reasoning, tools=session.tools,
                              finish_reason=out.finish_reason, dialect="dsml-v4",
                              context=context or None)  # fmt: skip

        rows.append(("classify the turn (classify_turn)", per_call_us(classify_all) / 12))
        texts = [f"{o.reasoning}\n{o.content}" for o in outs]
        rows.append(("  of which markup_spans (the masking's other-dialect scan)",
                     per_call_us(lambda: [markup_spans(t) for t in texts]) / 12))  # fmt: skip
        asks = [
            Ask(o.content, o.reasoning, o.tool_calls, session.tools, o.finish_reason,
                "dsml-v4", o.source, c or None)
            for o, c in zip(outs, contexts, strict=True)
        ]  # fmt: skip
        rows.append(("hand the answer to a judging process (its batch framed)",
                     per_call_us(lambda: frame(({}, [a.wire(0) for a in asks]))) / 12))  # fmt: skip

        def whole() -> None:
            for body in bodies:
                chat_payload(body, "m", True)

        def cached() -> None:
            history = HistoryEncoder()
            for body in bodies:
                chat_payload(body, "m", True, history)

        rows.append(("encode the request body, whole", per_call_us(whole) / 12))
        rows.append(("encode the request body, HistoryEncoder", per_call_us(cached) / 12))
        records = [
            {"run_id": "r", "session": 0, "turn": t, "content": o.content,
             "reasoning": o.reasoning, "tool_calls": v.tool_calls, "evidence": v.evidence}
            for t, (o, v) in enumerate(zip(outs, verdicts, strict=True))
        ]  # fmt: skip

        def write() -> None:
            for record in records:
                writer.write(record)  # type: ignore[arg-type]

        rows.append(("write the record (flushed)", per_call_us(write) / 12))
    width = max(len(name) for name, _ in rows)
    for name, us in rows:
        print(f"{name:<{width}}  {us:8.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", action="store_true", help="the growing-context workload")
    if ap.parse_args().workload:
        workload()
        return
    scenario = load_scenario()
    tools = scenario.openai_tools()
    canned = null_endpoint.Canned(6, "parsed")
    framed, events, _ = canned.streams[0]
    sse = unframe(framed) + b"data: [DONE]\n\n"

    def parse() -> TurnOutput:
        acc = ChatEvents(TurnOutput(), 0.0)  # the shipped client's stream parser
        acc.feed(LineSplitter().lines(sse), 1.0)
        acc.finish()
        return acc.out

    out = parse()
    context = run_tool("read_file", {"path": "src/a.py"}, seed=1, budget_tokens=2000)[-8000:]

    def classify() -> object:
        return classify_turn(
            out.content,
            reasoning=out.reasoning,
            tool_calls=out.tool_calls,
            tools=tools,
            finish_reason=out.finish_reason,
            dialect=scenario.dialect,
            source="server",
            context=context,
        )

    rows: list[tuple[str, float]] = [
        (f"parse the stream ({events} events)", per_call_us(parse)),
        ("classify the turn", per_call_us(classify)),
    ]
    for budget in (150, 3000):  # 3,000: a coding-agent turn's share of 2k -> 80k over 26 steps
        for kind in ("read_file", "search", "run_tests"):
            rows.append(
                (
                    f"run a tool ({kind}, {budget}-token result)",
                    per_call_us(
                        lambda k=kind, b=budget: run_tool(
                            k,
                            {"path": "a.py", "query": "evict", "target": "tests"},
                            seed=3,
                            budget_tokens=b,
                        )
                    ),
                )
            )
    for tokens in (2000, 80000):
        plan = SessionPlan(0, 1, "task", 26, 40, tokens, tokens + 1000)
        body = {"messages": first_messages(scenario, plan), "tools": tools, "seed": 1}
        size = len(orjson.dumps(body)) // 1024
        rows.append(
            (f"encode a {size} KB request body", per_call_us(lambda b=body: orjson.dumps(b)))
        )
        rows.append(
            (
                f"build a session's first prompt ({tokens // 1000}k tokens)",
                per_call_us(lambda p=plan: first_messages(scenario, p), seconds=0.3),
            )
        )
    record = {"content": out.content, "reasoning": out.reasoning, "tool_calls": out.tool_calls}
    with tempfile.TemporaryDirectory() as tmp, TurnWriter(Path(tmp) / "t.jsonl") as writer:
        rows.append(("write the record (flushed)", per_call_us(lambda: writer.write(record))))  # type: ignore[arg-type]
    width = max(len(name) for name, _ in rows)
    for name, us in rows:
        print(f"{name:<{width}}  {us:8.1f} us")


if __name__ == "__main__":
    main()
