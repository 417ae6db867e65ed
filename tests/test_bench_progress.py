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
