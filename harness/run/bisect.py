"""``harness bisect``: the first good (or first bad) level of a factor, by runs down the
middle of an ordered range of levels (the releases of an engine's wheel on the registry).

Each level is run once, as a run of its own (``harness run RUN_ARGS --ab FACTOR=LEVEL
--out OUT/FACTOR=LEVEL``, a child process), and kept: a bisect started again over the same
folder reuses every level that finished. A level is **bad** when its server died under the
load, or when its sessions corrupt significantly more than the good end's (Fisher's exact
test, one-sided, ``p < alpha``). The comparison reads both runs' turns together, so that
with greedy sampling each answer is also held against the good end's answer to the same
request (``analysis.crossvariant``: an answer cut short against it is corrupted, a suspect
written byte for byte the same is acquitted).

The good end is run first, then the bad end, which must be bad (else the range shows
nothing to bisect, said with its numbers); then the middle of what is left, until two
neighbours differ.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.analysis import stats, summary
from harness.errors import InfrastructureError, UsageError
from harness.record.outcomes import server_deaths
from harness.record.rundir import RUN_FILE, SUMMARY_FILE

log = logging.getLogger(__name__)

_RELEASE = re.compile(r"[0-9]+(?:\.[0-9]+)*")


@dataclass
class LevelResult:
    level: str
    run_dir: str
    sessions: int
    corrupted_sessions: int
    crashed: str | None  # how its server died under the load, when it did
    p_value: float | None  # one-sided, against the good end (None for the good end)
    bad: bool
    reused: bool


def version_key(level: str) -> tuple[int, ...]:
    """``"0.1.11"`` -> ``(0, 1, 11)``: release versions in their order."""
    return tuple(int(x) for x in level.split("."))


def registry_versions(package: str) -> list[str]:
    """The release versions of ``package`` on the package registry pip is set up for, oldest
    first (``pip index versions``; pre-releases left out)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", package,
           "--disable-pip-version-check"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = re.search(r"Available versions:\s*(.+)", done.stdout)
    if done.returncode != 0 or found is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise InfrastructureError(
            f"could not list the versions of {package} on the package registry "
            f"(pip index versions {package}: {tail[0]}); give them with --levels"
        )
    versions = [v.strip() for v in found.group(1).split(",")]
    return sorted((v for v in versions if _RELEASE.fullmatch(v)), key=version_key)


def between(levels: Sequence[str], good: str, bad: str) -> list[str]:
    """The levels from ``bad`` to ``good``, both included, in that direction."""
    for end, name in ((good, "--good"), (bad, "--bad")):
        if end not in levels:
            raise UsageError(f"{name} {end}: not among the levels ({', '.join(levels) or 'none'})")
    i, j = levels.index(bad), levels.index(good)
    if i == j:
        raise UsageError("--good and --bad name the same level")
    return list(levels[i : j + 1]) if i < j else list(reversed(levels[j : i + 1]))


def counts(runs: dict[str, Path]) -> dict[str, tuple[int, int]]:
    """level -> (corrupted sessions, sessions), the runs' turns read together (each level
    a variant), so that their answers to the same requests are compared."""
    frames = []
    greedy = True
    for level, run_dir in runs.items():
        meta = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
        greedy = greedy and meta.get("temperature") == 0
        frame = summary.turn_frame(run_dir, greedy=True)
        frame["variant"] = level
        frames.append(frame)
    both = pd.concat(frames, ignore_index=True)
    both = summary.prepare(summary.with_reference(both) if greedy else both)
    ok = both[~both["is_transport"] & ~both["is_harness"]]
    per = ok.groupby(["variant", "repeat", "session"])["is_corrupted"].any()
    out = {}
    for level in runs:
        mine = per[per.index.get_level_values(0) == level]
        out[level] = (int(mine.sum()), int(mine.size))
    return out


class Bisect:
    """Runs levels of ``factor`` with ``run_args`` under ``out`` and finds the boundary."""

    def __init__(
        self,
        factor: str,
        out: Path,
        run_args: Sequence[str],
        *,
        alpha: float = 0.01,
        say: Callable[[str], None] = print,
    ) -> None:
        self.factor = factor
        self.out = out
        self.run_args = list(run_args)
        self.alpha = alpha
        self.say = say
        self.results: dict[str, LevelResult] = {}

    def run_dir(self, level: str) -> Path:
        return self.out / f"{self.factor}={level}"

    def _run(self, level: str) -> bool:
        """Run ``level`` unless a finished run of it is there; whether it was reused."""
        run_dir = self.run_dir(level)
        if (run_dir / SUMMARY_FILE).is_file() and _finished(run_dir):
            self.say(f"{self.factor}={level}: reusing the finished run in {run_dir}")
            return True
        if run_dir.exists():
            raise UsageError(
                f"{run_dir} holds a run of {self.factor}={level} that did not finish: finish "
                f"it (harness run --resume {run_dir}) or remove it, then bisect again"
            )
        cmd = [sys.executable, "-m", "harness.cli.main", "run", *self.run_args,
               "--ab", f"{self.factor}={level}", "--out", str(run_dir)]  # fmt: skip
        self.say(f"{self.factor}={level}: running ({run_dir})")
        done = subprocess.run(cmd, check=False)
        if done.returncode not in (0, 1, 3) or not (run_dir / SUMMARY_FILE).is_file():
            raise InfrastructureError(
                f"the run of {self.factor}={level} ended with exit code {done.returncode} "
                f"and no report (its output is above; the folder is {run_dir})"
            )
        return False

    def judge(self, level: str, good: str) -> LevelResult:
        if level in self.results:
            return self.results[level]
        reused = self._run(level)
        deaths = server_deaths(self.run_dir(level))
        crashed = _crash_text(deaths[0]) if deaths else None
        if level == good:
            k, n = counts({level: self.run_dir(level)})[level]
            p, bad = None, crashed is not None
        else:
            both = counts({good: self.run_dir(good), level: self.run_dir(level)})
            (k, n), (kg, ng) = both[level], both[good]
            p = stats.fisher_exact(k, n, kg, ng, alternative="greater")
            bad = crashed is not None or p < self.alpha
        result = LevelResult(level, str(self.run_dir(level)), n, k, crashed, p, bad, reused)
        self.results[level] = result
        self.say(_line(self.factor, result))
        return result

    def search(self, order: Sequence[str]) -> tuple[str, str]:
        """``order`` runs from the bad end to the good end: (the last bad, the first good)."""
        bad_end, good_end = order[0], order[-1]
        if self.judge(good_end, good_end).bad:
            raise UsageError(
                f"the good end {self.factor}={good_end} is not good: its server died "
                f"({self.results[good_end].crashed}); pick another --good"
            )
        if not self.judge(bad_end, good_end).bad:
            r = self.results[bad_end]
            raise UsageError(
                f"the bad end {self.factor}={bad_end} does not corrupt significantly more than "
                f"{good_end} ({r.corrupted_sessions}/{r.sessions} sessions, one-sided p = "
                f"{r.p_value:.3g} >= {self.alpha}): nothing to bisect with these settings; "
                "more sessions (--sessions) or another --bad"
            )
        lo, hi = 0, len(order) - 1  # order[lo] bad, order[hi] good
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.judge(order[mid], good_end).bad:
                lo = mid
            else:
                hi = mid
        return order[lo], order[hi]

    def report(self, last_bad: str, first_good: str, order: Sequence[str]) -> dict[str, Any]:
        result = {
            "factor": self.factor,
            "order": list(order),
            "last_bad": last_bad,
            "first_good": first_good,
            "alpha": self.alpha,
            "levels": [asdict(self.results[lv]) for lv in order if lv in self.results],
        }
        (self.out / "bisect.json").write_text(json.dumps(result, indent=2) + "\n")
        return result


def _finished(run_dir: Path) -> bool:
    try:
        meta = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return bool(meta.get("finished_at")) and not meta.get("interrupted")


def _crash_text(death: dict[str, Any]) -> str:
    how = death.get("signal") or f"exit code {death.get('exit_code')}"
    return f"{how} after {death.get('turns_done')} turns"


def _line(factor: str, r: LevelResult) -> str:
    rate = f"{r.corrupted_sessions}/{r.sessions} sessions corrupted"
    vs = f", p = {r.p_value:.3g} against the good end" if r.p_value is not None else ""
    crash = f", its server crashed ({r.crashed})" if r.crashed else ""
    verdict = "BAD" if r.bad else "good"
    return f"{factor}={r.level}: {verdict}: {rate}{vs}{crash}"
