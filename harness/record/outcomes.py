"""``outcomes.json``: one entry per finished variant (harness.run.execute.VariantOutcome),
and what the reports say of a variant whose server died under the load."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.record.rundir import OUTCOMES_FILE


def server_deaths(run_dir: Path) -> list[dict[str, Any]]:
    """The variants whose server died under the load (outcomes.json's ``server_death``)."""
    loaded: Any = []
    with contextlib.suppress(OSError, json.JSONDecodeError):
        loaded = json.loads((run_dir / OUTCOMES_FILE).read_text(encoding="utf-8"))
    if not isinstance(loaded, list):
        return []
    return [o["server_death"] for o in loaded
            if isinstance(o, dict) and isinstance(o.get("server_death"), dict)]  # fmt: skip


def death_line(death: Mapping[str, Any]) -> str:
    """ "index_k=bf16: its server was killed by SIGSEGV 37 s into the load, after 3 turns"."""
    how = (f"was killed by {death['signal']}" if death.get("signal")
           else f"exited with code {death.get('exit_code')}")  # fmt: skip
    when = f" {death['after_s']:.0f} s into the load" if death.get("after_s") is not None else ""
    turns = death.get("turns_done")
    after = f", after {turns} turn{'s' * (turns != 1)}" if turns is not None else ""
    repeat = f" (repeat {death['repeat']})" if death.get("repeat") else ""
    return f"{death.get('variant')}{repeat}: its server {how}{when}{after}"
