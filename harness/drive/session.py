"""One session: its seeded plan, the turn loop, the history, tool execution, context growth."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

from harness import labels as L
from harness.client.chat import ChatClient
from harness.client.output import Failure, TurnOutput
from harness.dialects import registry
from harness.drive import judging
from harness.drive.answering import ServerWatch, retry_delay
from harness.drive.inflight import InflightBoard
from harness.drive.judging import Ask, Failed, Judge, failed_verdict
from harness.errors import EnvironmentFailure
from harness.record.payload import HistoryEncoder
from harness.record.safejson import Unencodable
from harness.record.transcripts import TranscriptLog
from harness.record.turns import TurnRecord, TurnWriter
from harness.verdict import Verdict
from harness.verdict.turn import failure_verdict
from harness.workload import passkeys
from harness.workload.dialect import AUTO, DialectLock
from harness.workload.pressure import plan_pressure, server_capacity
from harness.workload.scenario import Scenario
from harness.workload.tools import document_chunk, estimate_tokens, padding_text, run_tool

log = logging.getLogger(__name__)

_CONTEXT_CHARS = 8000  # how much of the latest tool results the verdict sees as context
#: How a session ends when a turn's attempts ran out (every one failed, or was corrupted).
EXHAUSTED = "attempts exhausted"
#: how long a stopping run still waits for the verdict of an answer that came
JUDGE_GRACE_S = 5.0


@dataclass(frozen=True)
class SessionPlan:
    """One session's seeded plan.

    Workload extras (docs/workloads.md): ``prefix_seed`` seeds the system prompt's notes
    (shared by the sessions of one prefix group; the session's own seed otherwise); a fork
    (``parent`` set) takes the parent's history at turn ``branch_at`` and goes on from there;
    ``think_time_s`` is the pause before each next turn, drawn per turn from the session seed.
    """

    index: int
    seed: int
    task: str
    steps: int
    max_turns: int
    start_context: int
    max_context: int
    prefix_seed: int | None = None
    group: int | None = None
    parent: int | None = None
    parent_seed: int | None = None
    branch_at: int = 0
    think_time_s: tuple[float, float] = (0.0, 0.0)

    def target_context(self, turn: int) -> int:
        """Tokens the prompt should hold at ``turn`` (linear growth over the steps)."""
        frac = min(1.0, turn / max(1, self.steps))
        return int(self.start_context + (self.max_context - self.start_context) * frac)

    def seed_for(self, turn: int) -> int:
        """The seed of ``turn``'s request and tool results (a fork's history is its parent's)."""
        if self.parent_seed is not None and turn < self.branch_at:
            return self.parent_seed
        return self.seed

    def think_s(self, turn: int) -> float:
        """Seconds to wait before sending ``turn`` (none before the first)."""
        lo, hi = self.think_time_s
        if turn == 0 or hi <= 0:
            return 0.0
        return random.Random(self.seed * 7919 + turn).uniform(lo, hi)


def make_plans(scenario: Scenario, sessions: int, seed: int) -> list[SessionPlan]:
    """Seeded plans; prefix groups and forks as the scenario says (none by default)."""
    rng = random.Random(seed)
    plans: list[SessionPlan] = []
    family = scenario.branches
    max_context = scenario.max_context
    if scenario.pressure is not None and scenario.kv_capacity is not None:
        max_context = plan_pressure(scenario, scenario.kv_capacity, scenario.sessions).max_context
    for i in range(sessions):
        own_seed = rng.randrange(1 << 31)
        root = plans[i - i % family] if family > 1 and i % family else None
        group = (i // family) % scenario.prefix_groups if scenario.prefix_groups else None
        task_of = root.index if root is not None else i
        task = scenario.tasks[task_of % len(scenario.tasks)].format(steps=scenario.steps)
        if root is not None:
            prefix_seed = root.prefix_seed
        elif group is not None:
            prefix_seed = random.Random(seed * 1_000_003 + group).randrange(1 << 31)
        else:
            prefix_seed = None
        plans.append(
            SessionPlan(
                index=i,
                seed=own_seed,
                task=task,
                steps=scenario.steps,
                max_turns=scenario.max_turns,
                start_context=scenario.start_context,
                max_context=max_context,
                prefix_seed=prefix_seed,
                group=group,
                parent=root.index if root is not None else None,
                parent_seed=root.seed if root is not None else None,
                branch_at=scenario.branch_at if root is not None else 0,
                think_time_s=scenario.think_time_s,
            )
        )
    return plans


@dataclass
class Workload:
    """What the sessions of one variant coordinate on: the KV capacity and the forks."""

    capacity: int | None = None
    capacity_known: asyncio.Event | None = None
    resolving: bool = False
    plan: Any = None  # the PressurePlan applied, when the scenario states a pressure
    members: set[int] = field(default_factory=set)
    forks: dict[int, asyncio.Future[Any]] = field(default_factory=dict)

    def fork_point(self, parent: int) -> asyncio.Future[Any]:
        if parent not in self.forks:
            self.forks[parent] = asyncio.get_running_loop().create_future()
        return self.forks[parent]


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
    transcripts: TranscriptLog | None = None  # the exact requests, when kept
    workload: Workload = field(default_factory=Workload)
    board: InflightBoard | None = None  # the other workers' in flight (harness.pool.parent)
    watch: ServerWatch | None = None  # refused, overloaded, no longer answering
    #: the scenario's dialect is "auto" and the model name did not tell: the first markup does
    dialect_lock: DialectLock | None = None
    #: classifies the answers (None: on this event loop)
    judge: Judge | None = None
    on_judged: Callable[[float], None] | None = None  # seconds a session waited for a verdict
    settling: asyncio.Lock = field(default_factory=asyncio.Lock)  # see Session._classify

    @property
    def dialect(self) -> str:
        return self.dialect_lock.name if self.dialect_lock is not None else self.scenario.dialect


def harness_error(exc: BaseException, doing: str, session: int, turn: int) -> Verdict:
    """The verdict of a turn the harness itself failed on: logged with its traceback, the
    reason on the row, neither corruption nor the server's failure."""
    log.error("session %d turn %d: the harness failed %s", session, turn, doing, exc_info=exc)
    reason = f"{doing}: {type(exc).__name__}: {exc}"[:500]
    return Verdict(L.HARNESS_ERROR, False, evidence={"reason": reason})


def first_messages(scenario: Scenario, plan: SessionPlan) -> list[dict[str, Any]]:
    tools_tokens = estimate_tokens(json.dumps(scenario.openai_tools()))
    base = estimate_tokens(scenario.system_prompt + plan.task) + tools_tokens
    notes_seed = plan.seed if plan.prefix_seed is None else plan.prefix_seed
    notes = padding_text(notes_seed, max(16, plan.start_context - base - 40))
    system = f"{scenario.system_prompt}\n\n## Repository notes\n{notes}"
    return [{"role": "system", "content": system}, {"role": "user", "content": plan.task}]


def token_id_fields(stream: bool) -> dict[str, Any]:
    """What asks a server for the generated tokens: ``return_token_ids`` (vLLM; SGLang);
    non-streamed also ``logprobs`` with one top entry (llama.cpp gives the ids there only,
    and refuses logprobs on a streamed request with tools)."""
    fields: dict[str, Any] = {"return_token_ids": True}
    if not stream:
        fields.update(logprobs=True, top_logprobs=1)
    return fields


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
        **({"meta_info": out.meta_info} if out.meta_info is not None else {}),
        **({"token_ids": out.token_ids} if out.token_ids is not None else {}),
        **({"token_strs": out.token_strs} if out.token_strs is not None else {}),
    }


def _arguments(args: dict[str, Any]) -> str:
    """Parsed arguments as the history sends them back (escaped when a lone surrogate in
    them has no UTF-8)."""
    text = json.dumps(args, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(args, ensure_ascii=True)
    return text


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
        self.first_turn = 0  # a fork starts at its branch turn
        self.think_s = 0.0  # the pause before the turn being sent
        self.encoded = HistoryEncoder()  # the history's messages, each encoded once
        shared.workload.members.add(plan.index)

    def body(self, turn: int = 0) -> dict[str, Any]:
        s = self.shared.scenario
        body: dict[str, Any] = {
            "messages": self.messages,
            "temperature": s.temperature,
            "max_tokens": s.max_tokens,
            "seed": self.plan.seed_for(turn),
            **dict(s.sampling),  # [sampling]: more fields, as the server names them
        }
        if self.tools:
            body["tools"] = self.tools
        if s.return_meta_info:  # --oracle spec_accept (SGLang; non-streamed requests)
            body["return_meta_info"] = True
        if s.return_token_ids:  # --oracle replay: compared token by token
            body.update(token_id_fields(self.shared.stream))
        return body

    async def send(self, turn: int, attempt: int) -> tuple[TurnOutput, Verdict, TurnRecord]:
        sh = self.shared
        async with sh.limit:
            sh.inflight += 1
            inflight = sh.inflight if sh.board is None else sh.board.publish(sh.inflight)
            sent_at = time.time()
            body = self.body(turn)
            entry = None
            if sh.transcripts is not None:
                entry = sh.transcripts.sent(self.plan.index, turn, attempt, body, self.context_text)
            t0 = time.perf_counter()
            failed: Verdict | None = None
            try:
                out = await sh.client.chat(body, stream=sh.stream, history=self.encoded)
            except Exception as exc:  # noqa: BLE001 - not the server's failure: a harness bug
                out = TurnOutput(latency_s=time.perf_counter() - t0)
                failed = harness_error(exc, "sending the request", self.plan.index, turn)
            except asyncio.CancelledError:
                # the run is stopping: the turn in flight is recorded as cancelled, not lost
                out = TurnOutput(
                    failure=Failure("cancelled", "the run was stopped"),
                    latency_s=time.perf_counter() - t0,
                )
                verdict = Verdict(L.TRANSPORT_ERROR, False, evidence={"failure": "cancelled"})
                with contextlib.suppress(EnvironmentFailure):  # a run stopping on a full disk
                    self._record(turn, attempt, inflight, sent_at, out, verdict)
                if sh.transcripts is not None and entry is not None:
                    sh.transcripts.answered(entry, response_of(out, verdict), False)
                raise
            finally:
                sh.inflight -= 1
                if sh.board is not None:
                    sh.board.publish(sh.inflight)
        for dropped in out.dropped:  # every send the server may have seen is a row
            lost = TurnOutput(failure=dropped, latency_s=None)
            why = {"failure": str(dropped), "resent": True}
            verdict = Verdict(L.TRANSPORT_ERROR, False, evidence=why)
            self._record(turn, attempt, inflight, sent_at, lost, verdict)
            attempt += 1
        if entry is not None:
            entry.row["attempt"] = attempt
        self.turns_sent += 1
        if failed is not None:
            verdict = failed
        elif out.failure is not None:
            verdict = failure_verdict(str(out.failure))  # a transport error, or unencodable
        else:
            judging_task = asyncio.ensure_future(self._classify(out, turn))
            try:
                verdict = await asyncio.shield(judging_task)
            except asyncio.CancelledError:
                # the run stops while the answer is judged: the answer came, so its row gets
                # its verdict (judged in another process, it is milliseconds away)
                try:
                    verdict = await asyncio.wait_for(judging_task, JUDGE_GRACE_S)
                except (asyncio.CancelledError, TimeoutError):
                    # stopped again, or the verdict lost with its process: the harness
                    # stopped this turn, so it is cancelled (its answer kept), no one's fault
                    reason = "the run was stopped while the answer was classified"
                    out.failure = Failure("cancelled", reason)
                    verdict = Verdict(L.TRANSPORT_ERROR, False, evidence={"failure": "cancelled"})
                with contextlib.suppress(EnvironmentFailure):
                    self._record(turn, attempt, inflight, sent_at, out, verdict)
                raise
            if sh.dialect_lock is not None:
                sh.dialect_lock.observe(verdict.evidence)  # settled already, or a no-op
        record = self._record(turn, attempt, inflight, sent_at, out, verdict)
        if sh.transcripts is not None and entry is not None:
            try:
                sh.transcripts.answered(entry, response_of(out, verdict), verdict.corrupted)
            except Exception:  # the turn is recorded; its transcript is a bonus
                log.exception("session %d turn %d: transcript not written", self.plan.index, turn)
        return out, verdict, record

    async def _classify(self, out: TurnOutput, turn: int) -> Verdict:
        """The verdict of one answer, from the judging processes (``harness.drive.judging``:
        off the event loop that times the requests; the session waits for it, nothing else
        does); an exception of the classifier's is this turn's alone (a ``harness_error``
        verdict)."""
        sh = self.shared
        ask = Ask(
            out.content,
            out.reasoning,
            out.tool_calls,
            self.tools or None,
            out.finish_reason,
            sh.dialect,
            out.source,  # "raw": the harness parses the calls
            self.context_text or None,
        )
        judge = sh.judge or judging.shared(0)
        t0 = time.perf_counter()
        if (
            sh.dialect_lock is not None
            and sh.dialect_lock.name == AUTO
            and (out.source == "raw" or (not out.tool_calls and registry.has_markup(out.content)))
        ):
            # until the first markup settles the dialect, answers with markup are judged one
            # at a time, in the order they arrive (as on the loop): each sees what the last
            # one settled. Answers whose calls the server parsed, and answers without markup,
            # go at once (they settle it too, out of order): queued here, every verdict of a
            # run with server-parsed calls waited for all the others'.
            async with sh.settling:
                ask = replace(ask, dialect=sh.dialect)
                result = await judge.classify(ask)
                if isinstance(result, Verdict):
                    sh.dialect_lock.observe(result.evidence)
        else:
            result = await judge.classify(ask)
        if sh.on_judged is not None:
            sh.on_judged(time.perf_counter() - t0)
        if isinstance(result, Failed):
            return failed_verdict(result, self.plan.index, turn)
        return result

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
            "tier": verdict.tier,
            "noncanonical": verdict.noncanonical,
            "transport_error": str(out.failure) if out.failure else None,
            "http_status": out.status,
            "sim_injected": out.sim_injected,
            "content": out.content,
            "reasoning": out.reasoning,
            "tool_calls": verdict.tool_calls if verdict.tool_calls else out.tool_calls,
            "evidence": verdict.evidence,
            "dialect": sh.dialect,
        }
        self._workload_fields(cast(dict[str, Any], record))
        try:
            sh.writer.write(record)
        except Unencodable as exc:
            # parsed arguments that cannot be written again (a lone surrogate, nesting past
            # the encoder's depth): the calls are stored as they arrived
            record["tool_calls"] = out.tool_calls
            record["evidence"] = {**verdict.evidence, "stored_as_received": str(exc)}
            try:
                sh.writer.write(record)
            except Unencodable as again:
                failed = harness_error(again, "recording the turn", self.plan.index, turn)
                record.update(
                    {"label": failed.label, "corrupted": False, "content": "", "reasoning": "",
                     "tool_calls": [], "evidence": failed.evidence}
                )  # fmt: skip
                sh.writer.write(record)
        if sh.on_turn is not None:
            sh.on_turn(record)
        return record

    def _workload_fields(self, record: dict[str, Any]) -> None:
        """Workload facts on the turn record, only where the workload uses them."""
        plan, wl = self.plan, self.shared.workload
        if wl.capacity is not None:
            record["kv_capacity"] = wl.capacity
        if plan.think_time_s[1] > 0:
            record["think_s"] = round(self.think_s, 3)
        if plan.group is not None:
            record["prefix_group"] = plan.group
        if plan.parent is not None:
            record["branch_of"] = plan.parent

    async def run(self) -> None:
        try:
            await self._start()
            if self.ended is None:
                await self._run()
        finally:
            self._fork(None)  # forks still waiting for this session get nothing
            if self.shared.transcripts is not None:
                self.shared.transcripts.finished(self.plan.index)

    async def _start(self) -> None:
        """Resolve the KV capacity (and the pressure plan), then a fork's shared history."""
        sh = self.shared
        if sh.scenario.pressure is not None or sh.scenario.kv_capacity is not None:
            await self._resolve_capacity()
        if self.plan.parent is None or self.plan.parent not in sh.workload.members:
            return  # a root; or a fork whose parent is not running here: it replays the history
        history = await sh.workload.fork_point(self.plan.parent)
        if history is None:
            self.ended = "parent ended before the branch"
            return
        messages, context_text = history
        self.messages = json.loads(json.dumps(messages))
        self.context_text = context_text
        self.first_turn = self.plan.branch_at

    async def _resolve_capacity(self) -> None:
        sh, wl = self.shared, self.shared.workload
        if wl.capacity_known is None:
            wl.capacity_known = asyncio.Event()
        if not wl.resolving:  # the first session asks; the others wait for its answer
            wl.resolving = True
            try:
                source = "scenario"
                capacity = sh.scenario.kv_capacity
                if capacity is None:
                    capacity, source = await server_capacity(sh.client), "server"
                if capacity is None:
                    log.warning(
                        "the server does not say its KV capacity and the scenario has no "
                        "kv_capacity: the sessions keep the scenario's growth, pressure unknown"
                    )
                elif sh.scenario.pressure is not None:
                    wl.plan = plan_pressure(sh.scenario, capacity, sh.scenario.sessions, source)
                    log.info("%s", wl.plan.describe())
                wl.capacity = capacity
            finally:
                wl.capacity_known.set()
        await wl.capacity_known.wait()
        if wl.plan is not None and self.plan.max_context != wl.plan.max_context:
            self.plan = replace(self.plan, max_context=wl.plan.max_context)

    def _fork(self, turn: int | None) -> None:
        """A root hands its history to its forks at their branch turn (None: it ended)."""
        scenario = self.shared.scenario
        if scenario.branches <= 1 or self.plan.parent is not None:
            return
        if turn is not None and turn != scenario.branch_at:
            return
        fut = self.shared.workload.fork_point(self.plan.index)
        if not fut.done():
            history = (json.loads(json.dumps(self.messages)), self.context_text)
            fut.set_result(None if turn is None else history)

    async def _attempts(self, turn: int) -> tuple[TurnOutput, Verdict] | None:
        """Send one turn until it comes back usable: transport failures are retried with
        backoff (or the server's Retry-After), corrupted answers re-sent (``--on-corruption
        retry``), a failure in which the server says its output was no text among them (a
        corrupted answer, not a transport failure); None when the attempts run out. Every
        send is its own row (``attempt`` counts the rows: a send the server dropped
        unanswered and that was sent again is one, within the same try). ``ServerWatch`` ends
        the variant when its server refuses the requests or stopped answering."""
        sh = self.shared
        attempt = 0
        for tried in range(sh.scenario.max_attempts):
            out, verdict, record = await self.send(turn, attempt)
            attempt = record["attempt"] + 1
            if sh.watch is not None:
                sh.watch.check(out.failure)
            if out.failure is not None and not verdict.corrupted:
                if tried + 1 < sh.scenario.max_attempts:
                    await asyncio.sleep(retry_delay(out.failure, sh.retry_delay_s * (2**tried)))
                continue
            if verdict.corrupted and sh.on_corruption == "retry":
                continue
            return out, verdict
        return None

    async def _usable(self, turn: int) -> tuple[TurnOutput, Verdict, list[Any]] | None:
        """The turn sent until it is usable (``_attempts``), with its tool calls; None when
        the session ends on it, ``ended`` saying why: its attempts ran out, or it came back
        corrupted."""
        result = await self._attempts(turn)
        if result is None:
            self.ended = EXHAUSTED
            return None
        out, verdict = result
        if verdict.corrupted:
            self.ended = "corrupted"
            return None
        calls = verdict.tool_calls if verdict.label in (L.OK_TOOL_CALL, L.PARSER_LEAK) else []
        return out, verdict, calls

    async def _run(self) -> None:
        sh = self.shared
        for turn in range(self.first_turn, self.plan.max_turns):
            self._fork(turn)
            self.think_s = self.plan.think_s(turn) if turn > self.first_turn else 0.0
            if self.think_s > 0:
                await asyncio.sleep(self.think_s)  # the tool takes its time; the session idles
            usable = await self._usable(turn)
            if usable is None:
                return
            out, verdict, calls = usable
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
            try:
                self._extend(turn, out, calls)
            except Exception as exc:  # noqa: BLE001 - the harness's failure, not the server's
                harness_error(exc, "running the tool calls", self.plan.index, turn)
                self.ended = L.HARNESS_ERROR
                return
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
        doc = document_chunk(self.plan.seed_for(turn) + turn, max(50, self._budget(turn, out) - 30))
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
            raw_args = call.get("arguments")
            args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
            name = str(call.get("name"))
            openai_calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": _arguments(args)},
                }
            )
            kind = self.kinds.get(name, "echo")
            text = run_tool(kind, args, seed=self.plan.seed_for(turn) + turn, budget_tokens=budget)
            results.append({"role": "tool", "tool_call_id": call_id, "content": text})
        self.messages.append(
            {
                "role": "assistant",
                "content": out.content or None,
                "tool_calls": openai_calls,
            }
        )
        if self.shared.scenario.passkeys and results:
            self._passkey(turn, calls, results)
        self.messages.extend(results)
        self.context_text = "\n".join(r["content"] for r in results)[-_CONTEXT_CHARS:]

    def _passkey(
        self, turn: int, calls: list[dict[str, Any]], results: list[dict[str, Any]]
    ) -> None:
        """--passkeys: the first results carry the session's passkey, the ask turn's results
        ask for it back (harness.workload.passkeys); the passkey tool answers plainly."""
        for call, result in zip(calls, results, strict=True):
            if call.get("name") == passkeys.TOOL:
                result["content"] = passkeys.RESULT
        if turn == passkeys.PLANT_TURN:
            key = passkeys.passkey_for(self.plan.seed_for(0))
            results[0]["content"] += passkeys.plant_text(key)
        if turn == passkeys.ask_turn(self.plan.steps, self.plan.max_turns):
            results[-1]["content"] += passkeys.ASK_TEXT
