"""The README: its commands, its quickstart (the example, printing what it says), its table (a bench file)."""

import json
import re
import subprocess

import pytest

from collectives.bench.algorithms import generated_part
from collectives.bench.standing import BEGIN, render

from .mpirun import ROOT, mpiexec, run_mpi

README = (ROOT / "README.md").read_text()
KVSTORE_PAGE = (ROOT / "docs" / "kvstore.md").read_text()


def _blocks(language: str, text: str = README) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def test_quickstart_in_the_readme_is_the_example_file() -> None:
    assert (ROOT / "examples" / "quickstart.py").read_text() in _blocks("python")


def test_the_readme_commands_set_up_and_run_the_bench_and_the_tests() -> None:
    bench, tests = _blocks("bash")[:2]
    assert "mpiexec -n 4" in bench and "-m collectives bench allreduce" in bench
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


def test_the_key_value_store_example_on_its_page_is_the_example_file() -> None:
    assert (ROOT / "examples" / "kvstore.py").read_text() in _blocks("python", KVSTORE_PAGE)


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
def test_the_key_value_store_example_prints_what_its_page_shows() -> None:
    try:
        result = run_mpi(2, ["examples/kvstore.py"], timeout=120)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the key-value store example hung:\n{expired.output}")
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip() == _blocks("text", KVSTORE_PAGE)[0].strip()


def test_the_readme_table_against_mpi_is_the_bench_file() -> None:
    # one source: the table is `bench standing` of the file `bench compare --json` wrote
    source = "bench/compare-2ranks.json"
    expected = render(json.loads((ROOT / source).read_text()), source)
    assert generated_part(README, BEGIN) == expected
    record = json.loads((ROOT / source).read_text())
    assert record["date"] in README and record["machine"] in README  # when and where it was measured


def test_the_readme_is_short_and_links_into_the_docs() -> None:
    assert len(README.splitlines()) <= 200
    pages = set(re.findall(r"\]\((docs/[\w/]+\.md)\)", README))
    topics = ("usage", "torch", "kvstore", "fault_tolerance", "determinism", "performance", "architecture")
    assert {f"docs/{name}.md" for name in topics} <= pages
    assert all((ROOT / page).is_file() for page in pages), pages
    assert "-->" not in README.replace(BEGIN, "").replace("<!-- end generated -->", "")


def test_the_pages_a_user_reads_speak_of_the_project_alone() -> None:
    # the README, every docs page, the benchmarks page and the examples: facts, not the history of the work
    pages = [ROOT / "README.md", ROOT / "bench" / "README.md"]
    pages += sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "examples").glob("*.py"))
    assert len(pages) > 10
    for page in pages:
        found = re.search(r"\b(issues? \d+|session)\b", page.read_text(), flags=re.IGNORECASE)
        assert found is None, f"{page.relative_to(ROOT)}: {found and found.group()}"


def test_the_readme_says_calibrate_changes_auto_for_later_runs() -> None:
    assert "bench calibrate" in README and "changes `auto`'s choices for later runs" in README
