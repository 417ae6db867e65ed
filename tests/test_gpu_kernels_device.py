"""Every CUDA kernel against numpy: every dtype, op and kind, aligned and not.

Each test runs twice: on a GPU through CuPy (marked ``gpu``; skipped where there is none), and
on the CPU through the host build of the same kernel sources (tests/host_cuda.py; skipped only
where there is no C++ compiler), which runs the loader and every kernel thread by thread.
"""

from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectives.backends import gpu_kernels
from collectives.backends.numpy_backend import UFUNCS
from collectives.ops import DTYPES, FLOAT_DTYPES, OPS
from tests import host_cuda

SIZES = (0, 1, 7, 4099, (1 << 20) + 3)
HOST_SIZES = (0, 1, 7, 4099, (1 << 16) + 3)
"""On the CPU the largest size is smaller, and still makes the stand-in device's grid stride."""
# element offsets of (dst, first source, other sources) from an allocation's start: equal offsets
# take the scalar head, the 128-bit body and the scalar tail; unequal ones the scalar path only
OFFSETS = ((0, 0, 0), (1, 1, 1), (3, 3, 3), (0, 1, 2), (2, 0, 3))
LARGE_OFFSETS = ((0, 0, 0), (1, 1, 1), (0, 1, 2))
PAIRS = [(name, dtype) for name, op in OPS.items() if name != "avg" for dtype in op.dtypes]
SIXTEEN_BIT_FLOATS = ("float16", "bfloat16")
MANY_BUFFERS = 2 * gpu_kernels.MAX_INPUTS + 3
"""Buffers the property test may use: dst and up to three reduce_many passes of sources."""


@pytest.fixture(scope="module", params=host_cuda.KINDS)
def cp(request: pytest.FixtureRequest) -> Iterator[Any]:
    """CuPy on a GPU, or the host build's stand-in for it, which the loader then uses."""
    with host_cuda.cupy_for(request.param) as module:
        yield module


def on_host(cp: Any) -> bool:
    return getattr(cp, "host_emulation", False)


def numpy_dtype(name: str) -> np.dtype[Any]:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def inputs(rng: np.random.Generator, dtype: str, op: str, count: int, exact: bool) -> np.ndarray:
    """Values for ``op`` on ``dtype``: integers over their range; floats small and whole (exact) or normal."""
    if dtype not in FLOAT_DTYPES:
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=count, dtype=dtype, endpoint=True)
    if exact:
        # sums and products of up to 8 of these are integers every float dtype holds exactly
        values = rng.integers(-2, 3, size=count) if op == "prod" else rng.integers(-8, 9, size=count)
        return values.astype(numpy_dtype(dtype))
    return rng.standard_normal(count).astype(numpy_dtype(dtype))


def device_view(cp: Any, host: np.ndarray, offset: int) -> Any:
    """A copy of ``host`` on the device, ``offset`` elements into its allocation; bfloat16 as uint16."""
    bits = host.view(np.uint16) if host.dtype == numpy_dtype("bfloat16") else host
    base = cp.empty(bits.size + offset, dtype=bits.dtype)
    view = base[offset : offset + bits.size]
    view.set(bits)
    return view


def to_host(array: Any, dtype: str) -> np.ndarray:
    return array.get().view(numpy_dtype(dtype))


def ordered(values: np.ndarray) -> np.ndarray:
    """Float bits as integers whose difference counts ulps (sign-magnitude to two's complement)."""
    width = values.dtype.itemsize * 8
    bits = values.view(f"int{width}").astype(np.int64)
    magnitude = bits & np.int64((1 << (width - 1)) - 1)
    return np.where(bits < 0, -magnitude, magnitude)


def assert_matches(actual: np.ndarray, expected: np.ndarray, dtype: str) -> None:
    """Equal bits, NaN matching NaN: the kernels round as numpy does, 16-bit floats included.

    A float mismatch is reported in ulps.
    """
    assert actual.shape == expected.shape
    if dtype not in FLOAT_DTYPES:
        np.testing.assert_array_equal(actual, expected)
        return
    actual_nan = np.isnan(actual.astype(np.float64))
    expected_nan = np.isnan(expected.astype(np.float64))
    np.testing.assert_array_equal(actual_nan, expected_nan, err_msg="NaN in different places")
    difference = np.abs(ordered(actual[~actual_nan]) - ordered(expected[~expected_nan]))
    worst = int(difference.max(initial=0))
    if worst:
        at = int(np.argmax(difference))
        pytest.fail(
            f"{dtype}: {worst} ulps apart at {at} ({np.count_nonzero(difference)} elements differ): "
            f"{actual[~actual_nan][at]} != {expected[~expected_nan][at]}"
        )


def reference(op: str, dtype: str, sources: list[np.ndarray]) -> np.ndarray:
    """What reduce_many computes: left to right, in float32 for the 16-bit floats, rounded once a pass.

    A pass reads up to MAX_INPUTS sources; each further pass folds the next MAX_INPUTS - 1 into
    the rounded result.
    """
    accumulate = np.float32 if dtype in SIXTEEN_BIT_FLOATS else numpy_dtype(dtype)
    first, rest = gpu_kernels.MAX_INPUTS, gpu_kernels.MAX_INPUTS - 1
    passes = [sources[:first]] + [sources[i : i + rest] for i in range(first, len(sources), rest)]
    result: np.ndarray | None = None
    with np.errstate(all="ignore"):
        for batch in passes:
            values = [source.astype(accumulate) for source in batch]
            partial = values[0] if result is None else result.astype(accumulate)
            for value in values[0 if result is not None else 1 :]:
                partial = UFUNCS[op](partial, value)
            result = partial.astype(numpy_dtype(dtype))
    assert result is not None
    return result


def cases(cp: Any, dtype: str) -> list[tuple[int, tuple[int, int, int], bool]]:
    """(size, offsets, exact) to run; the large size with fewer offsets."""
    found = []
    for size in HOST_SIZES if on_host(cp) else SIZES:
        for offsets in LARGE_OFFSETS if size > 10_000 else OFFSETS:
            for exact in (True, False) if dtype in FLOAT_DTYPES else (True,):
                found.append((size, offsets, exact))
    return found


def bf16(dtype: str) -> dict[str, str]:
    """The dtype override CuPy's missing bfloat16 needs."""
    return {"dtype": "bfloat16"} if dtype == "bfloat16" else {}


@pytest.mark.parametrize(("op", "dtype"), PAIRS)
def test_combine(cp: Any, op: str, dtype: str) -> None:
    rng = np.random.default_rng(1)
    for size, (off_dst, off_src, _), exact in cases(cp, dtype):
        a, b = inputs(rng, dtype, op, size, exact), inputs(rng, dtype, op, size, exact)
        dst, src = device_view(cp, a, off_dst), device_view(cp, b, off_src)
        gpu_kernels.combine(op, dst, src, **bf16(dtype))
        assert_matches(to_host(dst, dtype), reference(op, dtype, [a, b]), dtype)
        assert_matches(to_host(src, dtype), b, dtype)


@pytest.mark.parametrize(("op", "dtype"), PAIRS)
def test_reduce_into(cp: Any, op: str, dtype: str) -> None:
    rng = np.random.default_rng(2)
    for size, (off_dst, off_a, off_b), exact in cases(cp, dtype):
        a, b = inputs(rng, dtype, op, size, exact), inputs(rng, dtype, op, size, exact)
        dst = device_view(cp, np.zeros(size, numpy_dtype(dtype)), off_dst)
        da, db = device_view(cp, a, off_a), device_view(cp, b, off_b)
        gpu_kernels.reduce_into(op, dst, da, db, **bf16(dtype))
        assert_matches(to_host(dst, dtype), reference(op, dtype, [a, b]), dtype)
        assert_matches(to_host(da, dtype), a, dtype)


@pytest.mark.parametrize(("op", "dtype"), PAIRS)
def test_reduce_many(cp: Any, op: str, dtype: str) -> None:
    rng = np.random.default_rng(3)
    for size, (off_dst, off_first, off_rest), exact in cases(cp, dtype):
        for k in range(1, 10) if size < 10_000 else (2, 8):
            hosts = [inputs(rng, dtype, op, size, exact) for _ in range(k)]
            offsets = [off_first] + [off_rest] * (k - 1)
            sources = [device_view(cp, host, offset) for host, offset in zip(hosts, offsets, strict=True)]
            dst = device_view(cp, np.zeros(size, numpy_dtype(dtype)), off_dst)
            gpu_kernels.reduce_many(op, dst, sources, **bf16(dtype))
            expected = reference(op, dtype, hosts)
            assert_matches(to_host(dst, dtype), expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_aliases(cp: Any, dtype: str) -> None:
    rng = np.random.default_rng(4)
    a, b = inputs(rng, dtype, "sum", 4099, True), inputs(rng, dtype, "sum", 4099, True)
    dst = device_view(cp, a, 1)
    gpu_kernels.combine("sum", dst, dst, **bf16(dtype))
    assert_matches(to_host(dst, dtype), reference("sum", dtype, [a, a]), dtype)
    dst, src = device_view(cp, a, 0), device_view(cp, b, 0)
    gpu_kernels.reduce_many("max", dst, [src, dst, src], **bf16(dtype))
    assert_matches(to_host(dst, dtype), reference("max", dtype, [b, a, b]), dtype)
    dst, src = device_view(cp, a, 0), device_view(cp, b, 0)
    gpu_kernels.reduce_into("min", dst, src, dst, **bf16(dtype))
    assert_matches(to_host(dst, dtype), reference("min", dtype, [b, a]), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", ["min", "max"])
def test_min_and_max_propagate_nan(cp: Any, dtype: str, op: str) -> None:
    size = 4099
    a = np.linspace(-3, 3, size).astype(numpy_dtype(dtype))
    b = a[::-1].copy()
    a[::5] = np.nan
    b[::7] = np.nan
    a[1::11] = np.inf
    b[2::13] = -np.inf
    expected = reference(op, dtype, [a, b])
    assert np.isnan(expected.astype(np.float64)).sum() > size // 5
    for offset in (0, 1):
        dst, src = device_view(cp, a, offset), device_view(cp, b, offset)
        gpu_kernels.combine(op, dst, src, **bf16(dtype))
        assert_matches(to_host(dst, dtype), expected, dtype)
        dst = device_view(cp, np.zeros(size, numpy_dtype(dtype)), offset)
        many = [device_view(cp, host, offset) for host in (a, b, a, b)]
        gpu_kernels.reduce_many(op, dst, many, **bf16(dtype))
        assert_matches(to_host(dst, dtype), expected, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_divide_as_numpy_true_divide(cp: Any, dtype: str) -> None:
    rng = np.random.default_rng(5)
    for size in HOST_SIZES if on_host(cp) else SIZES:
        for offset in (0, 1, 3):
            for divisor in (1, 2, 3, 7, 257, 100_000):
                host = (rng.standard_normal(size) * 100).astype(numpy_dtype(dtype))
                host[: min(size, 3)] = [np.nan, np.inf, 0][: min(size, 3)]
                expected = host.copy()
                with np.errstate(all="ignore"):
                    np.true_divide(expected, divisor, out=expected)
                buffer = device_view(cp, host, offset)
                gpu_kernels.divide(buffer, divisor, **bf16(dtype))
                assert_matches(to_host(buffer, dtype), expected, dtype)


def test_float32_subnormals_are_kept(cp: Any) -> None:
    tiny = np.array([1e-45, 3e-39, -2e-40, 1e-38], dtype=np.float32)
    dst, src = device_view(cp, tiny, 0), device_view(cp, tiny, 0)
    gpu_kernels.combine("sum", dst, src)
    np.testing.assert_array_equal(to_host(dst, "float32"), tiny + tiny)
    dst = device_view(cp, tiny, 0)
    gpu_kernels.combine("min", dst, device_view(cp, np.zeros(4, np.float32), 0))
    np.testing.assert_array_equal(to_host(dst, "float32"), np.minimum(tiny, 0))


def test_kernels_run_on_the_current_stream(cp: Any) -> None:
    if on_host(cp):
        pytest.skip("streams are CUDA's; the host build runs each launch to the end at once")
    size = 1 << 22
    with cp.cuda.Stream(non_blocking=True) as stream:
        dst = cp.zeros(size, dtype=cp.float32)
        src = cp.ones(size, dtype=cp.float32)
        for _ in range(5):
            dst += 1  # queued on the stream before the kernel
        gpu_kernels.combine("sum", dst, src)
        result = dst.get(stream=stream)
        stream.synchronize()
    assert np.all(result == 6)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pair=st.sampled_from(PAIRS),
    size=st.integers(0, 3000),
    count=st.integers(1, MANY_BUFFERS - 1),
    offsets=st.lists(st.integers(0, 17), min_size=MANY_BUFFERS, max_size=MANY_BUFFERS),
    same_phase=st.booleans(),
    exact=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_reduce_many_at_any_offsets(
    cp: Any,
    pair: tuple[str, str],
    size: int,
    count: int,
    offsets: list[int],
    same_phase: bool,
    exact: bool,
    seed: int,
) -> None:
    # each buffer at an offset of its own; with same_phase all at one offset from a 16-byte
    # boundary (the 128-bit path), else mostly not (the scalar path)
    op, dtype = pair
    if same_phase:
        per_pack = 16 // numpy_dtype(dtype).itemsize
        offsets = [offsets[0] + per_pack * (offset % 3) for offset in offsets]
    rng = np.random.default_rng(seed)
    hosts = [inputs(rng, dtype, op, size, exact) for _ in range(count)]
    sources = [device_view(cp, host, offset) for host, offset in zip(hosts, offsets[1:], strict=False)]
    dst = device_view(cp, np.zeros(size, numpy_dtype(dtype)), offsets[0])
    gpu_kernels.reduce_many(op, dst, sources, **bf16(dtype))
    assert_matches(to_host(dst, dtype), reference(op, dtype, hosts), dtype)
