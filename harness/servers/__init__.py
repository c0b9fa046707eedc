"""Launchers of real engines shipped with the package (llama.cpp)."""

from __future__ import annotations
