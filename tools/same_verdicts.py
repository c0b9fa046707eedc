"""Whether two versions of the code give every answer the same verdict, byte for byte.

A change meant to make ``classify_turn`` cheaper must not change one output. This command
classifies every text of the given JSONL files (their ``text``, ``reasoning`` and
``tool_calls`` fields) the ways a run does: as a server's message (the calls parsed by the
server) and as raw output with the dialect ``auto`` and ``dsml-v4``; then the answers of
``benchmarks/perf_judging.py`` and random slices and concatenations of the texts (a seeded
draw, some of them with a context), and writes one line per verdict: its label, corrupted,
noncanonical, tool calls, evidence and tier as ``repr`` (floats exact, dict order kept).

    PYTHONPATH=<old tree> python -m tools.same_verdicts dump old.txt FILE.jsonl ...
    PYTHONPATH=<new tree> python -m tools.same_verdicts dump new.txt FILE.jsonl ...
    python -m tools.same_verdicts compare old.txt new.txt
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.dialects import registry
from harness.dialects.base import ToolCall
from harness.verdict.turn import Verdict, classify_turn

#: Slices and concatenations drawn from the texts.
MIXES = 3000
_DIALECTS = ("auto", "dsml-v4")


def _load(paths: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            rows.extend(json.loads(line) for line in fh if line.strip())
    return rows


def _calls(row: dict[str, Any]) -> list[dict[str, Any]]:
    calls = row.get("tool_calls") or []
    out = []
    for c in calls if isinstance(calls, list) else []:
        if isinstance(c, dict):
            inner = c.get("function")
            fn: dict[str, Any] = inner if isinstance(inner, dict) else c
            args = fn.get("arguments", "")
            out.append({"name": fn.get("name", ""), "arguments": args})
    return out


def _markup_texts(rows: list[dict[str, Any]]) -> list[str]:
    """Turns in the markup of every dialect, with the texts' own calls (so that the slices
    and concatenations cut markup open and put it in prose)."""
    out: list[str] = []
    calls = [c for r in rows for c in _calls(r)][:40] or [{"name": "f", "arguments": "{}"}]
    for k, name in enumerate(n for n in registry.names() if n not in ("auto", "none", "json")):
        for j in range(3):
            picked = [calls[(k * 3 + j + i) % len(calls)] for i in range(j % 2 + 1)]
            tc = []
            for c in picked:
                args = c["arguments"]
                try:
                    args = json.loads(args or "{}") if isinstance(args, str) else args
                except ValueError:
                    args = {}
                tc.append(ToolCall(str(c["name"]) or "f", args if isinstance(args, dict) else {}))
            prose = str(rows[(k + j) % len(rows)].get("text") or "")[:300] if j else ""
            for content, some in ((prose, tc), (prose, tc[:1]), ("", tc), ("", tc[:1])):
                try:  # (some dialects write one call a turn, or no content with calls)
                    out.append(registry.get(name).encode(content, some))
                    break
                except ValueError:
                    continue
    return out


def _line(case: str, v: Verdict) -> str:
    return repr((case, v.label, v.corrupted, v.noncanonical, v.tool_calls, v.evidence, v.tier))


def _cases(rows: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(a name, ``classify_turn``'s arguments) of every case."""
    for i, row in enumerate(rows):
        text, reasoning = str(row.get("text") or ""), str(row.get("reasoning") or "")
        yield f"{i}:server", {"content": text, "reasoning": reasoning, "tool_calls": _calls(row)}
        for d in _DIALECTS:
            yield f"{i}:raw:{d}", {"content": text, "reasoning": reasoning, "dialect": d}
    texts = [str(r.get("text") or "") for r in rows]
    texts += [str(r.get("reasoning")) for r in rows if r.get("reasoning")]
    texts = [t for t in texts if t]
    marked = _markup_texts(rows)
    for j, text in enumerate(marked):
        yield f"markup{j}:server", {"content": text}
        for d in _DIALECTS:
            yield f"markup{j}:raw:{d}", {"content": text, "dialect": d}
    texts += marked * max(1, len(texts) // (10 * len(marked)))  # a tenth of the draws
    rng = random.Random(20261205)
    for k in range(MIXES):
        a = rng.choice(texts)
        if k % 3 == 0:
            text = a + rng.choice(("", " ", "\n", "\n\n")) + rng.choice(texts)
        else:
            lo = rng.randrange(len(a))
            text = a[lo : lo + rng.randint(1, 4000)]
        context = rng.choice(texts)[-8000:] if k % 4 == 0 else None
        thought = rng.choice(texts)[:2000] if k % 5 == 0 else ""
        yield f"mix{k}:server", {"content": text, "reasoning": thought, "context": context}
        yield f"mix{k}:raw", {"content": text, "dialect": _DIALECTS[k % 2], "context": context}


def dump(out: str, paths: list[str], bench: int) -> int:
    rows = _load(paths)
    n = 0
    with open(out, "w", encoding="utf-8") as fh:
        for case, kwargs in _cases(rows):
            source = "raw" if ":raw" in case else "server"
            fh.write(_line(case, classify_turn(source=source, **kwargs)) + "\n")
            n += 1
        if bench:
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
            from perf_judging import asks

            for shape in ("parsed", "raw"):
                for j, ask in enumerate(asks(shape, bench)):
                    fh.write(_line(f"bench:{shape}:{j}", ask.classify()) + "\n")
                    n += 1
    print(f"{n} verdicts -> {out}")
    return 0


def compare(old: str, new: str) -> int:
    a = Path(old).read_text(encoding="utf-8").splitlines()
    b = Path(new).read_text(encoding="utf-8").splitlines()
    diff = [i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
    if len(a) != len(b):
        print(f"different counts: {len(a)} and {len(b)} verdicts")
    for i in diff[:5]:
        print(f"line {i + 1}:\n  old {a[i][:600]}\n  new {b[i][:600]}")
    print(f"{len(diff)} differences in {min(len(a), len(b))} verdicts")
    return 1 if diff or len(a) != len(b) else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="classify every case, one verdict a line")
    d.add_argument("out")
    d.add_argument("jsonl", nargs="+")
    d.add_argument("--bench", type=int, default=500, help="perf_judging answers of each shape")
    c = sub.add_parser("compare", help="0 when the two dumps are the same")
    c.add_argument("old")
    c.add_argument("new")
    args = ap.parse_args()
    if args.cmd == "dump":
        return dump(args.out, args.jsonl, args.bench)
    return compare(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())
