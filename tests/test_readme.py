"""The README is the short path: its target file loads, its sample output is what the current
version prints, its links lead somewhere, and the reference it moved lives in docs/."""

from __future__ import annotations

import re
from pathlib import Path

from harness.report.build import DEMO_NOTE, TERMINAL_COLS
from harness.target.targetfile import load_target

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_short_and_the_reference_is_in_docs() -> None:
    assert len(README.splitlines()) <= 260
    reference = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    for fact in ("### `harness run`", "### CI gates and exit codes", "### Statistics",
                 "## The simulator: `harness sim`", "## Performance"):  # fmt: skip
        assert fact in reference


def test_every_link_of_the_readme_leads_to_a_file() -> None:
    for target in re.findall(r"\]\(([^)#]+)", README):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_the_target_file_of_the_readme_loads(tmp_path: Path) -> None:
    (block,) = re.findall(r"```toml\n(.*?)```", README, re.S)
    path = tmp_path / "my-sglang.toml"
    path.write_text(block, encoding="utf-8")
    spec = load_target(path)
    assert spec.name == "my-sglang"


def test_the_sample_output_is_what_the_current_version_prints() -> None:
    sample = README.split("What it prints at the end", 1)[1].split("```", 2)[1]
    header = next(line for line in sample.splitlines() if line.startswith("variant"))
    assert header.split() == " ".join(TERMINAL_COLS).split()
    assert DEMO_NOTE in sample
    assert "reproduce a corrupted session" in sample
    assert "rates count structural + confirmed turns" in sample  # the tiers the rates count
    assert sample.strip().splitlines()[-1].startswith('{"run_id"')
