"""Yes/no settings from the environment."""

__all__ = ["env_flag"]

import os

from .errors import ConfigurationError

_YES = ("1", "true", "yes", "on")
_NO = ("0", "false", "no", "off")


def env_flag(name: str) -> bool | None:
    """``$name`` read as yes or no; ``None`` where it is unset or empty.

    Raises:
        ConfigurationError: it is set to anything else (1/0, true/false, yes/no, on/off).
    """
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return None
    if text in _YES:
        return True
    if text in _NO:
        return False
    raise ConfigurationError(f"{name}={text!r} is neither 1 nor 0")
