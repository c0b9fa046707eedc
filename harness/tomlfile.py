"""Reading a UTF-8 TOML file (a scenario, a target) with one-line errors that say what is wrong."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from harness.errors import ConfigError


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """The table in ``path``, the ``what`` file ("scenario", "target"); a ConfigError when it
    is missing, not UTF-8, not TOML, or nested too deep to read."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 (byte {exc.start}); a {what} is UTF-8 TOML") from None
    except RecursionError:
        raise ConfigError(f"{path}: TOML nested too deep to read") from None
