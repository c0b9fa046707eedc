"""Ready-to-run ``harness replay`` lines for the corrupted sessions of a run.

Each corrupted session (variant, repeat, session) gets one command line, in the order the
sessions first corrupted; ``--variant`` only when the run has more than one variant,
``--repeat`` only when it has more than one repeat. The report lists them under
"Reproduce a corrupted session"; the terminal shows the first few after the table.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pandas as pd

#: How many lines the report lists (the terminal shows fewer).
MOST = 10


def replay_lines(turns: pd.DataFrame, run_dir: Path | str, most: int = MOST) -> dict[str, Any]:
    """``{"count": corrupted sessions, "lines": the first ``most`` command lines}``."""
    if turns.empty or "is_corrupted" not in turns:
        return {"count": 0, "lines": []}
    bad = turns[turns["is_corrupted"]]
    keys = ["variant", "repeat", "session"]
    if bad.empty or not all(k in bad for k in keys):
        return {"count": 0, "lines": []}
    order = ["sent_at"] if "sent_at" in bad else []
    firsts = bad.sort_values(order + keys, kind="stable").drop_duplicates(keys)
    several_variants = turns["variant"].nunique() > 1
    several_repeats = turns["repeat"].nunique() > 1
    lines = []
    for row in firsts.head(most).itertuples(index=False):
        args = ["harness", "replay", str(run_dir), "--session", str(int(row.session))]
        if several_variants:
            args += ["--variant", str(row.variant)]
        if several_repeats:
            args += ["--repeat", str(int(row.repeat))]
        lines.append(shlex.join(args))
    return {"count": len(firsts), "lines": lines}


def markdown(summary: Any) -> list[str]:
    """The report's section: the command lines, ready to paste."""
    replays = summary.get("replays") or {}
    lines = replays.get("lines") or []
    if not lines:
        return []
    count = replays.get("count", len(lines))
    shown = f"the first {len(lines)} of {count}" if count > len(lines) else f"all {count}"
    return [
        "",
        "## Reproduce a corrupted session",
        "",
        f"Re-send the first corrupted turn of a session, alone and under load ({shown} "
        "corrupted sessions; `harness replay --help` for more):",
        "",
        "```sh",
        *lines,
        "```",
    ]
