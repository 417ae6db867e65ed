"""The host build that runs the CUDA kernels on the CPU catches what a GPU would: tests of the checker.

tests/test_gpu_kernels_device.py runs the real kernels through it; here, small kernels with
known faults show that each of its checks fires.
"""

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from collectives.backends import gpu_kernels
from tests import host_cuda

NAME = "collectives_combine_sum_float32"

# a kernel of the real one's name and parameters, whose body each test writes
TEMPLATE = """
extern "C" __global__ void collectives_combine_sum_float32(float* dst, const float* src,
                                                           unsigned long long n) {
  const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  BODY
}
"""


@pytest.fixture(autouse=True)
def host_cupy() -> Iterator[None]:
    if host_cuda.compiler() is None:
        pytest.skip("the host build of the kernels needs a C++ compiler (g++ or clang++)")
    with host_cuda.installed():
        yield


def launch(body: str, dst: Any, src: Any, blocks: int = 1) -> None:
    module = host_cuda.RawModule(TEMPLATE.replace("BODY", body))
    module.get_function(NAME)((blocks,), (256,), (dst, src, np.uint64(dst.size)))


def arrays(count: int) -> tuple[Any, Any]:
    dst, src = host_cuda.empty(count, np.float32), host_cuda.empty(count, np.float32)
    dst.set(np.zeros(count, np.float32))
    src.set(np.arange(count, dtype=np.float32))
    return dst, src


def test_every_thread_of_the_grid_runs_once() -> None:
    dst, src = arrays(3 * 256)
    launch("dst[i] += src[i] + 1;", dst, src, blocks=3)
    np.testing.assert_array_equal(dst.get(), np.arange(3 * 256) + 1)


def test_a_misaligned_128_bit_access_is_caught() -> None:
    dst, src = arrays(64)
    aligned = "if (i == 0) { *reinterpret_cast<uint4*>(dst + 4) = *reinterpret_cast<const uint4*>(src + 8); }"
    launch(aligned, dst, src)
    np.testing.assert_array_equal(dst.get()[4:8], [8, 9, 10, 11])
    misaligned = "if (i == 0) { *reinterpret_cast<uint4*>(dst + 1) = *reinterpret_cast<const uint4*>(src); }"
    with pytest.raises(AssertionError, match="1 128-bit accesses off a 16-byte boundary"):
        launch(misaligned, dst, src)


def test_a_write_past_the_end_is_caught() -> None:
    dst, src = arrays(10)
    with pytest.raises(AssertionError, match="wrote 4 bytes outside an allocation"):
        launch("if (i <= n) dst[i] = 1.0f;", dst, src)


def test_a_write_before_the_start_is_caught() -> None:
    dst, src = arrays(10)
    with pytest.raises(AssertionError, match="wrote 4 bytes outside an allocation"):
        launch("if (i == 0) dst[-1] = 1.0f;", dst, src)


def test_an_element_never_written_keeps_garbage() -> None:
    dst = host_cuda.empty(8, np.uint8)
    assert dst.get().tolist() == [host_cuda.GARBAGE] * 8
    assert dst.data.ptr % host_cuda.ALIGNMENT == 0


def test_the_loader_runs_on_the_host_build() -> None:
    dst, src = arrays(5000)
    gpu_kernels.combine("sum", dst, src)
    np.testing.assert_array_equal(dst.get(), np.arange(5000, dtype=np.float32))
    with pytest.raises(AssertionError, match=r"n must be a numpy\.uint64"):
        host_cuda.RawModule(gpu_kernels.module_source()).get_function(NAME)((1,), (256,), (dst, src, 5000))
