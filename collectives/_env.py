"""Settings from the environment: yes/no and whole numbers, each checked against what it accepts."""

__all__ = ["env_count", "env_flag"]

import os

from .errors import ConfigurationError

_YES = ("1", "true", "yes", "on")
_NO = ("0", "false", "no", "off")


def env_flag(name: str) -> bool | None:
    """``$name`` read as yes or no; ``None`` where it is unset or empty.

    Raises:
        ConfigurationError: it is set to anything else (1/0, true/false, yes/no, on/off).
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    if text.lower() in _YES:
        return True
    if text.lower() in _NO:
        return False
    raise ConfigurationError(f"{name}={text!r} is neither 1 nor 0 (nor true/false, yes/no, on/off)")


def env_count(name: str, what: str, low: int, high: int) -> int | None:
    """``$name`` read as a whole number of ``what`` from ``low`` to ``high``; ``None`` where unset or empty.

    Only ASCII digits count: ``int()`` takes other scripts' digits and ``str.isdigit``
    superscripts, which ``int()`` then refuses.

    Raises:
        ConfigurationError: it is set to anything else, naming the value and the range.
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    # the length first, so that a number of a million digits costs nothing to refuse
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(high)) or not low <= int(text) <= high:
        shown = text if len(text) <= 40 else f"{text[:40]}..."
        raise ConfigurationError(f"{name}={shown!r} is not a whole number of {what} from {low} to {high}")
    return int(text)
