"""The port file a server process writes once it is ready: one line, written atomically."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_port_file(path: Path, port: int) -> None:
    """Write ``port`` atomically (temp file in the same directory, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)
