"""The harness's exception tree. Only cli.py turns these into exit codes.

    HarnessError            anything the user can fix; message says what to fix
    ├── UsageError          bad flags or input files                       -> exit 2
    │   └── ConfigError     a scenario/target file that does not validate  -> exit 2
    └── InfrastructureError a server would not start, endpoint unreachable -> exit 3
        └── EnvironmentFailure  the harness's own environment: disk full, a read-only
                                run folder                                    -> exit 3

Endpoint failures during a run never raise: they become ``Failure`` values on the
turn record (see client.py).
"""

from __future__ import annotations


class HarnessError(Exception):
    exit_code = 2


class UsageError(HarnessError):
    exit_code = 2


class ConfigError(UsageError):
    exit_code = 2


class InfrastructureError(HarnessError):
    exit_code = 3


class EnvironmentFailure(InfrastructureError):
    """Writing the run folder failed (disk full, read-only, too large a file)."""

    exit_code = 3

    @classmethod
    def writing(cls, path: object, exc: OSError) -> EnvironmentFailure:
        return cls(f"cannot write {path}: {exc.strerror or exc}")
