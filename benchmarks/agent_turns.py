"""The verdict on real agent traffic: false alarms per turn by source, and what it finds of
corruption made from the same turns.

    python benchmarks/agent_turns.py TURNS.jsonl [--out RESULT.json] [--corrupt K] [--seed N]

TURNS.jsonl holds real, healthy assistant turns of agent sessions, one a line:
``{"id", "text", "tool_calls": [{"name", "arguments"}] | null, "source", "reasoning"?}``
(``source`` names where the turn came from: ``owner/repo:path``; turns are grouped by the
part before ``:``, a whole source at a time). Every turn is classified as a server's answer
(its calls as the server parsed them, ``classify_turn(source="server")``), so:

- ``suspect``: turns the text detector flagged (salad, a loop): its false alarms; of them,
  ``exact``: the loops the text itself confirms (a span repeated back to back to the end),
  which the headline counts without the judge;
- ``structural``: turns the parsers found broken (a malformed or invalid call, markup where
  none can be): the exact tier's false alarms on these real calls.

Both per source with 95 % Wilson intervals, and overall. With ``--corrupt K`` (default 2),
each turn that is prose also gets K corrupted copies made by ``tools.detector.corruptgen`` (salad,
debris, loops: a generator independent of the detector and of the simulator), and the
share the detector flags is reported per source and per kind of corruption.

Each source's false alarms are also counted by kind (``alarm_kinds``: tier, label and the
rule signals that carried the finding; no text). The development set is
``agent_turns_dev.jsonl``; the held-out set is made by ``python -m tools.detector.cassettes``
(real turns recorded in the HTTP cassettes of LLM client libraries' source distributions, one
source per package).

The data this project develops on is not the data it is evaluated on: say which file a
number comes from, and never tune to the strings of the evaluation sets.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.analysis.stats import wilson  # noqa: E402
from harness.verdict import CONFIRMED, STRUCTURAL, SUSPECT, classify_turn  # noqa: E402
from tools.detector import corruptgen  # noqa: E402


def server_calls(calls: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The calls in the OpenAI shape a server returns (arguments as a JSON string)."""
    if not calls:
        return None
    out = []
    for i, c in enumerate(calls):
        args = c.get("arguments")
        text = args if isinstance(args, str) else json.dumps(args or {}, ensure_ascii=False)
        out.append({"id": f"call_{i}", "type": "function",
                    "function": {"name": c.get("name"), "arguments": text}})  # fmt: skip
    return out


def group(source: str) -> str:
    return source.split(":", 1)[0] if source else "unknown"


def rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson(k, n)
    return {"k": k, "n": n, "rate": k / n if n else None, "ci": [lo, hi]}


def kind(v: Any) -> str:
    """What a false alarm is, in words of the verdict (never the text): its tier and label,
    and for the text detector the rule signals in its window (the character model's surprisal,
    a feature of every finding, aside), else "fitted model alone"."""
    signals = v.evidence.get("signals") or {}
    rules = sorted(k for k in signals if k not in ("p_corrupted", "char_surprisal"))
    why = v.evidence.get("reason") or "+".join(rules) or "fitted model alone"
    extra = " (JSON answer)" if v.evidence.get("json_answer") else ""
    return f"{v.tier} {v.label}: {why}{extra}"


def healthy(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    by: dict[str, Counter[str]] = defaultdict(Counter)
    kinds: dict[str, Counter[str]] = defaultdict(Counter)
    alarms: list[dict[str, Any]] = []
    for r in rows:
        calls = server_calls(r.get("tool_calls"))
        text, thought = r.get("text") or "", r.get("reasoning") or ""
        v = classify_turn(text, reasoning=thought, tool_calls=calls, source="server")
        g = group(str(r.get("source", "")))
        by[g]["turns"] += 1
        by[g]["calls"] += bool(r.get("tool_calls"))
        if v.corrupted:
            by[g][SUSPECT if v.tier == CONFIRMED else v.tier] += 1
            by[g]["exact"] += v.tier == CONFIRMED
            kinds[g][kind(v)] += 1
            alarms.append({"id": r.get("id"), "source": g, "label": v.label, "tier": v.tier,
                           "evidence": v.evidence, "text": text[:400]})  # fmt: skip
    out: dict[str, Any] = {}
    total: Counter[str] = Counter()
    for g, c in sorted(by.items()):
        total.update(c)
        out[g] = {"turns": c["turns"], "turns_with_calls": c["calls"],
                  "suspect": rate(c[SUSPECT], c["turns"]), "exact": rate(c["exact"], c["turns"]),
                  "structural": rate(c[STRUCTURAL], c["turns"]),
                  "alarm_kinds": dict(kinds[g].most_common())}  # fmt: skip
    out["all"] = {"turns": total["turns"], "turns_with_calls": total["calls"],
                  "suspect": rate(total[SUSPECT], total["turns"]),
                  "exact": rate(total["exact"], total["turns"]),
                  "structural": rate(total[STRUCTURAL], total["turns"])}  # fmt: skip
    return out, alarms


def corrupted(rows: list[dict[str, Any]], per_turn: int, seed: int) -> dict[str, Any]:
    prose = [r for r in rows if not r.get("tool_calls") and len(r.get("text") or "") >= 40]
    by_source: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in prose:
        by_source[group(str(r.get("source", "")))].append(
            {"id": str(r.get("id")), "text": str(r["text"]), "label": "clean"}
        )
    out: dict[str, Any] = {}
    kinds: dict[str, Counter[str]] = defaultdict(Counter)
    for g, seeds in sorted(by_source.items()):
        made = corruptgen.generate(seeds, seed, per_turn)
        bad = [m for m in made if m["label"] in ("salad", "repetition")]
        found = 0
        for m in bad:
            hit = classify_turn(m["text"], source="server").corrupted
            found += hit
            kind = m["id"].rsplit("-", 2)[-2]
            kinds[kind]["n"] += 1
            kinds[kind]["found"] += hit
        out[g] = rate(found, len(bad))
    out["by_kind"] = {k: rate(c["found"], c["n"]) for k, c in sorted(kinds.items())}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("turns", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--alarms", type=Path, help="write each false alarm here (JSONL)")
    ap.add_argument("--corrupt", type=int, default=2, help="corrupted copies a prose turn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample", type=int, default=0, help="a seeded sample of N turns")
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.turns.read_text(encoding="utf-8").splitlines()]
    if args.sample and args.sample < len(rows):
        rows = random.Random(args.seed).sample(rows, args.sample)
    t0 = time.perf_counter()
    clean, alarms = healthy(rows)
    result: dict[str, Any] = {"data": str(args.turns.name), "healthy": clean}
    if args.corrupt:
        result["corrupted"] = corrupted(rows, args.corrupt, args.seed)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    for g, c in clean.items():
        s, st = c["suspect"], c["structural"]
        print(f"{g:32s} turns {c['turns']:6d}  suspect {s['k']:4d} {100 * s['rate']:.2f}% "
              f"[{100 * s['ci'][0]:.2f}, {100 * s['ci'][1]:.2f}] (exact {c['exact']['k']})  "
              f"structural {st['k']:3d} "
              f"{100 * st['rate']:.3f}% of {c['turns_with_calls']} with calls")  # fmt: skip
    for g, c in clean.items():
        for k, n in (c.get("alarm_kinds") or {}).items():
            print(f"alarm {g:32s} {n:4d}  {k}")
    for g, r in (result.get("corrupted") or {}).items():
        if g != "by_kind" and r["n"]:
            print(f"found {g:26s} {r['k']:5d}/{r['n']:5d} = {r['rate']:.3f}")
    for kind, r in (result.get("corrupted") or {}).get("by_kind", {}).items():
        print(f"found {kind:26s} {r['k']:5d}/{r['n']:5d} = {r['rate']:.3f}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if args.alarms:
        with open(args.alarms, "w", encoding="utf-8") as fh:
            for a in alarms:
                fh.write(json.dumps(a, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
