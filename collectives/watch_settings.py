"""The watchdog's settings: the environment variables it reads, their defaults, and reading them."""

__all__ = [
    "CHECK_ENV",
    "DEBUG_ENV",
    "DEBUG_FILE_ENV",
    "DEFAULT_RECORDED",
    "DEFAULT_STALL_WARNING_S",
    "DEFAULT_TIMEOUT_S",
    "MAX_RECORDED",
    "RECORDER_ENV",
    "STALL_WARNING_ENV",
    "TIMEOUT_ENV",
    "debug_file",
    "flag",
    "recorded_calls",
    "seconds",
]

import math
import os

from ._env import env_count, env_flag
from .errors import ConfigurationError

TIMEOUT_ENV = "COLLECTIVES_TIMEOUT"
STALL_WARNING_ENV = "COLLECTIVES_STALL_WARNING"
CHECK_ENV = "COLLECTIVES_CHECK"
DEBUG_ENV = "COLLECTIVES_DEBUG"
DEBUG_FILE_ENV = "COLLECTIVES_DEBUG_FILE"
RECORDER_ENV = "COLLECTIVES_FLIGHT_RECORDER"

DEFAULT_TIMEOUT_S = 1800.0
"""30 minutes, as torch.distributed's default."""

DEFAULT_STALL_WARNING_S = 60.0
"""As Horovod's stall check; never later than half the timeout."""

DEFAULT_RECORDED = 64
"""The calls a flight recorder keeps unless ``$COLLECTIVES_FLIGHT_RECORDER`` says otherwise."""

MAX_RECORDED = 100_000
"""The most calls ``$COLLECTIVES_FLIGHT_RECORDER`` may ask a recorder to keep: a bound on its memory."""

_SECONDS = "(accepted: a number >= 0 such as 30 or 2.5; 0 or inf for no limit)"


def seconds(value: float | None, env: str, default: float) -> float:
    """A duration from the argument, else the environment, else ``default``; 0 or inf means never.

    Raises:
        ConfigurationError: the value is not a number of seconds >= 0; one from the
            environment is named with its variable.
    """
    if value is None:
        text = os.environ.get(env, "").strip()
        if not text:
            return default
        shown = text if len(text) <= 40 else f"{text[:40]}..."
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if math.isnan(value) or value < 0:
            raise ConfigurationError(f"{env}={shown!r} is not a number of seconds {_SECONDS}") from None
    if math.isnan(value) or value < 0:
        raise ConfigurationError(f"a duration must be a non-negative number of seconds, got {value}")
    return math.inf if value == 0 else float(value)


def flag(value: bool | None, env: str, default: bool) -> bool:
    """A yes/no from the argument, else the environment (``0`` or ``1``), else ``default``."""
    if value is not None:
        return value
    setting = env_flag(env)
    return default if setting is None else setting


def debug_file(rank: int) -> str | None:
    """``$COLLECTIVES_DEBUG_FILE`` (``{rank}`` in it stands for the rank), checked now, or ``None``.

    Raises:
        ConfigurationError: its folder does not exist; found here, not at the first
            line written, which would fail a call whose result is then lost.
    """
    path = os.environ.get(DEBUG_FILE_ENV) or None
    if path is not None:
        folder = os.path.dirname(path.replace("{rank}", str(rank))) or "."
        if not os.path.isdir(folder):
            raise ConfigurationError(f"{DEBUG_FILE_ENV}={path!r}: no folder {folder!r}")
    return path


def recorded_calls() -> int:
    """How many calls a flight recorder keeps: ``$COLLECTIVES_FLIGHT_RECORDER`` or :data:`DEFAULT_RECORDED`.

    Raises:
        ConfigurationError: the variable is not a whole number from 0 to :data:`MAX_RECORDED`.
    """
    kept = env_count(RECORDER_ENV, "calls", 0, MAX_RECORDED)
    return DEFAULT_RECORDED if kept is None else kept
