"""The CUDA kernels and their loader without a GPU: NVRTC compiles them, a stand-in for CuPy runs the loader.

NVRTC (``cuda-bindings`` and ``nvidia-cuda-nvrtc``, the ``test`` extra on Linux x86_64)
compiles without a device, so the sources, entry points and 128-bit accesses are checked on
every machine that has it. The loader's argument checks and launch protocol run against a
numpy stand-in for CuPy whose "kernels" compute what the real ones must; the real kernels'
numbers are checked on a GPU by tests/test_gpu_kernels_device.py.
"""

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from collectives.backends import gpu_kernels
from collectives.backends.numpy_backend import UFUNCS
from collectives.errors import InvalidBufferError, UnsupportedDtypeError, UnsupportedOpError
from collectives.ops import DTYPES, FLOAT_DTYPES, INTEGER_DTYPES, OPS

ARCHITECTURES = ("compute_80", "compute_90")
Launch = tuple[str, tuple[int, ...], tuple[int, ...], tuple[Any, ...]]
"""A kernel launch the stand-in for CuPy saw: name, grid, block, arguments."""

# --------------------------------------------------------------------------------------------- sources


def test_sources_and_names_need_no_cupy() -> None:
    code = (
        "import sys\n"
        "from collectives.backends import gpu_kernels as g\n"
        "sources = g.kernel_sources()\n"
        "assert g.kernel_names() and g.module_source()\n"
        "print(sorted(sources), 'cupy' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "['collectives_reduce.cu', 'collectives_reduce.cuh'] False"


def test_module_source_inlines_the_headers() -> None:
    sources = gpu_kernels.kernel_sources()
    module = gpu_kernels.module_source()
    assert "#include" not in module
    assert sources["collectives_reduce.cuh"] in module


def test_kernel_names_follow_ops() -> None:
    names = gpu_kernels.kernel_names()
    assert len(names) == len(set(names))
    assert all(name.startswith("collectives_") for name in names)
    pairs = sum(len(op.dtypes) for name, op in OPS.items() if name != "avg")
    assert len(names) == 3 * pairs + len(FLOAT_DTYPES)
    assert "collectives_reduce_many_bxor_uint64" in names
    assert "collectives_combine_bxor_float32" not in names  # no bitwise ops on floats
    assert "collectives_divide_int32" not in names  # no avg on integers
    assert gpu_kernels.kernel_name("reduce_into", "max", "bfloat16") == "collectives_reduce_into_max_bfloat16"


# --------------------------------------------------------------------------------------------- NVRTC


def _nvrtc() -> Any:
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        pytest.skip("cuda.bindings is not installed (pip install 'cuda-bindings>=13,<14' nvidia-cuda-nvrtc)")
    try:
        error, _major, _minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # the bindings load libnvrtc on first use
        pytest.skip(f"libnvrtc cannot be loaded ({exc}); pip install nvidia-cuda-nvrtc")
    if error != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        pytest.skip(f"libnvrtc does not work here: {error}")
    return nvrtc


def compile_ptx(
    source: str, name: str, options: tuple[str, ...], headers: dict[str, str] | None = None, ptx: bool = True
) -> tuple[str, str]:
    """``(ptx, log)`` of ``source``; fails the test with NVRTC's log if it does not compile.

    With ``ptx=False`` (for a real architecture, ``sm_90``, which NVRTC compiles on to machine
    code) the PTX is not asked for and comes back empty.
    """
    nvrtc = _nvrtc()
    headers = headers or {}
    error, program = nvrtc.nvrtcCreateProgram(
        source.encode(),
        name.encode(),
        len(headers),
        [text.encode() for text in headers.values()],
        [header.encode() for header in headers],
    )
    assert error == nvrtc.nvrtcResult.NVRTC_SUCCESS, error
    try:
        arguments = [option.encode() for option in options]
        (compiled,) = nvrtc.nvrtcCompileProgram(program, len(arguments), arguments)
        error, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(program, log)
        log_text = log.rstrip(b"\0 ").decode(errors="replace")
        if compiled != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            pytest.fail(f"{name} does not compile with {options}: {compiled}\n{log_text}")
        if not ptx:
            return "", log_text
        error, size = nvrtc.nvrtcGetPTXSize(program)
        assert error == nvrtc.nvrtcResult.NVRTC_SUCCESS, error
        text = b" " * size
        (error,) = nvrtc.nvrtcGetPTX(program, text)
        assert error == nvrtc.nvrtcResult.NVRTC_SUCCESS, error
        return text.rstrip(b"\0").decode(), log_text
    finally:
        nvrtc.nvrtcDestroyProgram(program)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def ptx(request: pytest.FixtureRequest) -> str:
    """The PTX of the module the loader compiles, for one architecture."""
    options = (*gpu_kernels.NVRTC_OPTIONS, f"--gpu-architecture={request.param}")
    text, log = compile_ptx(gpu_kernels.module_source(), "collectives_module.cu", options)
    assert "warning" not in log.lower(), log
    return text


def _entries(ptx: str) -> dict[str, str]:
    """Each ``.entry`` of ``ptx`` mapped to its body."""
    bodies = re.split(r"^\.visible \.entry ", ptx, flags=re.MULTILINE)[1:]
    return {body[: body.index("(")]: body for body in bodies}


def test_every_source_compiles_on_its_own() -> None:
    sources = gpu_kernels.kernel_sources()
    headers = {name: text for name, text in sources.items() if name.endswith(".cuh")}
    for name, text in sources.items():
        if name.endswith(".cu"):
            # the front end is what differs from the loader's module: code generation is tested on that
            options = (*gpu_kernels.NVRTC_OPTIONS, "--gpu-architecture=compute_90", "-fdevice-syntax-only")
            compile_ptx(text, name, options, headers)


def test_every_kernel_name_is_an_entry_point(ptx: str) -> None:
    assert sorted(_entries(ptx)) == sorted(gpu_kernels.kernel_names())


def test_combine_float32_uses_128_bit_accesses(ptx: str) -> None:
    body = _entries(ptx)["collectives_combine_sum_float32"]
    assert re.search(r"ld\.global(\.nc)?\.v4\.", body), "no 128-bit load in the float32 combine"
    assert re.search(r"st\.global\.v4\.", body), "no 128-bit store in the float32 combine"


def test_every_kernel_has_a_vector_path(ptx: str) -> None:
    for name, body in _entries(ptx).items():
        # 16 bytes at once, whatever the compiler splits them into registers as
        assert re.search(r"ld\.global(\.nc)?\.v[24]\.(u|b|f|s)(32|64)", body), name


def test_no_kernel_spills_and_the_two_input_ones_keep_a_full_device_busy() -> None:
    # machine code for an H100/H200, with ptxas's report of each kernel's registers and local memory
    options = (*gpu_kernels.NVRTC_OPTIONS, "--gpu-architecture=sm_90", "--ptxas-options=-v")
    _, log = compile_ptx(gpu_kernels.module_source(), "collectives_module.cu", options, ptx=False)
    report = re.findall(
        r"entry function '(\w+)'.*?(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
        r".*?Used (\d+) registers",
        log,
        flags=re.DOTALL,
    )
    assert sorted(name for name, *_ in report) == sorted(gpu_kernels.kernel_names())
    for name, stack, stores, loads, registers in report:
        assert (stack, stores, loads) == ("0", "0", "0"), f"{name}: {stack}/{stores}/{loads} bytes"
        if "_combine_" in name or "_reduce_into_" in name:
            # 32 registers x 2048 threads fill an SM's 64K: the loader's 8 blocks of 256 all resident
            assert int(registers) <= 32, f"{name} uses {registers} registers"
        else:
            assert int(registers) <= 64, f"{name} uses {registers} registers"


def test_float_arithmetic_keeps_subnormals(ptx: str) -> None:
    # CuPy compiles with -ftz=true; the kernels' own PTX must not flush to zero anyway
    for name, body in _entries(ptx).items():
        if "float" in name:
            assert ".ftz" not in body, name


# --------------------------------------------------------------------------------------------- loader


def _numpy_dtype(name: str) -> np.dtype[Any]:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


class FakeArray:
    """The part of ``cupy.ndarray`` the loader uses, over host memory."""

    def __init__(self, host: np.ndarray, device: int = 0) -> None:
        self.host = host
        self.device = SimpleNamespace(id=device)

    def __getattr__(self, name: str) -> Any:
        if name in ("ndim", "flags", "dtype", "size", "shape", "strides", "nbytes"):
            return getattr(self.host, name)
        raise AttributeError(name)

    @property
    def data(self) -> SimpleNamespace:
        return SimpleNamespace(ptr=self.host.__array_interface__["data"][0])

    def __getitem__(self, key: Any) -> "FakeArray":
        return FakeArray(self.host[key], self.device.id)


class FakeKernel:
    """Does with numpy what the kernel of its name must do, and records each launch."""

    def __init__(self, name: str, launches: list[Launch]) -> None:
        self.name = name
        self.launches = launches

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]) -> None:
        self.launches.append((self.name, grid, block, args))
        rest = self.name.removeprefix("collectives_")
        kind = next(kind for kind in gpu_kernels.KINDS if rest.startswith(kind + "_"))
        *op, dtype = rest.removeprefix(kind + "_").split("_")
        numpy_dtype = _numpy_dtype(dtype)

        def view(array: FakeArray) -> np.ndarray:
            return array.host.view(numpy_dtype)

        assert isinstance(args[-1], np.uint64)
        count = int(args[-1])
        assert count == args[0].size > 0
        with np.errstate(all="ignore"):
            if kind == "divide":
                assert isinstance(args[1], np.float32 if dtype != "float64" else np.float64)
                result = (view(args[0]).astype(np.float64) / np.float64(args[1])).astype(numpy_dtype)
                view(args[0])[...] = result
                return
            ufunc = UFUNCS[op[0]]
            if kind == "combine":
                ufunc(view(args[0]), view(args[1]), out=view(args[0]))
            elif kind == "reduce_into":
                ufunc(view(args[1]), view(args[2]), out=view(args[0]))
            else:
                assert isinstance(args[9], np.int32)
                k = int(args[9])
                assert 1 <= k <= gpu_kernels.MAX_INPUTS
                inputs = [view(array).copy() for array in args[1 : 1 + k]]
                accumulator = inputs[0]
                for other in inputs[1:]:
                    accumulator = ufunc(accumulator, other)
                view(args[0])[...] = accumulator


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Launch]]:
    """Make the loader use the stand-in; the list of launches it records."""
    launches: list[Launch] = []
    compiled: list[tuple[str, tuple[str, ...]]] = []

    class RawModule:
        def __init__(self, code: str, options: tuple[str, ...]) -> None:
            compiled.append((code, options))

        def get_function(self, name: str) -> FakeKernel:
            assert name in gpu_kernels.kernel_names()
            return FakeKernel(name, launches)

    runtime = SimpleNamespace(
        getDevice=lambda: 0, getDeviceProperties=lambda device: {"multiProcessorCount": 2}
    )
    fake = SimpleNamespace(ndarray=FakeArray, RawModule=RawModule, cuda=SimpleNamespace(runtime=runtime))
    monkeypatch.setattr(gpu_kernels, "_cupy", lambda: fake)
    monkeypatch.setattr(gpu_kernels, "_modules", {})
    monkeypatch.setattr(gpu_kernels, "_functions", {})
    monkeypatch.setattr(gpu_kernels, "_max_blocks", {})
    yield launches
    assert all(options == gpu_kernels.NVRTC_OPTIONS for _, options in compiled)
    assert len(compiled) <= 1, "the module is compiled once per device"


def _array(values: Any, dtype: str) -> FakeArray:
    return FakeArray(np.asarray(values, dtype=np.float64).astype(_numpy_dtype(dtype)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_combine_and_reduce_into_launch_the_named_kernel(fake_cupy: list[Any], dtype: str) -> None:
    dst, src = _array([1, 2, 3], dtype), _array([4, 5, 6], dtype)
    gpu_kernels.combine("max", dst, src)
    out = _array([0, 0, 0], dtype)
    gpu_kernels.reduce_into("sum", out, dst, src)
    assert [launch[0] for launch in fake_cupy] == [
        f"collectives_combine_max_{dtype}",
        f"collectives_reduce_into_sum_{dtype}",
    ]
    assert dst.host.astype(np.float64).tolist() == [4, 5, 6]
    assert out.host.astype(np.float64).tolist() == [8, 10, 12]
    assert src.host.astype(np.float64).tolist() == [4, 5, 6]


def test_the_grid_covers_the_16_byte_packs_up_to_a_full_device(fake_cupy: list[Any]) -> None:
    gpu_kernels.combine("sum", _array(np.ones(1000), "float32"), _array(np.ones(1000), "float32"))
    gpu_kernels.combine("sum", _array(np.ones(10**6), "int8"), _array(np.ones(10**6), "int8"))
    (_, grid, block, _), (_, big_grid, _, _) = fake_cupy
    assert block == (256,)
    assert grid == (1,)  # 250 packs of 4 float32
    assert big_grid == (16,)  # 2 SMs x 8 blocks, grid-stride beyond


def test_avg_combines_with_sum(fake_cupy: list[Any]) -> None:
    dst = _array([1, 2], "float16")
    gpu_kernels.combine(OPS["avg"], dst, _array([3, 4], "float16"))
    assert fake_cupy[0][0] == "collectives_combine_sum_float16"


def test_bfloat16_in_uint16_arrays(fake_cupy: list[Any]) -> None:
    dst = FakeArray(np.array([1.5, -2, 3], dtype=ml_dtypes.bfloat16).view(np.uint16))
    src = FakeArray(np.array([0.5, 8, np.nan], dtype=ml_dtypes.bfloat16).view(np.uint16))
    gpu_kernels.combine("sum", dst, src, dtype="bfloat16")
    assert fake_cupy[0][0] == "collectives_combine_sum_bfloat16"
    np.testing.assert_array_equal(dst.host.view(ml_dtypes.bfloat16).astype(np.float32), [2, 6, np.nan])
    gpu_kernels.divide(dst, 4, dtype="bfloat16")
    np.testing.assert_array_equal(dst.host.view(ml_dtypes.bfloat16).astype(np.float32), [0.5, 1.5, np.nan])


@pytest.mark.parametrize("count", [1, 2, 7, 8, 9, 15, 16, 17, 30])
def test_reduce_many_folds_any_number_of_sources(fake_cupy: list[Any], count: int) -> None:
    sources = [_array([i + 1, 2 * i, -i], "int32") for i in range(count)]
    dst = _array([0, 0, 0], "int32")
    gpu_kernels.reduce_many("sum", dst, sources)
    expected = np.sum([s.host for s in sources], axis=0)
    np.testing.assert_array_equal(dst.host, expected)
    passes = 1 + max(0, -(-(count - gpu_kernels.MAX_INPUTS) // (gpu_kernels.MAX_INPUTS - 1)))
    assert len(fake_cupy) == passes
    for _, _, _, args in fake_cupy:
        assert len(args) == 1 + gpu_kernels.MAX_INPUTS + 2


def test_reduce_many_reads_dst_before_writing_it(fake_cupy: list[Any]) -> None:
    sources = [_array(np.full(4, i + 1), "float32") for i in range(12)]
    dst = sources[10]  # read in the second pass if the order were kept
    gpu_kernels.reduce_many("sum", dst, sources)
    np.testing.assert_array_equal(dst.host, np.full(4, sum(range(1, 13))))


def test_divide_rounds_the_divisor_as_numpy(fake_cupy: list[Any]) -> None:
    for dtype, divisor, expected in [
        ("float32", 257, 257),
        ("bfloat16", 257, 256),
        ("float16", 100_000, np.inf),
    ]:
        gpu_kernels.divide(_array([1], dtype), divisor)
        assert float(fake_cupy[-1][3][1]) == expected
    with pytest.raises(TypeError):
        gpu_kernels.divide(_array([1], "float32"), 2.5)  # type: ignore[arg-type]


def test_empty_buffers_launch_nothing(fake_cupy: list[Any]) -> None:
    empty = _array([], "float32")
    gpu_kernels.combine("sum", empty, empty)
    gpu_kernels.reduce_into("sum", empty, empty, empty)
    gpu_kernels.reduce_many("sum", empty, [empty, empty])
    gpu_kernels.divide(empty, 3)
    assert fake_cupy == []


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda a, b: gpu_kernels.combine("sum", a, b.host), InvalidBufferError, "must be a cupy.ndarray"),
        (lambda a, b: gpu_kernels.combine("sum", a, b[:2]), InvalidBufferError, "has 2 elements"),
        (lambda a, b: gpu_kernels.combine("sum", a[::2], b[::2]), InvalidBufferError, "1-D and contiguous"),
        (lambda a, b: gpu_kernels.combine("mean", a, b), UnsupportedOpError, "unknown op 'mean'"),
        (lambda a, b: gpu_kernels.combine("bxor", a, b), UnsupportedOpError, "does not apply to float32"),
        (
            lambda a, b: gpu_kernels.combine("sum", a, b, dtype="complex64"),
            UnsupportedDtypeError,
            "complex64",
        ),
        (lambda a, b: gpu_kernels.combine("sum", a, b, dtype="float16"), InvalidBufferError, "as float16"),
        (
            lambda a, b: gpu_kernels.combine("sum", a, FakeArray(b.host.astype(np.int32))),
            InvalidBufferError,
            "src has dtype int32, dst has float32",
        ),
        (lambda a, b: gpu_kernels.reduce_many("sum", a, []), InvalidBufferError, "at least one source"),
        (lambda a, b: gpu_kernels.reduce_many("sum", a[1:5], [a[0:4]]), InvalidBufferError, "overlaps"),
        (
            lambda a, b: gpu_kernels.divide(FakeArray(np.zeros(3, np.int32)), 2),
            UnsupportedDtypeError,
            "int32",
        ),
    ],
)
def test_bad_buffers_and_ops_are_refused(
    fake_cupy: list[Any], call: Callable[[FakeArray, FakeArray], None], error: type[Exception], message: str
) -> None:
    a, b = _array(np.arange(8), "float32"), _array(np.arange(8), "float32")
    with pytest.raises(error, match=re.escape(message)):
        call(a, b)
    assert fake_cupy == []


def test_arrays_on_another_device_are_refused(fake_cupy: list[Any]) -> None:
    with pytest.raises(InvalidBufferError, match="on device 1, the current device is 0"):
        gpu_kernels.combine("sum", _array([1], "int8"), FakeArray(np.ones(1, np.int8), device=1))


def test_integer_dtypes_have_bitwise_kernels() -> None:
    names = set(gpu_kernels.kernel_names())
    for dtype in INTEGER_DTYPES:
        for op in ("band", "bor", "bxor"):
            assert gpu_kernels.kernel_name("reduce_many", op, dtype) in names
