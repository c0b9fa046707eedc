"""``python -m harness.cli``: the ``harness`` command."""

from __future__ import annotations

import runpy

if __name__ == "__main__":
    runpy.run_module("harness.cli.main", run_name="__main__", alter_sys=True)
