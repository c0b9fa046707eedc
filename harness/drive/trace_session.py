"""Recorded conversations as sessions (``harness run --workload FILE.jsonl``).

One conversation of a trace (``workload.trace``) is one session, shaped like ``Session`` for the
driver (``plan.index``, ``ended``, ``messages``, ``async run()``); its turns are sent, classified
and recorded like any turn, with the conversation's own tools.

- ``replay``: every recorded request is sent as it was (the history before each recorded
  assistant turn), whatever the live answers were.
- ``continue``: the live answers make the history. Where the live model calls the tool the
  recording called at that turn and position (same name), the recorded result follows; where
  it diverges, the fake tools (``harness.workload.tools.run_tool``) answer. Recorded user turns that
  followed a recorded turn follow the live turn too.

Pace: ``recorded`` sends turn k no earlier than ``offsets_s[k]`` after the session started (when
the trace has offsets); ``fast`` sends as soon as the previous answer and the concurrency allow.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import labels as L
from harness.drive.raw_session import RawSession, visible
from harness.drive.session import Session, SessionPlan, Shared
from harness.errors import UsageError
from harness.workload.scenario import Scenario
from harness.workload.tools import estimate_tokens, run_tool
from harness.workload.trace import Conversation, RecordedTurn, load_trace

log = logging.getLogger(__name__)

MODES = ("replay", "continue")
PACES = ("recorded", "fast")
_CONTEXT_CHARS = 8000
_KIND_WORDS = (
    ("list_dir", ("list", "ls", "dir", "tree")),
    ("read_file", ("read", "open", "cat", "view", "fetch")),
    ("search", ("search", "grep", "find", "query", "lookup")),
    ("run_tests", ("test", "run", "exec", "bash", "shell")),
)


def check_options(mode: str, pace: str) -> None:
    if mode not in MODES:
        raise UsageError(f"--workload-mode {mode!r}: use one of {', '.join(MODES)}")
    if pace not in PACES:
        raise UsageError(f"--pace {pace!r}: use one of {', '.join(PACES)}")


def fake_kind(name: str, scenario: Scenario) -> str:
    """The fake tool that answers ``name`` when the live model leaves the recording."""
    for tool in scenario.tools:
        if tool.name == name:
            return tool.kind
    low = name.lower()
    for kind, words in _KIND_WORDS:
        if any(w in low for w in words):
            return kind
    return "echo"


def trace_plans(
    conversations: Sequence[Conversation], scenario: Scenario, mode: str, seed: int
) -> list[SessionPlan]:
    """One plan per conversation (the plan's task is the conversation's id)."""
    rng = random.Random(seed)
    plans = []
    for i, conv in enumerate(conversations):
        n = len(conv.turns())
        plans.append(
            SessionPlan(
                index=i,
                seed=rng.randrange(1 << 31),
                task=conv.id,
                steps=n,
                max_turns=n if mode == "replay" else max(n, scenario.max_turns),
                start_context=0,
                max_context=1 << 40,
            )
        )
    return plans


def session_factory(
    conversations: Sequence[Conversation], mode: str, pace: str
) -> Callable[[SessionPlan, Shared], Session]:
    """``drive(make_session=...)`` for a trace: plan ``i`` replays conversation ``i``."""
    check_options(mode, pace)

    def make(plan: SessionPlan, shared: Shared) -> Session:
        return TraceSession(plan, shared, conversations[plan.index], mode, pace)

    return make


def _tail_results(messages: Sequence[dict[str, Any]]) -> str:
    """The tool results at the end of a history: the context the verdict sees."""
    out: list[str] = []
    for m in reversed(messages):
        if m.get("role") != "tool":
            break
        out.append(str(m.get("content") or ""))
    return "\n".join(reversed(out))[-_CONTEXT_CHARS:]


class TraceSession(Session):
    def __init__(
        self, plan: SessionPlan, shared: Shared, conv: Conversation, mode: str, pace: str
    ) -> None:
        super().__init__(plan, shared)
        self.conv = conv
        self.mode = mode
        self.pace = pace
        self.recorded: list[RecordedTurn] = conv.turns()
        self.tools = list(conv.tools)
        self.kinds = {}
        self.messages = list(self.recorded[0].history)
        self.context_text = _tail_results(self.messages)
        self.diverged = 0  # live calls answered by the fake tools (continue mode)
        self.trace_turn = 0
        sizes = [
            estimate_tokens(str(m.get("content") or ""))
            for m in conv.messages
            if m.get("role") == "tool"
        ]
        self.result_tokens = max(50, sum(sizes) // len(sizes)) if sizes else 300

    def _workload_fields(self, record: dict[str, Any]) -> None:
        super()._workload_fields(record)
        record["trace"] = self.conv.id
        record["trace_mode"] = self.mode
        if self.mode == "continue":
            record["trace_diverged"] = self.diverged

    async def run(self) -> None:
        t0 = time.monotonic()
        try:
            if self.mode == "replay":
                await self._replay(t0)
            else:
                await self._continue(t0)
        finally:
            if self.shared.transcripts is not None:
                self.shared.transcripts.finished(self.plan.index)

    async def _pace(self, turn: int, t0: float) -> None:
        if self.pace != "recorded" or turn >= len(self.recorded):
            return
        offset = self.recorded[turn].offset_s
        if offset is not None:
            delay = t0 + offset - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

    async def _replay(self, t0: float) -> None:
        failed = 0
        for turn, rec in enumerate(self.recorded):
            await self._pace(turn, t0)
            self.trace_turn = turn
            self.messages = list(rec.history)
            self.context_text = _tail_results(self.messages)
            result = await self._attempts(turn)
            if result is None or result[1].corrupted:
                failed += 1
        self.ended = "replayed" if not failed else f"replayed, {failed} turns failed"

    def _followers(self, turn: int) -> list[dict[str, Any]]:
        """The recorded messages between recorded turn ``turn`` and the next one."""
        if turn >= len(self.recorded):
            return []
        start = self.recorded[turn].index + 1
        nxt = self.recorded[turn + 1].index if turn + 1 < len(self.recorded) else None
        return list(self.conv.messages[start:nxt])

    async def _continue(self, t0: float) -> None:
        for turn in range(self.plan.max_turns):
            await self._pace(turn, t0)
            self.trace_turn = turn
            usable = await self._usable(turn)
            if usable is None:
                return
            out, verdict, calls = usable
            followers = self._followers(turn)
            users = [m for m in followers if m.get("role") != "tool"]
            content = visible(out).content or None
            if not calls:
                if not users:
                    self.ended = "answered" if verdict.label == L.OK_TEXT else verdict.label
                    return
                self.messages.append({"role": "assistant", "content": content or ""})
                self.messages.extend(users)
                self.context_text = ""
                continue
            self._answer_calls(turn, content, calls, followers)
            self.messages.extend(users)
        self.ended = "max turns"

    def _answer_calls(
        self,
        turn: int,
        content: str | None,
        calls: list[dict[str, Any]],
        followers: list[dict[str, Any]],
    ) -> None:
        """The live calls, answered by the recorded results where the names match."""
        rec_calls = (
            list(self.recorded[turn].recorded.get("tool_calls") or [])
            if turn < len(self.recorded)
            else []
        )
        by_id = {m.get("tool_call_id"): m for m in followers if m.get("role") == "tool"}
        tool_msgs = [m for m in followers if m.get("role") == "tool"]
        openai_calls, results = [], []
        for i, call in enumerate(calls):
            call_id = f"call_{self.plan.index}_{turn}_{i}"
            raw_args = call.get("arguments")
            args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
            name = str(call.get("name"))
            fn = {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}
            openai_calls.append({"id": call_id, "type": "function", "function": fn})
            text = self._recorded_result(rec_calls, i, name, by_id, tool_msgs)
            if text is None:
                self.diverged += 1
                kind = fake_kind(name, self.shared.scenario)
                text = run_tool(
                    kind, args, seed=self.plan.seed + turn, budget_tokens=self.result_tokens
                )
            results.append({"role": "tool", "tool_call_id": call_id, "content": text})
        self.messages.append({"role": "assistant", "content": content, "tool_calls": openai_calls})
        self.messages.extend(results)
        self.context_text = "\n".join(r["content"] for r in results)[-_CONTEXT_CHARS:]

    @staticmethod
    def _recorded_result(
        rec_calls: list[dict[str, Any]],
        i: int,
        name: str,
        by_id: dict[Any, dict[str, Any]],
        tool_msgs: list[dict[str, Any]],
    ) -> str | None:
        if i >= len(rec_calls):
            return None
        rec = rec_calls[i]
        fn = rec.get("function", rec)
        if fn.get("name") != name:
            return None
        msg = by_id.get(rec.get("id"))
        if msg is None and i < len(tool_msgs):
            msg = tool_msgs[i]  # results without matching ids: by position
        return None if msg is None else str(msg.get("content") or "")


@dataclass(frozen=True)
class SessionSource:
    """How a variant's sessions are built, the same in the parent and in every worker: the
    scenario's plans, or a trace's conversations (``--workload``), as chat or raw-mode
    sessions (``--api``)."""

    workload: Path | None = None  # a trace (JSONL): its conversations are the sessions
    mode: str = "replay"  # replay | continue
    pace: str = "recorded"  # recorded | fast
    api: str = "chat"  # chat | completions | generate (harness.client.raw)
    seed: int = 1

    @property
    def holds_slots(self) -> bool:
        """Whether a session may hold its permit from start to end (a trace sent at its
        recorded pace idles between turns: its sends hold the permits)."""
        return self.workload is None or self.pace != "recorded"


def sessions_for(
    source: SessionSource, scenario: Scenario, plans: list[SessionPlan]
) -> tuple[list[SessionPlan], Callable[[SessionPlan, Shared], Session] | None]:
    """The run's plans and session builder: a trace's conversations (``--workload``), or the
    scenario's plans as raw-mode sessions (``--api completions|generate``), or as they are."""
    if source.workload is not None:
        conversations = load_trace(source.workload)
        return trace_plans(conversations, scenario, source.mode, source.seed), session_factory(
            conversations, source.mode, source.pace
        )
    if source.api != "chat":
        return plans, RawSession
    return plans, None
