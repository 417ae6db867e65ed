"""The benchmarks' progress bar: on a terminal's stderr only, never in the tables."""

import io
import sys

import pytest

from collectives.bench.progress import progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_pipe_gets_the_items_and_no_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert list(progress(range(5), 5, "sizes")) == [0, 1, 2, 3, 4]
    assert err.getvalue() == ""


def test_a_terminal_gets_a_bar_on_stderr_and_rank_zero_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tqdm")
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    assert list(progress(range(3), 3, "sizes")) == [0, 1, 2]
    assert "sizes:" in err.getvalue() and "/3" in err.getvalue()
    quiet = _Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    assert list(progress(range(3), 3, "sizes", shown=False)) == [0, 1, 2]
    assert quiet.getvalue() == ""


def test_a_countdown_says_the_time_left_by_the_weight_left() -> None:
    import io

    from collectives.bench.progress import Countdown

    stream = io.StringIO()
    countdown = Countdown("bench x", [1.0, 3.0], stream=stream)
    countdown.started -= 2.0  # the first part took 2 s: the second weighs three times as much
    first = countdown.done()
    assert first.startswith("bench x: 1 of 2 rows after 2.0 s; about 6.0 s to go"), first
    assert countdown.done().endswith(", done")
    assert stream.getvalue().splitlines()[0] == first
    quiet = Countdown("bench x", [1.0], shown=False, stream=stream)
    quiet.done()
    assert len(stream.getvalue().splitlines()) == 2  # not shown: not printed
