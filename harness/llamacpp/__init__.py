"""``python -m harness.llamacpp``: the llama.cpp launcher under its first name."""

from __future__ import annotations
