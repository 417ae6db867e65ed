#!/usr/bin/env bash
# Every check that needs a GPU, in one command on a GPU machine; logs and results go to OUT.
#
#   bash bench/gpu_check.sh OUT [STEP...]      STEP: env kernels bench staging ipc (default: all)
#
#   env      what the machine has: GPU, Python packages, the MPI library
#   kernels  the single-process GPU tests: every kernel against numpy, the CuPy backend and
#            device, torch CUDA tensors
#   bench    python -m bench kernels, 1 MiB to 1 GiB of float32 (OUT/kernels.json)
#   staging  tests/mpi/test_gpu.py under mpiexec, 1 to 4 ranks sharing the GPU, host staging
#   ipc      the same over CUDA IPC
#
# Where the machine has no MPI library, put wheels for its Python in .whl/ first (mpich, mpi4py,
# pytest-mpi; bench/README.md says how): they are installed under /tmp/collectives-gpu and used.
# Each step is bounded by STEP_TIMEOUT seconds (default 540); OUT/<step>.log is its output and
# OUT/summary.txt has a line per step. The exit status is the number of steps that failed.
set -uo pipefail
cd "$(dirname "$0")/.."

out=${1:?usage: bash bench/gpu_check.sh OUT [env|kernels|bench|staging|ipc ...]}
shift
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(env kernels bench staging ipc)
for step in "${steps[@]}"; do
  case $step in
    env | kernels | bench | staging | ipc) ;;
    *) echo "unknown step '$step'; the steps are env, kernels, bench, staging, ipc" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if compgen -G ".whl/*.whl" >/dev/null; then
  prefix=/tmp/collectives-gpu
  # installed once, so that several runs of this script can share the machine at the same time
  if [ ! -e "$prefix/.installed" ]; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --ignore-installed --prefix "$prefix" \
      .whl/*.whl >"$out/wheels.log" 2>&1 || { echo "installing .whl/ failed: see $out/wheels.log" >&2; exit 2; }
    rm -f "$out/wheels.log"
    touch "$prefix/.installed"
  fi
  # where pip put them depends on the Python's install scheme
  site=$(dirname "$(find "$prefix" -name '*.dist-info' -print -quit)")
  libmpi=$(find "$prefix" -name 'libmpi.so.12' -print -quit)
  export PYTHONPATH="$site:$PYTHONPATH" PATH="$prefix/bin:$PATH"
  if [ -n "$libmpi" ]; then
    export LD_LIBRARY_PATH="$(dirname "$libmpi")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" MPI4PY_LIBMPI="$libmpi"
  fi
  [ -x "$prefix/bin/mpiexec" ] && export COLLECTIVES_MPIEXEC="$prefix/bin/mpiexec"
fi

pytest=("$python" -m pytest -q -rs -p no:cacheprovider --timeout=300)
failed=0
run_step() {
  local step=$1
  shift
  local started=$SECONDS
  timeout -k 10 "${STEP_TIMEOUT:-540}" "$@" >"$out/$step.log" 2>&1
  local status=$?
  local result
  result=$(grep -E '(passed|failed|skipped|error|GPU)' "$out/$step.log" | tail -n 1)
  [ $status -eq 124 ] && result="timed out after ${STEP_TIMEOUT:-540} s; $result"
  printf '%-8s exit %3d  %4d s  %s\n' "$step" "$status" $((SECONDS - started)) "$result" | tee -a "$out/summary.txt"
  [ $status -eq 0 ] || failed=$((failed + 1))
}

for step in "${steps[@]}"; do
  case $step in
    env)
      # fails where CuPy sees no GPU or mpi4py finds no MPI library
      run_step env bash -c "
        nvidia-smi -L
        '$python' -c 'import sys; print(sys.version)'
        '$python' -m pip list 2>/dev/null | grep -i -E '^(numpy|cupy|torch|mpi4py|mpich|ml.dtypes|pytest|cuda)'
        \${COLLECTIVES_MPIEXEC:-mpiexec} --version | head -n 2
        '$python' -c 'from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])' &&
        '$python' -c 'import cupy; print(cupy.cuda.runtime.getDeviceCount(), \"GPU(s) for CuPy\", cupy.__version__)'"
      ;;
    kernels)
      run_step kernels "${pytest[@]}" -m gpu tests/test_gpu_kernels_device.py tests/test_cupy_backend.py \
        tests/test_torch_integration.py tests/test_torch_functional.py
      ;;
    bench)
      run_step bench "$python" -m bench kernels -b 1M -e 1G -f 4 -d float32 -o sum -n 20 -w 5 \
        --json "$out/kernels.json"
      ;;
    staging)
      run_step staging "${pytest[@]}" -m gpu tests/test_gpu_launch.py -k staging
      ;;
    ipc)
      run_step ipc "${pytest[@]}" -m gpu tests/test_gpu_launch.py -k ipc
      ;;
  esac
done
exit $failed
