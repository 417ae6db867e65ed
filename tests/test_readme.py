"""The README's quickstart is the example file, and it prints what the README says."""

import re
import subprocess

import pytest

from .mpirun import ROOT, mpiexec, run_mpi

README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def test_quickstart_in_the_readme_is_the_example_file() -> None:
    assert (ROOT / "examples" / "quickstart.py").read_text() in _blocks("python")


def test_the_readme_commands_set_up_and_run_the_bench_and_the_tests() -> None:
    bench, tests = _blocks("bash")[:2]
    assert "mpiexec -n 4" in bench and "-m bench allreduce" in bench
    assert tests.strip().endswith("-m pytest")
    assert all('pip install -e ".[mpich,test]"' in command for command in (bench, tests))


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
def test_quickstart_prints_what_the_readme_shows() -> None:
    try:
        result = run_mpi(4, ["examples/quickstart.py"], timeout=120)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the quickstart hung:\n{expired.output}")
    assert result.returncode == 0, result.stdout
    shown = _blocks("text")[0]
    assert result.stdout.strip() == shown.strip()


def test_the_key_value_store_example_in_the_readme_is_the_example_file() -> None:
    assert (ROOT / "examples" / "kvstore.py").read_text() in _blocks("python")


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
def test_the_key_value_store_example_prints_what_the_readme_shows() -> None:
    try:
        result = run_mpi(2, ["examples/kvstore.py"], timeout=120)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the key-value store example hung:\n{expired.output}")
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip() == _blocks("text")[1].strip()
