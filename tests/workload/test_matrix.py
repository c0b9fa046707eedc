from __future__ import annotations

import pytest

from harness.errors import UsageError
from harness.workload.matrix import parse_ab, variants


def test_cartesian_product_keeps_baseline_first() -> None:
    vs = variants(parse_ab(["index_k=fp8,bf16", "hicache=on,off"]))
    assert [v.label for v in vs] == [
        "index_k=fp8,hicache=on",
        "index_k=fp8,hicache=off",
        "index_k=bf16,hicache=on",
        "index_k=bf16,hicache=off",
    ]
    assert vs[0].as_dict() == {"index_k": "fp8", "hicache": "on"}


def test_no_factor_is_one_default_variant() -> None:
    assert [v.label for v in variants(parse_ab([]))] == ["default"]


@pytest.mark.parametrize(
    "spec",
    ["index_k", "=fp8", "index_k=", "index_k=fp8,fp8", "x=$(rm -rf /)", "x=a;b", "1x=a"],
)
def test_bad_specs_are_usage_errors(spec: str) -> None:
    with pytest.raises(UsageError, match="--ab"):
        parse_ab([spec])


def test_factor_given_twice() -> None:
    with pytest.raises(UsageError, match="given twice"):
        parse_ab(["a=1", "a=2"])
