"""``--until-significant``: stop adding rounds of sessions once every comparison is decided."""

from __future__ import annotations

from pathlib import Path

from harness.record.turns import iter_turns


def decision(
    turns_path: Path, labels: list[str], *, look: int, looks: int, alpha: float
) -> tuple[bool, str]:
    """Stop adding sessions? Every variant against the baseline (Fisher, two-sided) at
    alpha / looks: a Bonferroni split of alpha over the planned looks keeps the chance of a
    false "significant" at most alpha however many looks are taken (conservative)."""
    from harness.analysis.stats import fisher_exact  # scipy: only when a run takes looks

    bad: dict[str, set[tuple[int, int]]] = {v: set() for v in labels}
    seen: dict[str, set[tuple[int, int]]] = {v: set() for v in labels}
    for rec in iter_turns(turns_path):
        v = rec.get("variant", "")
        if v not in seen or rec.get("transport_error"):
            continue
        key = (rec.get("repeat", 0), rec["session"])
        seen[v].add(key)
        if rec.get("corrupted"):
            bad[v].add(key)
    base = labels[0]
    level = alpha / looks
    pending = []
    for v in labels[1:]:
        p = fisher_exact(len(bad[base]), len(seen[base]), len(bad[v]), len(seen[v]))
        if p >= level:
            pending.append(f"{v} p={p:.3g}")
    if not pending:
        return True, f"every comparison decided at p < {level:.3g} (alpha {alpha} / {looks} looks)"
    if look >= looks:
        return True, f"budget spent; undecided: {', '.join(pending)}"
    return False, f"undecided at p < {level:.3g}: {', '.join(pending)}"
