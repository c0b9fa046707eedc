"""How well a run finds the simulator's injected damage, per dialect the simulator writes.

For each dialect and seed: ``harness sim --dialect X`` (a real process on a loopback port,
corruption odds at their cap), then ``harness run --endpoint URL --dialect X --sessions 20
--turns 6``; the turns are scored against the simulator's ground truth (``sim_injected``).
Prints one Markdown row per dialect: clean turns and false alarms, envelope damage (the
``envelope`` and ``json`` kinds) found, every injected kind found, with 95% Wilson intervals.

    python benchmarks/sim_dialects.py [--seeds 3] [--dialects a,b]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.analysis.stats import wilson
from harness.record.turns import read_turns
from harness.sim.speaker import spoken


def _sim(dialect: str, seed: int, port_file: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.sim",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--dialect",
            dialect,
            "--seed",
            str(seed),
            "--speed",
            "200",
            "--fault-scale",
            "1e6",
            "--log-level",
            "warning",
        ],  # fmt: skip
    )


def one(dialect: str, seed: int, work: Path) -> list[dict[str, object]]:
    port_file = work / f"{dialect}-{seed}.port"
    proc = _sim(dialect, seed, port_file)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the sim for {dialect} did not start")
            time.sleep(0.05)
        url = f"http://127.0.0.1:{int(port_file.read_text())}"
        out = work / f"{dialect}-{seed}"
        # room for re-sends: at the capped odds a session with three corrupted sends in a row
        # would end "attempts exhausted" (and a run with many such is exit 3)
        scenario = work / "patient.toml"
        shipped = Path(__file__).resolve().parents[1] / "scenarios" / "coding_agent.toml"
        scenario.write_text(shipped.read_text().replace("max_attempts = 3 ", "max_attempts = 12 "))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "harness.cli",
                "run",
                "--endpoint",
                url,
                "--dialect",
                dialect,
                "--sessions",
                "20",
                "--turns",
                "6",
                "--seed",
                str(seed),
                "--out",
                str(out),
                "--no-progress",
            ],  # fmt: skip
            check=True,
            capture_output=True,
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return list(read_turns(out / "turns.jsonl"))  # type: ignore[arg-type]


def _rate(k: int, n: int) -> str:
    lo, hi = wilson(k, n, 0.95)
    return f"{k}/{n} ({lo:.3f}-{hi:.3f})" if n else "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--dialects", default=",".join(spoken()))
    args = p.parse_args()
    head = ("dialect", "clean turns called corrupted", "envelope damage found",
            "every injected kind found")  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for dialect in args.dialects.split(","):
            rows = [r for seed in range(1, args.seeds + 1) for r in one(dialect, seed, Path(tmp))]
            clean = [r for r in rows if r["sim_injected"] == "none"]
            hurt = [r for r in rows if r["sim_injected"] not in ("none", None)]
            env = [r for r in hurt if r["sim_injected"] in ("envelope", "json")]
            print(f"| {dialect} | {_rate(sum(bool(r['corrupted']) for r in clean), len(clean))} "
                  f"| {_rate(sum(bool(r['corrupted']) for r in env), len(env))} "
                  f"| {_rate(sum(bool(r['corrupted']) for r in hurt), len(hurt))} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
