"""The harness's exception tree. Only cli.py turns these into exit codes.

    HarnessError            anything the user can fix; message says what to fix
    ├── UsageError          bad flags or input files                       -> exit 2
    │   └── ConfigError     a scenario/target file that does not validate  -> exit 2
    │       └── EndpointRefused   the endpoint refused the first request (401, 404...)
    └── InfrastructureError a server would not start, endpoint unreachable -> exit 3
            └── ServerUnanswering a variant's server stopped answering mid-run

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


class EndpointRefused(ConfigError):
    """The first request of a variant got an answer that retrying cannot change (HTTP 400,
    401, 403, 404, 405, 422, 501): the user must change the configuration. ``whole_run``:
    every variant would get it (the same key, model name and API path), so the run ends."""

    def __init__(self, message: str, *, whole_run: bool) -> None:
        super().__init__(message)
        self.whole_run = whole_run


class ServerUnanswering(InfrastructureError):
    """A variant's server stopped answering: its recent requests all failed in transport."""
