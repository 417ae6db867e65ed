"""The settings that change what the ranks do, as each rank reads them, and their comparison across ranks."""

__all__ = ["NUMBER_KEY", "SETTINGS_BYTES", "Setting", "compared", "differences", "number_in", "settings_of"]

import json
from collections.abc import Callable, Sequence

from .errors import ConfigurationError, MismatchError

SETTINGS_BYTES = 512  # the settings' record each rank sends at creation: JSON of short texts, padded
NUMBER_KEY = "(communicator number)"  # the record's one entry not compared: the ranks take the largest


class Setting:
    """One compared setting on this rank: its value, how the comparison shows it, and why it is unusable."""

    __slots__ = ("problem", "shown", "value")

    def __init__(self, value: object, shown: str, problem: ConfigurationError | None = None) -> None:
        self.value = value
        self.shown = shown
        self.problem = problem


def compared(read: Callable[..., object], *args: object) -> Setting:
    """The setting ``read(*args)`` gives; where it raises, an unusable one the comparison shows as such."""
    try:
        value = read(*args)
    except ConfigurationError as error:
        return Setting(None, "unusable (see its error)", error)
    shown = "unset" if value is None else str(int(value)) if isinstance(value, bool | int) else str(value)
    return Setting(value, shown)


def settings_of(record: bytes) -> dict[str, str]:
    try:
        settings = json.loads(record)
    except ValueError:
        settings = None
    if not isinstance(settings, dict):  # another version of the library, say
        return {"the settings' record": "unreadable"}
    return {str(name): str(value) for name, value in settings.items() if name != NUMBER_KEY}


def number_in(record: bytes) -> int | None:
    """The communicator number a rank's settings' record carries (``None``: none readable)."""
    try:
        number = json.loads(record).get(NUMBER_KEY)
    except (ValueError, AttributeError):
        return None
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def differences(settings: list[dict[str, str]]) -> MismatchError | None:
    """The error every rank raises where the ranks' settings (one dict per rank) differ; else ``None``."""
    fields: dict[str, dict[str, tuple[int, ...]]] = {}
    for name in dict.fromkeys(name for each in settings for name in each):
        values: dict[str, list[int]] = {}
        for rank, each in enumerate(settings):
            values.setdefault(each.get(name, "not compared"), []).append(rank)
        if len(values) > 1:
            fields[name] = {value: tuple(ranks) for value, ranks in values.items()}
    if not fields:
        return None
    clauses = [
        f"{name}: " + "; ".join(f"{value} on {_ranks(ranks)}" for value, ranks in values.items())
        for name, values in fields.items()
    ]
    return MismatchError(
        "the ranks' settings differ, so their calls would not pair; set them alike on every rank: "
        + " | ".join(clauses),
        fields,
    )


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
