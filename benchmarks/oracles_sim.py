"""The exact oracles against the simulator's ground truth at a production-like rate.

Two variants of the simulator in its deterministic mode: index_k=bf16 (its race on, at the
default odds: a few corrupted turns in 10,000 at this load and context) and index_k=fp8 (no
race); or, with ``--fault-rate R``, the shipped simulator target at an exact rate R in one
variant and none in the other (``--ab fault_rate=0,R``). ``harness run --oracle replay
--passkeys`` drives both; this prints, per variant and oracle, the sends checked, the sends
the simulator injected, and precision and recall against that ground truth, with the
headline rates, the turn comparison and how many turns it took to be significant.

    python benchmarks/oracles_sim.py --sessions 1200 --turns 9 --out oracles-sim
    python benchmarks/oracles_sim.py --fault-rate 0.0003 --sessions 3000 --speed 1000 \
        --seed 7 --out rate-sim
    python benchmarks/oracles_sim.py --read rate-sim     # the numbers of a finished run
    python benchmarks/oracles_sim.py --fault-rate 0.0003 --no-baseline --no-replay \
        --turns 3 --sessions 5000 --speed 1000 --seed 21 --out asks-21   # passkey asks only
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.record.rundir import ORACLE_PASSKEY_FILE, ORACLE_REPLAY_FILE  # noqa: E402
from harness.record.turns import read_rows, read_turns  # noqa: E402

TARGET = """
name = "sim"
mode = "launch"
model = "deepseek-ai/DeepSeek-V4-Flash"
warm_up = false
flush_cache = false

[launch]
command = ["{{python}}", "-m", "harness.sim", "--host", "{{host}}", "--port", "{{port}}",
           "--model", "{{model}}", "--enable-deterministic-inference", "--fault-scale", "{scale}"]
stop_grace_s = 5

[ready]
paths = ["/health_generate", "/health"]
timeout_s = 60
interval_s = 0.1

[factors.index_k.fp8]
args = ["--index-k", "fp8"]
[factors.index_k.bf16]
args = ["--index-k", "bf16"]
"""


def injected(r: dict[str, Any]) -> bool:
    return r.get("sim_injected") not in (None, "none")


def score(rows: list[dict[str, Any]], bad_status: set[str]) -> dict[str, Any]:
    bad = [r for r in rows if r.get("status") in bad_status]
    truth = [r for r in rows if injected(r)]
    hit = [r for r in bad if injected(r)]
    return {
        "checked": len(rows),
        "injected": len(truth),
        "flagged": len(bad),
        "precision": len(hit) / len(bad) if bad else None,
        "recall": len([r for r in truth if r.get("status") in bad_status]) / len(truth)
        if truth
        else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sessions", type=int, default=1200)
    p.add_argument("--turns", type=int, default=9)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--scale", type=float, default=1.0, help="the simulator's --fault-scale")
    p.add_argument("--out", type=Path, default=Path("oracles-sim"))
    p.add_argument("--ab", default="index_k=fp8,bf16", help="the variants (index_k levels)")
    p.add_argument(
        "--fault-rate", type=float, help="an exact rate in one variant, none in the other"
    )
    p.add_argument("--speed", type=float, default=50.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--read", type=Path, help="only read a finished run folder")
    p.add_argument("--no-replay", action="store_true", help="the passkeys only (cheaper)")
    p.add_argument(
        "--no-baseline", action="store_true", help="with --fault-rate: no fault_rate=0 variant"
    )
    args = p.parse_args()
    if args.read is None:
        args.out.mkdir(parents=True, exist_ok=True)
        if args.fault_rate is None:
            target = args.out.parent / (args.out.name + "-target.toml")
            target.write_text(TARGET.format(scale=args.scale))
            variants = ["--target", str(target), "--ab", args.ab]
        else:  # the shipped simulator target: its fault_rate and deterministic factors
            levels = f"{args.fault_rate:g}" if args.no_baseline else f"0,{args.fault_rate:g}"
            variants = ["--ab", f"fault_rate={levels}", "--ab", "deterministic=on"]
        oracles = ["--passkeys"] if args.no_replay else ["--oracle", "replay", "--passkeys"]
        cmd = [
            sys.executable, "-m", "harness.cli", "run", *variants, "--sessions", str(args.sessions),
            "--concurrency", str(args.concurrency), "--turns", str(args.turns),
            "--max-context", "24000", "--speed", f"{args.speed:g}", "--seed", str(args.seed),
            *oracles, "--no-progress", "--out", str(args.out),
        ]  # fmt: skip
        subprocess.run(cmd, check=False, cwd=ROOT)
    print(json.dumps(measure(args.read or args.out), indent=2))


def measure(run: Path) -> dict[str, Any]:
    """Per variant: turns, injected turns, each oracle scored against the ground truth, the
    headline rate; and the turn comparison with its onset (summary.json)."""
    turns = read_turns(run / "turns.jsonl")
    replay = read_rows(run / ORACLE_REPLAY_FILE)
    passkey = read_rows(run / ORACLE_PASSKEY_FILE)
    summary = json.loads((run / "summary.json").read_text())
    by = {v["label"]: v for v in summary["variants"]}
    out: dict[str, Any] = {}
    for variant in sorted({t["variant"] for t in turns}):
        mine = [t for t in turns if t["variant"] == variant]
        v = by.get(variant, {})
        out[variant] = {
            "turns": len(mine),
            "injected_turns": sum(map(injected, mine)),
            "injected_kinds": dict(Counter(t["sim_injected"] for t in mine if injected(t))),
            "replay": score([r for r in replay if r["variant"] == variant], {"diverged"}),
            "passkey": score([r for r in passkey if r["variant"] == variant], {"wrong", "missing"}),
            "headline": {k: v.get(k) for k in (
                "classified_turns", "corrupted_turns", "turn_corruption_rate",
                "turn_corruption_ci", "corrupted_sessions", "sessions", "headline_basis",
                "suspect_turns", "sim_recall", "sim_precision", "sim_false_alarms",
                "sim_suspect_false_alarms")},
        }  # fmt: skip
    out["comparisons"] = [
        {k: c.get(k) for k in ("a", "b", "unit", "k_a", "n_a", "k_b", "n_b", "p_value", "onset")}
        for c in summary["comparisons"]
    ]
    return out


if __name__ == "__main__":
    main()
