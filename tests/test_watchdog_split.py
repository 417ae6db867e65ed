"""The watchdog's concerns apart: the names it exported; a call's path as short as before."""

import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import collectives.watchdog as watchdog_module
from collectives import ConfigurationError, agreement, flight_recorder, watch_settings
from collectives.call import Starts
from collectives.signature import Signature
from collectives.transport.base import Transport
from collectives.transport.loopback import LoopbackWorld
from collectives.watchdog import Watchdog
from tests.shared_threads import ThreadWorld

PACKAGE = Path(watchdog_module.__file__).resolve().parent

# the names other modules and tests import from collectives.watchdog, each from its own home now
EXPORTED = {
    "CHECK_ENV": watch_settings,
    "DEBUG_ENV": watch_settings,
    "DEBUG_FILE_ENV": watch_settings,
    "DEFAULT_STALL_WARNING_S": watch_settings,
    "DEFAULT_TIMEOUT_S": watch_settings,
    "RECORDER_ENV": watch_settings,
    "STALL_WARNING_ENV": watch_settings,
    "TIMEOUT_ENV": watch_settings,
    "FUSED_BYTES": agreement,
    "PackedSignature": agreement,
}


def test_the_watchdog_still_exports_each_name_from_its_one_home() -> None:
    assert sorted(watchdog_module.__all__) == sorted([*EXPORTED, "Watchdog"])
    for name, home in EXPORTED.items():
        assert getattr(watchdog_module, name) is getattr(home, name), name


def test_the_settings_read_the_environment_and_name_a_bad_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_SECONDS", "2.5")
    assert watch_settings.seconds(None, "X_SECONDS", 9.0) == 2.5
    assert watch_settings.seconds(0, "X_SECONDS", 9.0) == float("inf")  # 0: never
    monkeypatch.setenv("X_SECONDS", "soon")
    with pytest.raises(ConfigurationError, match=r"X_SECONDS='soon' is not a number of seconds"):
        watch_settings.seconds(None, "X_SECONDS", 9.0)
    monkeypatch.setenv("X_FLAG", "0")
    assert watch_settings.flag(None, "X_FLAG", True) is False
    assert watch_settings.flag(True, "X_FLAG", False) is True
    monkeypatch.setenv(watch_settings.RECORDER_ENV, "5")
    assert watch_settings.recorded_calls() == 5
    assert flight_recorder.new_recorder().maxlen == 5
    monkeypatch.setenv(watch_settings.RECORDER_ENV, "many")
    with pytest.raises(ConfigurationError, match="COLLECTIVES_FLIGHT_RECORDER='many'"):
        watch_settings.recorded_calls()
    monkeypatch.delenv(watch_settings.RECORDER_ENV)
    assert watch_settings.recorded_calls() == watch_settings.DEFAULT_RECORDED


def test_the_debug_file_is_checked_once_and_written_a_line_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(watch_settings.DEBUG_FILE_ENV, str(tmp_path / "missing" / "log-{rank}"))
    with pytest.raises(ConfigurationError, match="no folder"):
        watch_settings.debug_file(3)
    path = str(tmp_path / "log-{rank}")
    monkeypatch.setenv(watch_settings.DEBUG_FILE_ENV, path)
    assert watch_settings.debug_file(3) == path
    flight_recorder.write_debug_line(path, 3, "one")
    flight_recorder.write_debug_line(path, 3, "two")
    assert (tmp_path / "log-3").read_text() == "one\ntwo\n"


def test_the_flight_record_lists_calls_and_starts_oldest_first() -> None:
    recorder = flight_recorder.new_recorder()
    signature = Signature(0, "allreduce", "ring", "float32", "sum", -1, 8)
    recorder.append(Starts(signature, 4, "ring"))
    lines = flight_recorder.record_lines(recorder, 1)
    assert len(lines) == 1 and lines[0].startswith("collectives rank 1 #4 allreduce count=8")
    assert flight_recorder.record_text(recorder, 1).startswith("last 1 collectives on rank 1:\n  collectives")


def _calls_in(names: set[str], body: Any) -> Counter[str]:
    """The functions of the watchdog's modules that ``body()`` runs on this thread, by name, with counts."""
    counted: Counter[str] = Counter()
    homes = {str(PACKAGE / f"{name}.py") for name in names}

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename in homes:
            counted[frame.f_code.co_name] += 1

    sys.setprofile(profile)
    try:
        body()
    finally:
        sys.setprofile(None)
    return counted


WATCHDOG_MODULES = {"watchdog", "agreement", "call", "flight_recorder", "watch_settings"}


def test_a_call_through_shared_memory_runs_the_same_functions_as_before_the_split() -> None:
    # the hot path: claim, number, post the signature with the first barrier, compare after it, end
    shared_world = ThreadWorld(2, region_bytes=64)

    def rank(transport: Transport) -> Counter[str]:
        watchdog = Watchdog(transport)
        watchdog.agree_through(shared_world.memory(transport.rank))
        shared = watchdog.shared
        assert shared is not None
        guard = watchdog.signature_of("allreduce", "shared_memory", 2, "float32", "sum")

        def one() -> None:
            call = watchdog.watch(guard, first_barrier=True)
            call.barrier(shared)
            watchdog.end(call)

        one()  # the first call sets nothing up that later ones skip, but count a repeated one
        return _calls_in(WATCHDOG_MODULES, one)

    for counted in LoopbackWorld(2).run(rank):
        assert counted == Counter(
            {"watch": 1, "claim": 1, "__init__": 1, "stamp": 1, "barrier": 1, "compare_posted": 1, "end": 1}
        )


def test_a_call_agreeing_by_messages_runs_no_more_functions_than_before_the_split() -> None:
    def rank(transport: Transport) -> Counter[str]:
        watchdog = Watchdog(transport)
        guard = watchdog.signature_of("allreduce", "ring", 2, "float32", "sum")

        def one() -> None:
            watchdog.end(watchdog.watch(guard))

        one()
        return _calls_in(WATCHDOG_MODULES, one)

    for counted in LoopbackWorld(3).run(rank):
        # watch, claim, Call, stamp, the exchange, its two lists of requests, a message per peer, the wait
        assert sum(counted.values()) == 11, counted
        assert counted["watch"] == counted["claim"] == counted["stamp"] == counted["end"] == 1


def test_a_watchdog_keeps_the_agreement_s_methods_bound_once() -> None:
    watchdog = Watchdog(LoopbackWorld(2).transport(0))
    assert watchdog.compare_posted.__self__ is watchdog.agreement  # type: ignore[attr-defined]
    assert watchdog.arrived.__self__ is watchdog.agreement  # type: ignore[attr-defined]
