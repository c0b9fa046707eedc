"""One session: its seeded plan, the turn loop, the history, tool execution, context growth."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from harness import labels as L
from harness.client import ChatClient, Failure, TurnOutput
from harness.config import Scenario
from harness.records import TurnRecord, TurnWriter
from harness.tools import document_chunk, estimate_tokens, padding_text, run_tool
from harness.transcripts import TranscriptLog
from harness.verdict import Verdict, classify_turn

log = logging.getLogger(__name__)

_CONTEXT_CHARS = 8000  # how much of the latest tool results the verdict sees as context

#: The transcript log new ``Shared`` values pick up when none is given (set by the run around
#: the driver, which builds ``Shared`` itself).
ACTIVE_TRANSCRIPTS: ContextVar[TranscriptLog | None] = ContextVar(
    "active_transcripts", default=None
)


@dataclass(frozen=True)
class SessionPlan:
    index: int
    seed: int
    task: str
    steps: int
    max_turns: int
    start_context: int
    max_context: int

    def target_context(self, turn: int) -> int:
        """Tokens the prompt should hold at ``turn`` (linear growth over the steps)."""
        frac = min(1.0, turn / max(1, self.steps))
        return int(self.start_context + (self.max_context - self.start_context) * frac)


def make_plans(scenario: Scenario, sessions: int, seed: int) -> list[SessionPlan]:
    rng = random.Random(seed)
    plans = []
    for i in range(sessions):
        task = scenario.tasks[i % len(scenario.tasks)].format(steps=scenario.steps)
        plans.append(
            SessionPlan(
                index=i,
                seed=rng.randrange(1 << 31),
                task=task,
                steps=scenario.steps,
                max_turns=scenario.max_turns,
                start_context=scenario.start_context,
                max_context=scenario.max_context,
            )
        )
    return plans


@dataclass
class Shared:
    """What the sessions of one variant share."""

    client: ChatClient
    scenario: Scenario
    writer: TurnWriter
    base: dict[str, Any]  # run_id, variant, factors, repeat
    stream: bool = True
    on_corruption: str = "retry"
    limit: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1 << 30))
    inflight: int = 0
    on_turn: Callable[[TurnRecord], None] | None = None
    retry_delay_s: float = 0.5
    transcripts: TranscriptLog | None = field(default_factory=ACTIVE_TRANSCRIPTS.get)


def first_messages(scenario: Scenario, plan: SessionPlan) -> list[dict[str, Any]]:
    tools_tokens = estimate_tokens(json.dumps(scenario.openai_tools()))
    base = estimate_tokens(scenario.system_prompt + plan.task) + tools_tokens
    notes = padding_text(plan.seed, max(16, plan.start_context - base - 40))
    system = f"{scenario.system_prompt}\n\n## Repository notes\n{notes}"
    return [{"role": "system", "content": system}, {"role": "user", "content": plan.task}]


def response_of(out: TurnOutput, verdict: Verdict) -> dict[str, Any]:
    """What a transcript keeps of a response: the output as received and its verdict."""
    return {
        "content": out.content,
        "reasoning": out.reasoning,
        "tool_calls": out.tool_calls,
        "finish_reason": out.finish_reason,
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens,
        "failure": str(out.failure) if out.failure else None,
        "sim_injected": out.sim_injected,
        "label": verdict.label,
        "corrupted": verdict.corrupted,
    }


class Session:
    def __init__(self, plan: SessionPlan, shared: Shared) -> None:
        self.plan = plan
        self.shared = shared
        self.messages = first_messages(shared.scenario, plan)
        self.tools = shared.scenario.openai_tools()
        self.kinds = {t.name: t.kind for t in shared.scenario.tools}
        self.context_text = ""
        self.turns_sent = 0
        self.ended: str | None = None

    def body(self) -> dict[str, Any]:
        s = self.shared.scenario
        body: dict[str, Any] = {
            "messages": self.messages,
            "temperature": s.temperature,
            "max_tokens": s.max_tokens,
            "seed": self.plan.seed,
        }
        if self.tools:
            body["tools"] = self.tools
        return body

    async def send(self, turn: int, attempt: int) -> tuple[TurnOutput, Verdict, TurnRecord]:
        sh = self.shared
        async with sh.limit:
            sh.inflight += 1
            inflight = sh.inflight
            sent_at = time.time()
            body = self.body()
            entry = None
            if sh.transcripts is not None:
                entry = sh.transcripts.sent(self.plan.index, turn, attempt, body, self.context_text)
            t0 = time.perf_counter()
            try:
                out = await sh.client.chat(body, stream=sh.stream)
            except asyncio.CancelledError:
                # the run is stopping: the turn in flight is recorded as cancelled, not lost
                out = TurnOutput(
                    failure=Failure("cancelled", "the run was stopped"),
                    latency_s=time.perf_counter() - t0,
                )
                verdict = Verdict(L.TRANSPORT_ERROR, False, evidence={"failure": "cancelled"})
                self._record(turn, attempt, inflight, sent_at, out, verdict)
                if sh.transcripts is not None and entry is not None:
                    sh.transcripts.answered(entry, response_of(out, verdict), False)
                raise
            finally:
                sh.inflight -= 1
        self.turns_sent += 1
        if out.failure is not None:
            verdict = Verdict(L.TRANSPORT_ERROR, False, evidence={"failure": str(out.failure)})
        else:
            verdict = classify_turn(
                out.content,
                reasoning=out.reasoning,
                tool_calls=out.tool_calls,
                tools=self.tools or None,
                finish_reason=out.finish_reason,
                dialect=sh.scenario.dialect,
                source=out.source,  # "raw": the harness parses the calls
                context=self.context_text or None,
            )
        record = self._record(turn, attempt, inflight, sent_at, out, verdict)
        if sh.transcripts is not None and entry is not None:
            sh.transcripts.answered(entry, response_of(out, verdict), verdict.corrupted)
        return out, verdict, record

    def _record(
        self,
        turn: int,
        attempt: int,
        inflight: int,
        sent_at: float,
        out: TurnOutput,
        verdict: Verdict,
    ) -> TurnRecord:
        sh = self.shared
        record: TurnRecord = {
            **sh.base,  # type: ignore[typeddict-item]
            "session": self.plan.index,
            "turn": turn,
            "attempt": attempt,
            "inflight": inflight,
            "sent_at": round(sent_at, 3),
            "prompt_tokens": out.prompt_tokens,
            "cached_tokens": out.cached_tokens,
            "completion_tokens": out.completion_tokens,
            "ttft_s": out.ttft_s,
            "latency_s": out.latency_s,
            "itl_s": out.itl_s,
            "finish_reason": out.finish_reason,
            "label": verdict.label,
            "corrupted": verdict.corrupted,
            "noncanonical": verdict.noncanonical,
            "transport_error": str(out.failure) if out.failure else None,
            "http_status": out.status,
            "sim_injected": out.sim_injected,
            "content": out.content,
            "reasoning": out.reasoning,
            "tool_calls": verdict.tool_calls if verdict.tool_calls else out.tool_calls,
            "evidence": verdict.evidence,
        }
        sh.writer.write(record)
        if sh.on_turn is not None:
            sh.on_turn(record)
        return record

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            if self.shared.transcripts is not None:
                self.shared.transcripts.finished(self.plan.index)

    async def _run(self) -> None:
        sh = self.shared
        for turn in range(self.plan.max_turns):
            result = None
            for attempt in range(sh.scenario.max_attempts):
                out, verdict, _ = await self.send(turn, attempt)
                if out.failure is not None:
                    if attempt + 1 < sh.scenario.max_attempts:
                        await asyncio.sleep(sh.retry_delay_s * (2**attempt))
                    continue
                if verdict.corrupted and sh.on_corruption == "retry":
                    continue
                result = (out, verdict)
                break
            if result is None:
                self.ended = "attempts exhausted"
                return
            out, verdict = result
            if verdict.corrupted:
                self.ended = "corrupted"
                return
            calls = verdict.tool_calls if verdict.label in (L.OK_TOOL_CALL, L.PARSER_LEAK) else []
            if sh.scenario.workload == "chat" and verdict.label == L.OK_TEXT:
                if turn + 1 >= self.plan.steps:
                    self.ended = "answered"
                    return
                self._follow_up(turn, out)
                if (out.prompt_tokens or 0) >= self.plan.max_context:
                    self.ended = "max context"
                    return
                continue
            if not calls:
                self.ended = "answered" if verdict.label == L.OK_TEXT else verdict.label
                return
            self._extend(turn, out, calls)
            if (out.prompt_tokens or 0) >= self.plan.max_context:
                self.ended = "max context"
                return
        self.ended = "max turns"

    def _budget(self, turn: int, out: TurnOutput) -> int:
        """Tokens to add so the next prompt reaches the planned context size."""
        prompt = out.prompt_tokens or estimate_tokens(json.dumps(self.messages))
        return self.plan.target_context(turn + 1) - prompt - (out.completion_tokens or 0)

    def _follow_up(self, turn: int, out: TurnOutput) -> None:
        """Chat workload: the answer, then a user turn bringing a document and a question."""
        questions = self.shared.scenario.questions
        question = questions[(self.plan.index + turn) % len(questions)]
        doc = document_chunk(self.plan.seed + turn, max(50, self._budget(turn, out) - 30))
        self.messages.append({"role": "assistant", "content": out.content})
        self.messages.append(
            {"role": "user", "content": f"Document {turn + 2}:\n{doc}\n\n{question}"}
        )
        self.context_text = doc[-_CONTEXT_CHARS:]

    def _extend(self, turn: int, out: TurnOutput, calls: list[dict[str, Any]]) -> None:
        """Append the assistant turn and the results of its calls."""
        budget = max(50, self._budget(turn, out) // max(1, len(calls)) - 20)
        openai_calls = []
        results = []
        for i, call in enumerate(calls):
            call_id = f"call_{self.plan.index}_{turn}_{i}"
            args = call.get("arguments") if isinstance(call.get("arguments"), dict) else {}
            name = str(call.get("name"))
            openai_calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
                }
            )
            kind = self.kinds.get(name, "echo")
            text = run_tool(kind, args, seed=self.plan.seed + turn, budget_tokens=budget)
            results.append({"role": "tool", "tool_call_id": call_id, "content": text})
        self.messages.append(
            {
                "role": "assistant",
                "content": out.content or None,
                "tool_calls": openai_calls,
            }
        )
        self.messages.extend(results)
        self.context_text = "\n".join(r["content"] for r in results)[-_CONTEXT_CHARS:]
