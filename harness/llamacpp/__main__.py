"""``python -m harness.llamacpp``: runs ``python -m harness.servers.llamacpp``."""

from __future__ import annotations

import runpy

if __name__ == "__main__":
    runpy.run_module("harness.servers.llamacpp", run_name="__main__", alter_sys=True)
