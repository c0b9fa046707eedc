"""CPU cost of each part of one harness turn, measured alone (no network), in microseconds.

    python benchmarks/perf_parts.py

The parts a turn goes through after the transport: parse the stream (93 SSE events of the
null endpoint's answer), classify the turn, run the fake tool, encode the next request body
(2k and 80k contexts), write the record; and building a session's first prompt.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import null_endpoint  # noqa: E402

from harness.client.output import TurnOutput  # noqa: E402
from harness.client.sse import ChatEvents, LineSplitter  # noqa: E402
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


def main() -> None:
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
