"""The reproducible sum's compiled loops and its numpy path: the same bits, on inputs hard to sum alike."""

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import collectives as C
from collectives import engine, reproducible, reproducible_calls
from collectives.ops import get_op
from collectives.reproducible import FAMILIES, WORD, family_of
from tests.conftest import run_ranks
from tests.reproducible_cases import DTYPES, contributions, model

ROOT = Path(__file__).resolve().parent.parent
needs_loops = pytest.mark.skipif(
    reproducible.kernels() is None, reason=f"the compiled engine does not run: {engine.why()}"
)


def _bits(result: Any) -> bytes:
    return np.asarray(result).tobytes()


def _both(monkeypatch: pytest.MonkeyPatch, make: Any) -> tuple[Any, Any]:
    """``make()`` with the compiled loops and with the numpy path (the engine switched off)."""
    compiled = make()
    with monkeypatch.context() as patched:
        patched.setattr(engine, "COMPILED", None)
        assert reproducible.kernels() is None
        plain = make()
    return compiled, plain


def _words(flats: list[np.ndarray], agreed: np.ndarray, family: Any, wire: Any) -> list[np.ndarray]:
    return [reproducible.words_of(f, agreed, family, wire) for f in flats]


def _sum_and_average(parts: list[np.ndarray], comm: C.Communicator) -> tuple[np.ndarray, np.ndarray]:
    x = parts[comm.rank]
    out = np.empty_like(x)
    C.allreduce(x, reproducible=True, comm=comm, out=out)
    return out, C.allreduce(x, "avg", reproducible=True, comm=comm)


def _flat(parts: list[np.ndarray], dtype: str) -> list[np.ndarray]:
    work = family_of(dtype).work
    return [np.ascontiguousarray(p, dtype=work).reshape(-1) for p in parts]


@needs_loops
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [1, 2, 3, 8])
def test_each_loop_gives_the_numpy_paths_bits(monkeypatch: pytest.MonkeyPatch, dtype: str, size: int) -> None:
    family = family_of(dtype)
    parts = contributions(dtype, size, 2000, seed=20 + size)
    flats = _flat(parts, dtype)
    codes, plain_codes = _both(monkeypatch, lambda: [reproducible.codes_of(f, family) for f in flats])
    assert [_bits(c) for c in codes] == [_bits(c) for c in plain_codes]
    agreed = np.maximum.reduce(codes)
    specials = np.bitwise_or.reduce([reproducible.special_bits(f) for f in flats])
    for wire in (np.float64, np.int64) if family.words == 1 else (np.int64,):
        words, plain_words = _both(monkeypatch, functools.partial(_words, flats, agreed, family, wire))
        assert [_bits(w) for w in words] == [_bits(w) for w in plain_words], wire
        sums = np.add.reduce(words)
        for divide_by in (1, 3):
            finished = functools.partial(
                reproducible.finish, sums, agreed, family, parts[0].dtype, divide_by=divide_by,
                specials=specials,
            )  # fmt: skip
            result, plain = _both(monkeypatch, finished)
            assert result.dtype == plain.dtype and _bits(result) == _bits(plain), (wire, divide_by)
            if divide_by == 1:
                assert _bits(result) == _bits(model(parts, dtype))


@needs_loops
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_gathered_sum_gives_the_numpy_paths_and_the_models_bits(
    monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    for size in (1, 2, 3, 5, 8):
        parts = contributions(dtype, size, 1000, seed=40 + size)
        family = family_of(dtype)
        flats = _flat(parts, dtype)
        rows = [reproducible.gathered_message(f, family, size, rank, (1, 2)) for rank, f in enumerate(flats)]
        message = np.bitwise_or.reduce(rows)
        pack = functools.partial(reproducible.gathered_message, flats[-1], family, size, 0, (1, 2))
        packed = _both(monkeypatch, pack)
        assert _bits(packed[0]) == _bits(packed[1])
        for divide_by in (1, size):
            summed = functools.partial(
                reproducible.rows_sum, message, 1000, family, parts[0].dtype, divide_by=divide_by
            )
            result, plain = _both(monkeypatch, summed)
            assert _bits(result) == _bits(plain), (size, divide_by)
            if divide_by == 1:  # (the model's avg drops the sign of a quotient that underflows to zero)
                assert _bits(result) == _bits(model(parts, dtype)), size
        if size > 1:  # a rank's trailer differs: no result on either path
            message[-1, -1] += 1
            summed = functools.partial(reproducible.rows_sum, message, 1000, family, parts[0].dtype)
            assert _both(monkeypatch, summed) == (None, None)


@needs_loops
@pytest.mark.parametrize("dtype", DTYPES)
def test_any_summed_words_round_alike(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    # words as large as the most contributions give them, at every code, subnormal results included
    family = FAMILIES["float64" if dtype == "float64" else "float32"]
    rng = np.random.default_rng(8)
    count = 5000
    codes = rng.integers(family.lowest - 1, family.top + 1, size=count).astype(np.int8)
    codes[:300] = family.lowest
    codes[300:320] = reproducible.SPECIAL
    bits = rng.integers(0, 8, size=count).astype(np.uint8)
    size = rng.integers(0, 62, size=(count, family.words))
    words = (rng.integers(-(2**62), 2**62, size=(count, family.words)) >> (62 - size)).reshape(-1)
    if family.words == 2:  # the low words of at most 2**15 contributions: below 2**62
        words[1::2] >>= 62 - WORD - 15
    dtype_ = contributions(dtype, 1, 1, seed=0)[0].dtype
    for divide_by in (1, 3):
        finished = functools.partial(
            reproducible.finish, words, codes, family, dtype_, divide_by=divide_by, specials=bits
        )
        result, plain = _both(monkeypatch, finished)
        assert _bits(result) == _bits(plain), divide_by


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_gathered_and_the_distributed_allreduce_give_the_models_bits(
    monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    for size in (2, 3, 5):
        parts = contributions(dtype, size, 700, seed=60 + size)
        expected = model(parts, dtype)
        averages: list[bytes] = []
        for gathered_bytes in (reproducible_calls.GATHERED_BYTES, 0):  # gathered, then the two collectives
            monkeypatch.setattr(reproducible_calls, "GATHERED_BYTES", gathered_bytes)
            itemsize = family_of(dtype).work.itemsize
            assert reproducible_calls.gathers(size, 700, itemsize, True) == bool(gathered_bytes)
            for result, average in run_ranks(size, functools.partial(_sum_and_average, parts)):
                assert _bits(result) == _bits(expected), (size, gathered_bytes)
                averages.append(_bits(average))
        assert len(set(averages)) == 1, size  # gathered or not, and on every rank


def test_gathered_ranks_with_different_families_raise_on_every_rank() -> None:
    def call(comm: C.Communicator) -> str:
        x = np.ones(4, np.float64 if comm.rank else np.float32)
        with pytest.raises(C.MismatchError, match="reproducible allreduce"):
            C.allreduce(x, reproducible=True, comm=comm)
        return "raised"

    assert run_ranks(2, call) == ["raised", "raised"]


_SUBPROCESS = """
import hashlib, sys
import numpy as np
import collectives as C
from collectives import reproducible
from tests.conftest import run_ranks
from tests.reproducible_cases import contributions
print(reproducible.kernels() is not None)
for dtype in ("float16", "bfloat16", "float32", "float64"):
    parts = contributions(dtype, 3, 500, seed=5)
    results = run_ranks(3, lambda comm: C.allreduce(parts[comm.rank], reproducible=True, comm=comm))
    total = C.ReproducibleSum(like=parts[0])
    for part in parts:
        total.add(part)
    print(dtype, hashlib.sha256(results[0].tobytes() + total.value().tobytes()).hexdigest())
"""


def test_with_the_engine_off_a_process_gives_the_same_bits() -> None:
    runs = []
    for flag in ("0", ""):
        env = {**os.environ, "COLLECTIVES_COMPILED": flag}
        command = [sys.executable, "-c", _SUBPROCESS]
        done = subprocess.run(
            command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, done.stderr
        runs.append(done.stdout.splitlines())
    assert runs[0][0] == "False"
    assert runs[0][1:] == runs[1][1:] and len(runs[0]) == 5


@needs_loops
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("count", "seed"), [(3000, 70), (513, 71), (7, 72)])
def test_the_pair_kernel_gives_the_gathered_sums_bits_into_either_input(
    dtype: str, count: int, seed: int
) -> None:
    parts = contributions(dtype, 2, count, seed=seed)
    parts[0][::5] = parts[1][::5] = np.finfo(dtype).max * 0.75  # sums past the largest value
    family = family_of(dtype)
    message = np.bitwise_or.reduce(
        [reproducible.gathered_message(p, family, 2, rank, (1, 2)) for rank, p in enumerate(parts)]
    )
    for divide_by in (1, 2, 3):  # a sum, a power of two, a divisor of other kinds
        expected = reproducible.rows_sum(message, count, family, parts[0].dtype, divide_by=divide_by)
        assert expected is not None
        for into in ("new", "a", "b"):
            a, b = parts[0].copy(), parts[1].copy()
            out = np.empty_like(a) if into == "new" else a if into == "a" else b
            engine.COMPILED.repro_pair(out, a, b, divide_by)
            assert _bits(out) == _bits(expected), (divide_by, into)
        if divide_by == 1:
            assert _bits(expected) == _bits(model(parts, dtype))
    with pytest.raises(ValueError, match="one float dtype and count"):
        engine.COMPILED.repro_pair(np.empty(3, dtype), parts[0][:3], parts[1][:4], 1)


@needs_loops
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_engines_calls_take_the_reproducible_ops_with_repro_sum_rows_bits(dtype: str) -> None:
    compiled = engine.COMPILED
    a, b = contributions(dtype, 2, 3000, seed=71)
    for op, divide_by in (("sum", 1), ("avg", 2)):
        pair = reproducible_calls.pair_op(2, dtype, op, True)
        assert pair is not None and pair.custom and pair.whole
        name = pair.compiled_combine
        assert name == f"repro_{op}" and engine.reduces(dtype, name)
        expected = np.empty_like(a)
        compiled.repro_pair(expected, a, b, divide_by)
        out = np.empty_like(a)
        compiled.combine(dtype, name, out, a, b)  # two ranks' loop
        assert _bits(out) == _bits(expected), op
        again = b.copy()
        compiled.combine(dtype, name, again, a, again)  # into an input, as the small call's regions
        assert _bits(again) == _bits(expected), op
    for other in ("float16", "int32", "int64"):  # they sum float32 and float64 alone
        assert not engine.reduces(other, "repro_sum") and not engine.reduces(other, "repro_avg")


@needs_loops
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
def test_the_engines_small_call_sums_every_ranks_region_at_once(dtype: str, ranks: int) -> None:
    """The repeated small call's reduction (run here without its barrier): every region in one sum."""
    control, state = np.zeros(64, np.int64), np.zeros(4, np.int64)
    words = [[8 * r + 1 for r in range(ranks)], [8 * r + 2 for r in range(ranks)]]
    parts = contributions(dtype, ranks, 700, seed=73 + ranks)
    regions = [[p.copy() for p in parts] for _ in range(2)]
    for op in ("sum", "avg"):
        slots = [8 * r for r in range(ranks)]
        meeting = (control, state, slots, words, 4, 32, 0, dtype, f"repro_{op}", 16, 1e-3)
        kernel = engine.COMPILED.SmallAllreduce(meeting=meeting, regions=regions, count=700)
        out = np.empty_like(parts[0])
        kernel.reduce(1, out)
        expected = np.empty_like(out)
        if ranks == 1:  # one rank's region is the result, as the Python path copies it
            expected[...] = parts[0]
        else:
            engine.COMPILED.repro_sum_rows(expected, parts, ranks if op == "avg" else 1)
        assert _bits(out) == _bits(expected), op
    if ranks > 2:
        assert _bits(expected) == _bits(model(parts, dtype, divide_by=ranks))  # the avg's, by definition


@needs_loops
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_sum_of_rows_gives_the_gathered_sums_bits(dtype: str) -> None:
    family = family_of(dtype)
    for ranks, seed in ((3, 74), (4, 75), (8, 76), (64, 77)):
        parts = contributions(dtype, ranks, 1100, seed=seed)
        parts[0][::9] = parts[1][::9] = np.finfo(dtype).max * 0.75  # partial sums past the largest value
        parts[2][::9] = -parts[0][::9]
        message = np.bitwise_or.reduce(
            [reproducible.gathered_message(p, family, ranks, rank, (1, 2)) for rank, p in enumerate(parts)]
        )
        for divide_by in (1, 4, ranks):
            expected = reproducible.rows_sum(message, 1100, family, parts[0].dtype, divide_by=divide_by)
            assert expected is not None
            into = parts[1].copy()  # into one of the rows
            engine.COMPILED.repro_sum_rows(into, [*parts[:1], into, *parts[2:]], divide_by)
            assert _bits(into) == _bits(expected), (ranks, divide_by)
    with pytest.raises(ValueError, match="one float dtype and count"):
        engine.COMPILED.repro_sum_rows(np.empty(3, dtype), [parts[0][:3], parts[1][:4], parts[2][:3]], 1)
    with pytest.raises(ValueError, match="1 to 64 rows"):
        engine.COMPILED.repro_sum_rows(np.empty(3, dtype), [], 1)


def test_only_the_reproducible_ops_among_custom_ops_name_a_compiled_combine() -> None:
    assert C.Op(np.logaddexp).compiled_combine is None
    assert C.Op(lambda a, b: a + b, name="plus").compiled_combine is None
    assert get_op("sum").compiled_combine == "sum" and get_op("avg").compiled_combine == "sum"
    names = {p.compiled_combine for p in reproducible_calls._PAIRS.values()}
    assert names == {"repro_sum", "repro_avg"}


@needs_loops
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_two_ranks_sum_by_the_pair_op_with_every_algorithm(
    monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    from collectives.algorithms import ALGORITHMS
    from collectives.selector import rejection_reasons

    parts = contributions(dtype, 2, 501, seed=81)
    expected = model(parts, dtype)
    assert reproducible_calls.pair_op(2, dtype, "sum", True) is not None
    assert reproducible_calls.pair_op(3, dtype, "sum", True) is None
    assert reproducible_calls.pair_op(2, dtype, "sum", False) is None  # unchecked: gathered or not
    names = [
        name for name, module in ALGORITHMS.items()
        if hasattr(module, "allreduce") and not rejection_reasons("allreduce", name, 2, 501)
    ]  # fmt: skip
    assert len(names) > 3, names

    def call(comm: C.Communicator) -> list[Any]:
        x = parts[comm.rank]
        done = [C.allreduce(x, reproducible=True, algorithm=n, comm=comm) for n in names]
        inplace = x.copy()
        C.allreduce(inplace, out=inplace, reproducible=True, comm=comm)
        shaped = C.allreduce(x[:500].reshape(20, 25), reproducible=True, comm=comm)
        rooted = C.reduce(x, root=1, reproducible=True, comm=comm)
        share = C.reduce_scatter(x, counts=[200, 301], reproducible=True, comm=comm)
        average = C.allreduce(x, "avg", reproducible=True, comm=comm)
        return [done, inplace, shaped, rooted, share, average]

    ranks = run_ranks(2, call)
    with monkeypatch.context() as patched:  # the same call without the pair op: gathered
        patched.setattr(reproducible_calls, "pair_op", lambda *args: None)
        patched.setattr(reproducible_calls, "plain_op", lambda *args: None)
        averages = run_ranks(
            2, lambda comm: C.allreduce(parts[comm.rank], "avg", reproducible=True, comm=comm)
        )
    for rank, (done, inplace, shaped, rooted, share, average) in enumerate(ranks):
        assert all(_bits(d) == _bits(expected) for d in done)
        assert _bits(inplace) == _bits(expected)
        assert shaped.shape == (20, 25) and _bits(shaped) == _bits(expected[:500].reshape(20, 25))
        assert (rooted is None) == (rank == 0) and (rooted is None or _bits(rooted) == _bits(expected))
        assert _bits(share) == _bits(expected[:200] if rank == 0 else expected[200:])
        assert _bits(average) == _bits(averages[rank])


def test_two_ranks_of_other_dtypes_raise_on_both_with_the_pair_op() -> None:
    def call(comm: C.Communicator) -> str:
        x = np.ones(4, np.float32)
        with pytest.raises(C.MismatchError, match="reproducible allreduce"):
            C.allreduce(x, "sum" if comm.rank else "avg", reproducible=True, comm=comm)
        return "raised"

    assert run_ranks(2, call) == ["raised", "raised"]
