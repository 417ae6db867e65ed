"""An unusable environment value is refused, naming the variable, the value and what is accepted."""

import pytest

from collectives import Communicator, ConfigurationError, faults
from collectives.transport.loopback import LoopbackWorld
from collectives.watch_settings import MAX_RECORDED

_SECONDS = "(accepted: a number >= 0 such as 30 or 2.5; 0 or inf for no limit)"
_FLAG = "is neither 1 nor 0 (nor true/false, yes/no, on/off)"
_CALLS = f"is not a whole number of calls from 0 to {MAX_RECORDED}"


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("COLLECTIVES_TIMEOUT", "²", f"is not a number of seconds {_SECONDS}"),
        ("COLLECTIVES_TIMEOUT", "10^23", f"is not a number of seconds {_SECONDS}"),
        ("COLLECTIVES_TIMEOUT", "-1", f"is not a number of seconds {_SECONDS}"),  # was: no variable named
        ("COLLECTIVES_TIMEOUT", "nan", f"is not a number of seconds {_SECONDS}"),
        ("COLLECTIVES_STALL_WARNING", "-0.5", f"is not a number of seconds {_SECONDS}"),
        ("COLLECTIVES_CHECK", "²", _FLAG),
        ("COLLECTIVES_TUNE", "2", _FLAG),
        ("COLLECTIVES_DEBUG", "Verbose", _FLAG),  # shown as written, not lowered
        ("COLLECTIVES_CUDA_IPC", "-1", _FLAG),  # was read only at the first call on device arrays
        ("COLLECTIVES_FLIGHT_RECORDER", "²", _CALLS),  # was a raw ValueError
        ("COLLECTIVES_FLIGHT_RECORDER", "100000000000000000000000", _CALLS),  # was a raw OverflowError
        ("COLLECTIVES_FLIGHT_RECORDER", "-1", _CALLS),
    ],
)
def test_an_unusable_environment_value_is_named_with_what_is_accepted(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as raised:
        Communicator(LoopbackWorld(1).transport(0))
    assert str(raised.value) == f"{name}={value!r} {says}"


def test_a_huge_number_is_refused_at_once_and_shown_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    # was a raw ValueError: int() refuses strings of more than 4300 digits
    monkeypatch.setenv("COLLECTIVES_FLIGHT_RECORDER", "9" * 100_000)
    with pytest.raises(ConfigurationError) as raised:
        Communicator(LoopbackWorld(1).transport(0))
    assert str(raised.value) == f"COLLECTIVES_FLIGHT_RECORDER='{'9' * 40}...' {_CALLS}"


def test_settings_within_their_bounds_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLLECTIVES_FLIGHT_RECORDER", str(MAX_RECORDED))
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "1e400")  # past a float's range: no limit
    monkeypatch.setenv("COLLECTIVES_TUNE", "On")
    comm = Communicator(LoopbackWorld(1).transport(0))
    assert comm.watchdog.recorder.maxlen == MAX_RECORDED
    assert comm.timeout == float("inf") and comm.tuner is not None


def test_a_launcher_rank_in_other_digits_is_no_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    # str.isdigit takes "²", which int() then refuses with a raw ValueError
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        monkeypatch.setenv(name, "²")
    assert faults.launch_rank() is None
