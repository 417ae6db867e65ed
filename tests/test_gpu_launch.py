"""Runs tests/mpi/test_gpu.py under mpiexec, 1 to 4 ranks sharing the GPU, over host staging and CUDA IPC."""

import os
import re
import subprocess

import pytest

from tests.mpirun import mpiexec, run_mpi

# the whole run at one rank count and path; shorter where a device lease is short
TIMEOUT_S = int(os.environ.get("COLLECTIVES_GPU_SUITE_TIMEOUT", "540"))
TEST_TIMEOUT_S = min(300, TIMEOUT_S - 10)

PATHS = {
    # no CUDA IPC, no CUDA-aware MPI: every device message goes through pinned host buffers
    "host staging": {"COLLECTIVES_CUDA_IPC": "0", "COLLECTIVES_CUDA_AWARE": "0"},
    "cuda ipc": {"COLLECTIVES_CUDA_IPC": "1"},
}


def _gpu_here() -> str | None:
    """Why the GPU suite cannot run here, or None."""
    try:
        import cupy
    except Exception:
        return "CuPy is not installed; the GPU tests run on a GPU host"
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return "no CUDA device here"
    except Exception as error:
        return f"no CUDA device here ({error})"
    if mpiexec() is None:
        return "no mpiexec (install the mpich extra)"
    return None


@pytest.mark.gpu
@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_gpu_suite(ranks: int, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    reason = _gpu_here()
    if reason is not None:
        pytest.skip(reason)
    for name, value in PATHS[path].items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("COLLECTIVES_EXPECT_DEVICE_PATH", path)
    if ranks > (os.cpu_count() or 1):
        monkeypatch.setenv("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    args = [
        "-m", "pytest", "tests/mpi/test_gpu.py", "--with-mpi", "-q", "-p", "no:cacheprovider", "-x",
        f"--timeout={TEST_TIMEOUT_S}", "--timeout-method=thread",
    ]  # fmt: skip
    try:
        finished = run_mpi(ranks, args, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the GPU suite hung at {ranks} ranks over {path}; output so far:\n{expired.output}")
    output = finished.stdout
    assert finished.returncode == 0, f"the GPU suite failed at {ranks} ranks over {path}:\n{output}"
    passed = [int(n) for n in re.findall(r"(\d+) passed", output)]
    assert passed and min(passed) > 0, f"the GPU suite ran no tests at {ranks} ranks:\n{output}"
