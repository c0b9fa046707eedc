"""``--ab factor=level1,level2`` (repeatable) -> the cartesian product of variants."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from harness.errors import UsageError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LEVEL = re.compile(r"^[A-Za-z0-9_.:+\-]+$")


@dataclass(frozen=True)
class Variant:
    factors: tuple[tuple[str, str], ...]  # ordered (factor, level) pairs

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.factors) or "default"

    def as_dict(self) -> dict[str, str]:
        return dict(self.factors)


def parse_ab(specs: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """Parse ``name=l1,l2`` specs; levels are plain values, never shell code."""
    factors: list[tuple[str, tuple[str, ...]]] = []
    seen: set[str] = set()
    for spec in specs:
        name, sep, levels_text = spec.partition("=")
        name = name.strip()
        if not sep or not _NAME.match(name):
            raise UsageError(
                f"--ab {spec!r}: expected FACTOR=LEVEL1,LEVEL2 with '=' between the factor and "
                "its levels (e.g. --ab index_k=fp8,bf16)"
            )
        levels = tuple(level.strip() for level in levels_text.split(",") if level.strip())
        if not levels:
            raise UsageError(f"--ab {spec!r}: give at least one level after '='")
        for level in levels:
            if not _LEVEL.match(level):
                raise UsageError(
                    f"--ab {spec!r}: level {level!r} may only hold letters, digits and . _ : + -"
                )
        if len(set(levels)) != len(levels):
            raise UsageError(f"--ab {spec!r}: a level is repeated")
        if name in seen:
            raise UsageError(f"--ab: factor {name!r} given twice; list all its levels in one --ab")
        seen.add(name)
        factors.append((name, levels))
    return factors


def variants(factors: list[tuple[str, tuple[str, ...]]]) -> list[Variant]:
    """All combinations, the first level of each factor first (the baseline)."""
    if not factors:
        return [Variant(())]
    names = [f for f, _ in factors]
    return [
        Variant(tuple(zip(names, combo, strict=True)))
        for combo in itertools.product(*(levels for _, levels in factors))
    ]
