"""What a run writes: turn records and transcripts."""

from __future__ import annotations
