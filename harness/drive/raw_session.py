"""Raw-mode sessions: the history keeps a raw output's content without its DSML block."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from harness.client.output import TurnOutput
from harness.dialects import dsml
from harness.drive.session import Session


def visible(out: TurnOutput) -> TurnOutput:
    """The output as the history keeps it: a raw output's content without its DSML block."""
    if out.source != "raw":
        return out
    parsed = dsml.parse(out.content)
    content = parsed.content if parsed.ok else out.content.removesuffix(dsml.EOS)
    return replace(out, content=content)


class RawSession(Session):
    """A session whose outputs are raw text: the history gets the content without markup."""

    def _extend(self, turn: int, out: TurnOutput, calls: list[dict[str, Any]]) -> None:
        super()._extend(turn, visible(out), calls)

    def _follow_up(self, turn: int, out: TurnOutput) -> None:
        super()._follow_up(turn, visible(out))
