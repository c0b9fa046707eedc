"""The commands: parser and main, run, the inspection commands, gate arguments."""

from __future__ import annotations
