"""The harness's exception tree and exit codes. Only the commands (harness/cli/, the
simulator's main) turn the exceptions into exit codes.

    HarnessError            anything the user can fix; message says what to fix
    ├── UsageError          bad flags or input files                       -> exit 2
    │   └── ConfigError     a scenario/target file that does not validate  -> exit 2
    │       └── EndpointRefused   the endpoint refused the first request (401, 404...)
    └── InfrastructureError a server would not start, endpoint unreachable -> exit 3
        ├── ServerUnanswering a variant's server stopped answering mid-run
        └── EnvironmentFailure  the harness's own environment: disk full, a read-only
                                run folder                                        -> exit 3

Endpoint failures during a run never raise: they become ``Failure`` values on the
turn record (see harness/client/output.py).
"""

from __future__ import annotations

#: The harness's exit codes: every gate passed; a gate failed (``compare``: a significant
#: regression); bad usage or configuration; infrastructure (a server would not start, an
#: endpoint unreachable). A signal N that stops a run exits 128 + N (``EXIT_SIGINT``: Ctrl-C).
EXIT_OK, EXIT_GATE, EXIT_USAGE, EXIT_INFRA = 0, 1, 2, 3
EXIT_SIGINT = 130


class HarnessError(Exception):
    exit_code = EXIT_USAGE


class UsageError(HarnessError):
    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    exit_code = EXIT_USAGE


class InfrastructureError(HarnessError):
    exit_code = EXIT_INFRA


class EndpointRefused(ConfigError):
    """The first request of a variant got an answer that retrying cannot change (HTTP 400,
    401, 403, 404, 405, 422, 501): the user must change the configuration. ``whole_run``:
    every variant would get it (the same key, model name and API path), so the run ends."""

    def __init__(self, message: str, *, whole_run: bool) -> None:
        super().__init__(message)
        self.whole_run = whole_run


class ServerUnanswering(InfrastructureError):
    """A variant's server stopped answering: its recent requests all failed in transport."""


class EnvironmentFailure(InfrastructureError):
    """Writing the run folder failed (disk full, read-only, too large a file)."""

    exit_code = EXIT_INFRA

    @classmethod
    def writing(cls, path: object, exc: OSError) -> EnvironmentFailure:
        return cls(f"cannot write {path}: {exc.strerror or exc}")
