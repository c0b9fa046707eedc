"""argparse value types shared by the commands: each error says what was expected."""

from __future__ import annotations

import argparse
import os


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        return kind(text)
    except ValueError:
        word = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {word}, got {text!r}") from None


def positive_int(text: str) -> int:
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def probability(text: str) -> float:
    value = _number(text, float)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def port(text: str) -> int:
    """A TCP port: 0 (the system picks a free one) to 65535."""
    value = int(_number(text, int))
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {value}")
    return value


def workers(text: str) -> int | str:
    """``auto``, ``ray`` or ``ray:ADDRESS`` (a Ray cluster), or a whole number of at least 1."""
    if text == "auto" or text == "ray" or text.startswith("ray:"):
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or auto, or ray[:ADDRESS])") from None


def judges(text: str) -> int | None:
    """``auto`` (None: one per usable core) or a whole number, 0 to classify on the loop."""
    if text == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (or auto)") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {n}")
    return n


def api_key_from_env(name: str) -> str | None:
    return os.environ.get(name) or None


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help that shows each option's default, when it has one the text does not already say."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or "%(default)" in text
            or default in (None, False, [], argparse.SUPPRESS)
            or not action.option_strings
        ):
            return action.help
        return f"{text} (default: %(default)s)"
