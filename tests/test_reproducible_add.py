"""The accumulator's add: the compiled engine's one pass (``repro_add``) and the numpy path, the same state.

Each test runs both: the engine as built (CI builds it) and the numpy path, with
``engine.COMPILED`` set to ``None``; after every add their codes, level sums and
special bits are compared, and the value of all the adds with the exact model's.
"""

import types
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import collectives as C
from collectives import engine, reproducible
from collectives.reproducible import BITS_OF, GRID, Levels, family_of
from tests.reproducible_cases import DTYPES, contributions, model

needs_add = pytest.mark.skipif(
    reproducible.kernels() is None or not hasattr(engine.COMPILED, "repro_add"),
    reason=f"the compiled engine does not run or has no repro_add: {engine.why()}",
)

_EXPONENTS = {"float16": (-24, 15), "bfloat16": (-133, 127), "float32": (-149, 127), "float64": (-1074, 1023)}
"""The least subnormal's and the largest finite value's exponents."""


def _dtype(name: str) -> Any:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


State = tuple[bytes, bytes, bytes | None, int]


def _states(parts: list[np.ndarray], dtype: str) -> tuple[list[State], bytes]:
    """The accumulator's state after each add of ``parts``, and the bits of their sum's value."""
    levels = Levels(parts[0].size, family_of(dtype))
    states: list[State] = []
    for part in parts:
        levels.add(np.ascontiguousarray(part).reshape(-1))
        specials = None if levels.specials is None else levels.specials.tobytes()
        states.append((levels.codes.tobytes(), levels.levels.tobytes(), specials, levels.adds))
    total = C.ReproducibleSum(like=parts[0])
    for part in parts:
        total.add(part)
    return states, np.asarray(total.value()).tobytes()


def _both(monkeypatch: pytest.MonkeyPatch, parts: list[np.ndarray], dtype: str) -> bytes:
    """Both paths' states after each add, asserted equal; the value's bits, asserted the model's."""
    compiled = _states(parts, dtype)
    with monkeypatch.context() as patched:
        patched.setattr(engine, "COMPILED", None)
        assert reproducible.kernels() is None
        plain = _states(parts, dtype)
    for index, (ours, theirs) in enumerate(zip(compiled[0], plain[0], strict=True)):
        for name, a, b in zip(("codes", "levels", "specials", "adds"), ours, theirs, strict=True):
            assert a == b, f"{name} differ after add {index}"
    assert compiled[1] == plain[1]
    with np.errstate(invalid="ignore"):  # (bfloat16's signalling NaN, widened by the model)
        assert compiled[1] == model(parts, dtype).tobytes()
    return compiled[1]


def _rising(dtype: str, adds: int, count: int, seed: int) -> list[np.ndarray]:
    """Contributions whose magnitudes climb, per element, by 0, 1, 2, 3, 6 or 8 grid steps an add (or
    fall back), some negated copies of an earlier one (cancellation), and infinities and NaN in the
    later half only (an element turns special after it has sums)."""
    rng = np.random.default_rng(seed)
    least, top = _EXPONENTS[dtype]
    exponent = rng.integers(least, least + 2 * GRID, size=count)
    parts = []
    for index in range(adds):
        values = rng.uniform(1.0, 2.0, size=count) * np.exp2(np.minimum(exponent, top) - 1.0)
        values *= rng.choice([-1.0, 1.0], size=count)
        if index and rng.random() < 0.3:
            values = -parts[int(rng.integers(0, index))].astype(np.float64)
        if index >= adds // 2:
            odd = rng.random(size=count)
            values[odd < 0.01] = rng.choice([np.inf, -np.inf, np.nan], size=int((odd < 0.01).sum()))
        with np.errstate(over="ignore"):
            parts.append(values.astype(_dtype(dtype)))
        steps = rng.choice([0, 1, 2, 3, 6, 8, -2], size=count)
        exponent = np.clip(exponent + GRID * steps + rng.integers(-3, 4, size=count), least, top)
    return parts


@needs_add
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_hard_contributions_give_both_paths_the_same_state(
    monkeypatch: pytest.MonkeyPatch, dtype: str, seed: int
) -> None:
    # magnitudes across the range, cancellation, subnormals, signed zeros; inf and NaN from the first add
    _both(monkeypatch, contributions(dtype, 7, 3000, seed=seed), dtype)
    # none special at first (the specials made at the first), then some
    quiet = contributions(dtype, 3, 3000, seed=seed + 10, specials=False)
    _both(monkeypatch, [*quiet, *contributions(dtype, 3, 3000, seed=seed + 20)], dtype)


@needs_add
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [4, 5])
def test_codes_rising_by_any_steps_give_both_paths_the_same_state(
    monkeypatch: pytest.MonkeyPatch, dtype: str, seed: int
) -> None:
    parts = _rising(dtype, 12, 2500, seed=seed)
    _both(monkeypatch, parts, dtype)
    family = family_of(dtype)
    levels = Levels(2500, family)
    rose = set()
    for part in parts[: len(parts) // 2]:  # before any special: the steps the codes rose by
        before = levels.codes.astype(np.int16)
        levels.add(part)
        rose |= set((levels.codes - before)[before > reproducible.EMPTY].tolist())
    assert {1, 2}.issubset(rose), sorted(rose)
    assert max(rose) >= family.levels or dtype == "float16", sorted(rose)  # float16 spans 3 codes


@needs_add
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_float16_and_bfloat16_is_widened_as_numpy_does(
    monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    every = np.arange(1 << 16, dtype=np.uint16).view(_dtype(dtype))
    first = np.random.default_rng(6).permutation(every)  # codes from another element before
    _both(monkeypatch, [first, every, every[::-1].copy()], dtype)


@needs_add
@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["float32", "float64"]),
    st.integers(1, 5),
    st.lists(st.floats(allow_subnormal=True), min_size=3, max_size=3 * 8),
)
def test_any_floats_added_give_both_paths_the_same_state(dtype: str, adds: int, values: list[float]) -> None:
    count = len(values) // adds
    if count == 0:
        return
    with np.errstate(over="ignore"):
        parts = [np.array(values[a * count : (a + 1) * count]).astype(dtype) for a in range(adds)]
    with pytest.MonkeyPatch.context() as monkeypatch:
        _both(monkeypatch, parts, dtype)


@needs_add
def test_an_engine_without_repro_add_runs_the_numpy_add(monkeypatch: pytest.MonkeyPatch) -> None:
    built = engine.COMPILED
    older = types.SimpleNamespace(**{n: getattr(built, n) for n in dir(built) if n != "repro_add"})
    parts = contributions("float32", 4, 500, seed=7)
    expected = _states(parts, "float32")
    monkeypatch.setattr(engine, "COMPILED", older)
    assert reproducible.kernels() is older
    assert _states(parts, "float32") == expected


@needs_add
def test_the_compiled_add_checks_its_buffers() -> None:
    add = engine.COMPILED.repro_add
    codes, levels = np.zeros(4, np.int8), np.zeros((3, 4), np.int64)
    x = np.ones(4, np.float32)
    assert add(x, codes, levels, None, BITS_OF["float32"]) is False
    assert levels[0].tolist() == [2**47 // 2**16] * 4 and codes.tolist() == [1] * 4
    with pytest.raises(ValueError, match="a special byte per element"):
        add(x, codes, levels, np.zeros(3, np.uint8), BITS_OF["float32"])
    with pytest.raises(ValueError, match="levels' words"):
        add(x, codes, np.zeros((6, 8), np.int64), None, BITS_OF["float32"])  # float64's levels
    with pytest.raises(ValueError, match="x of its kind"):
        add(x, codes, levels, None, BITS_OF["float64"])
    with pytest.raises(ValueError, match="kind 7"):
        add(x, codes, levels, None, 7)
    with pytest.raises(TypeError, match="repro_add x"):
        add(np.ones(4, np.int32), codes, levels, None, BITS_OF["float32"])
    with pytest.raises(TypeError, match="repro_add"):
        add(x, codes, levels)
    specials = np.zeros(4, np.uint8)
    assert add(np.array([np.inf, 1, np.nan, -np.inf], np.float32), codes, levels, specials, 3) is True
    assert specials.tolist() == [2, 0, 1, 4] and codes.tolist() == [127, 1, 127, 127]
