"""Requests in flight over all worker processes: one 8-byte slot per worker in a shared file.

Each worker publishes its own count and reads the total, so every record's ``inflight`` is the
variant's, whichever process drove the turn.
"""

from __future__ import annotations

import mmap
import os
import tempfile


class InflightBoard:
    """Requests in flight per worker, one 8-byte slot each in a file every worker maps."""

    def __init__(self, path: str, slot: int, slots: int) -> None:
        try:
            with open(path, "r+b") as fh:
                self._map = mmap.mmap(fh.fileno(), 8 * slots)
        except FileNotFoundError:
            # a worker on another host (a Ray cluster's node): only its own count is known
            self._map = mmap.mmap(-1, 8 * slots)
        self._view = memoryview(self._map).cast("q")
        self.slot = slot

    @staticmethod
    def create(slots: int) -> str:
        """A zeroed board file for ``slots`` workers; the caller removes it."""
        fd, path = tempfile.mkstemp(prefix="harness-inflight-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(bytes(8 * slots))
        return path

    def publish(self, own: int) -> int:
        """Set this worker's count; return the total over all workers."""
        self._view[self.slot] = own
        return sum(self._view)

    def close(self) -> None:
        self._view.release()
        self._map.close()
