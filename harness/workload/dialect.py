"""Which tool-call dialect a run's turns are classified with, decided once and said out loud.

``--dialect NAME`` (or ``dialect = "NAME"`` in the scenario) is taken as given. ``auto``
decides, per variant, from the served model's name (``/v1/models``: its ``id`` and, on vLLM,
its ``root``, the model path) through ``registry.dialect_for_model``. When the name does not
tell, the dialect is settled by the first turn whose content carries the markup of a known
dialect (``DialectLock``): until then the turns had no markup, so no dialect would read them
differently. The choice is announced, written to ``run.json`` and recorded on every turn
(``dialect``, ``dialect_from``), from which ``summary.json`` and the report say it per variant.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.client.door import list_models
from harness.dialects import registry
from harness.errors import ConfigError

log = logging.getLogger(__name__)

AUTO = "auto"
#: where a dialect came from
FROM_OPTION = "option"
FROM_SCENARIO = "scenario"
FROM_MODEL = "model name"
FROM_MARKUP = "markup"


@dataclass(frozen=True)
class DialectChoice:
    """``name``: the dialect the turns are classified with ("auto" while undecided)."""

    name: str
    setting: str  # what was asked for: "auto" or a dialect name
    source: str  # FROM_OPTION | FROM_SCENARIO | FROM_MODEL | FROM_MARKUP (still to settle)
    model: str | None = None

    def describe(self) -> str:
        if self.source == FROM_MODEL:
            return f"{self.name} (from the model name {self.model})"
        if self.source == FROM_MARKUP:
            model = f" {self.model}" if self.model else ""
            return (
                f"auto (the model name{model} does not tell; settled by the first turn "
                "with tool-call markup)"
            )
        where = "--dialect" if self.source == FROM_OPTION else "the scenario"
        return f"{self.name} (from {where})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "dialect": self.name,
            "setting": self.setting,
            "from": self.source,
            "model": self.model,
        }


def check_name(name: str, where: str) -> str:
    """The registered dialect ``name`` stands for ("auto", a name, or a server's parser name
    such as ``qwen3_coder``); a ConfigError naming the choices."""
    if name in registry.names():
        return name
    if name in registry.aliases():
        return registry.aliases()[name]
    raise ConfigError(f"{where}: dialect {name!r} is not one of {', '.join(registry.names())}")


def for_model(model_names: Sequence[str]) -> str | None:
    """The dialect the first of ``model_names`` that names a known family speaks."""
    for model in model_names:
        found = registry.dialect_for_model(model) if model else None
        if found:
            return found
    return None


def choose(setting: str, model_names: Sequence[str], *, from_option: bool = False) -> DialectChoice:
    """The dialect for a variant whose server serves ``model_names`` (id first, then root)."""
    model = next((m for m in model_names if m), None)
    if setting != AUTO:
        return DialectChoice(setting, setting, FROM_OPTION if from_option else FROM_SCENARIO, model)
    found = for_model(model_names)
    if found is not None:
        return DialectChoice(found, AUTO, FROM_MODEL, model)
    return DialectChoice(AUTO, AUTO, FROM_MARKUP, model)


async def model_names(base_url: str, model: str, api_key: str | None = None) -> list[str]:
    """The names that tell the dialect, first first: ``model`` and, when the server lists it
    in ``/v1/models``, its ``root`` (vLLM's path). When the server lists models but not
    ``model`` (a ``--model`` the server ignores: SGLang serves whatever it loaded), what it
    serves comes first (its id, then its root), ``model`` last."""
    data = await list_models(base_url, api_key=api_key)
    entries = [e for e in data or ()
               if isinstance(e, Mapping) and isinstance(e.get("id"), str) and e["id"]]  # fmt: skip
    mine = next((e for e in entries if e["id"] == model), None)
    if mine is None and entries:  # the server serves another model than the one named
        mine = entries[0]
    names = [str(mine["id"])] if mine is not None else []
    root = mine.get("root") if mine is not None else None
    if isinstance(root, str) and root and root not in names:
        names.append(root)
    return names + ([model] if model not in names else [])


class DialectLock:
    """An "auto" dialect that settles on the first turn showing a known dialect's markup.

    The sessions of one driver share one lock: from that turn on, every turn is classified
    with the settled dialect (markup of any other dialect is then a leak or a near miss).
    """

    def __init__(self) -> None:
        self.name = AUTO

    def observe(self, evidence: Mapping[str, Any]) -> None:
        if self.name != AUTO:
            return
        found = evidence.get("dialect")
        if isinstance(found, str) and found in registry.names() and found != AUTO:
            self.name = found
            log.info("dialect settled by the markup of a turn: %s", found)
