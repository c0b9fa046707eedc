"""``RunOptions`` for a test run on one endpoint, from flat keywords sorted into their groups."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from harness.run.options import AfterLoad, Endpoint, LoadSpec, RunOptions, Schedule
from harness.workload.matrix import Variant
from harness.workload.scenario import Scenario

_GROUPS = {
    name: group
    for group in ("endpoint", "load", "after")
    for name in (
        f.name for f in fields({"endpoint": Endpoint, "load": LoadSpec, "after": AfterLoad}[group])
    )  # fmt: skip
}


def endpoint_options(
    scenario: Scenario, out: Path, url: str, sessions: int, **flat: Any
) -> RunOptions:
    """``sessions`` at once against ``url`` (model "m", 20 s timeout); ``flat``: any field
    of ``Endpoint``, ``LoadSpec`` or ``AfterLoad`` by its name."""
    groups: dict[str, dict[str, Any]] = {"endpoint": {"model": "m", "request_timeout": 20},
                                         "load": {}, "after": {}}  # fmt: skip
    for name, value in flat.items():
        groups[_GROUPS[name]][name] = value
    load = {"sessions": sessions, "concurrency": sessions, **groups["load"]}
    return RunOptions(
        scenario=scenario,
        out_dir=out,
        schedule=Schedule(variants=(Variant(()),)),
        endpoint=Endpoint(url=url, **groups["endpoint"]),
        load=LoadSpec(**load),
        after=AfterLoad(**groups["after"]),
    )
