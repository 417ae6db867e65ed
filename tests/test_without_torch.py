"""Where torch is absent, the suite's summary says how many torch tests did not run."""

import subprocess
import sys

from tests.mpirun import ROOT

# pytest in a process where importing torch fails, as where it is not installed
_WITHOUT_TORCH = "import sys; sys.modules['torch'] = None; import pytest; sys.exit(pytest.main(sys.argv[1:]))"


def test_the_summary_counts_the_torch_tests_that_did_not_run() -> None:
    args = ["tests/test_torch_launch.py", "tests/test_checkpoint.py::test_training_state_round_trips_model_"
            "optimizer_and_step", "-q", "-p", "no:cacheprovider"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # the launch file's three tests, skipped as one module, and the checkpoint test
    assert "torch is not installed: 4 torch tests did not run;" in done.stdout, done.stdout
