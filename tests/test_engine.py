"""The compiled engine: built where a compiler is, switched by COLLECTIVES_COMPILED, numpy's bits."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from collectives import engine
from collectives.backends.numpy_backend import UFUNCS as UFUNCS_BY_OP
from tests.test_special_bits import special_inputs

ROOT = Path(__file__).resolve().parent.parent
FLOATS = ("float32", "float64")
INTEGERS = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
UFUNCS = {op: UFUNCS_BY_OP[op] for op in ("sum", "prod", "min", "max", "band", "bor", "bxor")}  # the engine's

needs_engine = pytest.mark.skipif(
    not engine.compiled(), reason=f"the compiled engine does not run: {engine.why()}"
)


def _info(**env: str) -> subprocess.CompletedProcess[str]:
    code = "from collectives import engine; print(engine.compiled()); print(engine.why())"
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )


def test_the_engine_is_built_where_a_c_compiler_is() -> None:
    if os.environ.get("COLLECTIVES_COMPILED", "").strip() in ("0", "false", "no", "off"):
        pytest.skip("COLLECTIVES_COMPILED=0: this run tests the Python path")
    if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        pytest.skip("no C compiler here: the package installs without its engine")
    assert engine.compiled(), f"{engine.why()}; pip install -e . builds it where a compiler is found"
    assert engine.why().startswith("compiled")


def test_compiled_0_turns_it_off_and_says_so() -> None:
    done = _info(COLLECTIVES_COMPILED="0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["False", "the Python path: COLLECTIVES_COMPILED=0"]


def test_a_build_older_than_its_source_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stale build lacks the newest call: the Python path runs, and ``why`` says to rebuild."""
    import importlib
    import types

    stale = types.ModuleType("collectives._engine")
    stale.__file__ = "/somewhere/_engine.so"
    monkeypatch.setattr(importlib, "import_module", lambda name: stale)
    monkeypatch.delenv("COLLECTIVES_COMPILED", raising=False)
    built, reason, problem = engine._load()
    assert built is None and problem is None
    assert "older than its source" in reason and "rebuild" in reason


def test_a_bad_value_is_refused_by_name() -> None:
    done = _info(COLLECTIVES_COMPILED="fast")
    assert done.returncode != 0
    assert "COLLECTIVES_COMPILED='fast' is neither 1 nor 0" in done.stderr


@needs_engine
def test_compiled_1_is_accepted_where_it_was_built() -> None:
    done = _info(COLLECTIVES_COMPILED="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "True"


@needs_engine
@pytest.mark.parametrize(
    ("dtype", "op", "taken"),
    [
        ("float32", "sum", True),
        ("float64", "prod", True),
        ("int64", "max", True),
        ("uint8", "bxor", True),
        ("float32", "max", False),  # numpy's vector and scalar loops differ for -0.0 against +0.0
        ("float16", "sum", False),  # numpy rounds through float32: left to it
        ("bfloat16", "sum", False),
        ("complex64", "sum", False),
        ("bool", "bor", False),
    ],
)
def test_the_engine_takes_only_what_gives_numpys_bits(dtype: str, op: str, taken: bool) -> None:
    assert engine.reduces(dtype, op) is taken


@needs_engine
@pytest.mark.parametrize("dtype", FLOATS + INTEGERS)
def test_the_engines_loops_give_numpys_bits(dtype: str) -> None:
    compiled = engine.COMPILED
    assert compiled is not None
    rng = np.random.default_rng(7)
    for op, ufunc in UFUNCS.items():
        if not engine.reduces(dtype, op):
            continue
        for count in (1, 2, 7, 16, 33, 301, 1000):
            if dtype in FLOATS:  # signed zeros, NaNs on one side (of two NaNs numpy's loop picks either)
                a, b = (
                    np.where(
                        rng.random(count) < 0.3,
                        special,
                        (rng.standard_normal(count) * 10.0 ** rng.integers(-30, 30, count)).astype(dtype),
                    )
                    for special in special_inputs(dtype, 2, count, nan_ranks=1)
                )
            else:
                info = np.iinfo(dtype)
                a, b = (rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True) for _ in range(2))
            with np.errstate(all="ignore"):
                expected = ufunc(a, b)
                again = ufunc(expected, b)
            out = np.empty_like(a)
            compiled.combine(dtype, op, out, a, b)
            assert out.tobytes() == expected.tobytes(), f"{dtype} {op} count {count}"
            compiled.combine(dtype, op, out, out, b)  # in place, as the third rank's region is added
            assert out.tobytes() == again.tobytes(), f"{dtype} {op} count {count}, in place"


@needs_engine
def test_the_engine_refuses_what_it_does_not_take() -> None:
    compiled = engine.COMPILED
    assert compiled is not None
    x = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="does not reduce float32 with max"):
        compiled.combine("float32", "max", x, x, x)
    with pytest.raises(ValueError, match="one length"):
        compiled.combine("float32", "sum", x, x, np.zeros(3, np.float32))


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "compiled"])
def test_of_threads_taking_the_claim_at_once_exactly_one_gets_it(compiled: bool) -> None:
    import threading

    if compiled and engine._BUILT is None:
        pytest.skip(f"the compiled engine was not built: {engine.why()}")
    core = engine._BUILT.WatchdogCore() if compiled else engine._PythonWatchdogCore()
    assert not core.claim_held()
    for _ in range(50):
        start = threading.Barrier(4)
        taken: list[bool] = []

        def take(start: threading.Barrier, taken: list[bool]) -> None:
            start.wait()
            taken.append(core.take_claim())

        threads = [threading.Thread(target=take, args=(start, taken)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(taken) == [False, False, False, True] and core.claim_held()
        core.give_claim()
        assert not core.claim_held()
    with pytest.raises(RuntimeError):
        core.give_claim()  # not held
