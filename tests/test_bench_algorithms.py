"""``python -m bench algorithms`` and docs/algorithms.md: the page's tables are the command's output."""

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from collectives.algorithms import ALGORITHMS
from collectives.bench.algorithms import (
    BEGIN,
    DEFAULT_COUNT,
    DEFAULT_WORLD_SIZES,
    END,
    auto_choices,
    auto_section,
    generated_part,
    main,
    render,
    simulated,
    splice,
    support_section,
)
from collectives.calibration import CALIBRATION_ENV, load_model
from collectives.selector import Selector, default_selector
from collectives.specs import COLLECTIVES
from collectives.topology.cost_model import DEFAULT_MODEL

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "algorithms.md"
REFRESH = "python -m bench algorithms --update docs/algorithms.md"


@pytest.fixture(scope="module")
def rendered() -> str:
    return render()


def _table(lines: list[str], heading: str) -> list[list[str]]:
    """The cells of the first Markdown table after ``heading``, header row first, separator dropped."""
    start = lines.index(heading)
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            break
    return rows


def test_the_page_shows_what_the_command_prints(rendered: str) -> None:
    assert generated_part(PAGE.read_text()) == rendered, f"docs/algorithms.md is out of date: run {REFRESH}"


def test_the_pages_example_prints_what_the_page_shows() -> None:
    page = PAGE.read_text()
    code = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)[0]
    shown = re.findall(r"```text\n(.*?)```", page, flags=re.DOTALL)[0]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, {})
    assert printed.getvalue() == shown


def test_the_matrix_says_yes_where_a_module_has_the_collective_and_a_dash_where_not() -> None:
    rows = _table(support_section(), "## Which algorithm implements which collective")
    header, body = rows[0], {row[0]: dict(zip(rows[0], row, strict=True)) for row in rows[1:]}
    assert header == ["algorithm", *COLLECTIVES, "requires"]
    assert list(body) == [f"`{name}`" for name in ALGORITHMS]
    assert body["`tree`"]["allreduce"] == "yes" and body["`tree`"]["reduce_scatter"] == "—"
    assert body["`dissemination`"]["allreduce"] == "—" and body["`dissemination`"]["barrier"] == "yes"
    assert all(body["`direct`"][c] == "yes" for c in COLLECTIVES)
    assert body["`ring`"]["requires"] == "—"
    assert body["`shared_memory`"]["requires"] == "`shared_memory`: ranks on one node"
    assert body["`hierarchical_shared_memory`"]["requires"].startswith("`shared_memory_nodes`: ")


@pytest.mark.parametrize("world_size", [2, 3, 4, 5, 7, 8, 9, 16])
def test_the_simulated_ring_allreduce_takes_2_p_minus_1_steps(world_size: int) -> None:
    steps, sent = simulated("allreduce", "ring", world_size, DEFAULT_COUNT)
    assert steps == 2 * (world_size - 1)
    assert sent * world_size == 2 * (world_size - 1) * DEFAULT_COUNT  # the count divides evenly


def test_the_cost_tables_give_steps_and_elements_sent_as_fractions_of_s(rendered: str) -> None:
    lines = rendered.splitlines()
    allreduce = {row[0]: row[1:] for row in _table(lines, "### allreduce")}
    assert allreduce["algorithm"] == [f"P = {p}" for p in DEFAULT_WORLD_SIZES]
    eight = DEFAULT_WORLD_SIZES.index(8)
    assert allreduce["`ring`"][eight] == "14 · 7/4"
    assert allreduce["`butterfly`"][eight] == "3 · 3"  # log2 8 steps of the whole buffer
    assert allreduce["`direct`"][eight] == "2 · 7"  # the hub sends the sum to 7 others
    barrier = {row[0]: row[1:] for row in _table(lines, "### barrier")}
    assert barrier["`dissemination`"][DEFAULT_WORLD_SIZES.index(7)] == "3 · 3"  # tokens, ceil(log2 7)
    # only the algorithms that implement a collective get a row
    assert [row[0] for row in _table(lines, "### gather")] == ["algorithm", "`direct`"]


def test_a_count_that_does_not_fit_is_a_cell_with_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--world-sizes", "2,3", "--count", "10"]) == 0
    lines = capsys.readouterr().out.splitlines()
    alltoall = _table(lines, "### alltoall")
    assert alltoall == [["algorithm", "P = 2", "P = 3"], ["`direct`", "1 · 1/2", "n/a"]]
    assert "n/a: alltoall needs a count divisible by the world size 3, got 10." in lines
    ring = {row[0]: row[1:] for row in _table(lines, "### allreduce")}["`ring`"]
    assert ring == ["2 · 1", "4 · 7/5"]  # shares of 4, 3, 3: rank 2 sends 20 - 3 - 3 = 14


def test_autos_rows_join_the_sizes_with_the_same_choices_and_cover_them_all() -> None:
    lines = auto_section(DEFAULT_WORLD_SIZES)
    sizes = [2**e for e in range(3, 29)]
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20}
    covered: list[int] = []
    for row in _table(lines, "### Messages only")[1:]:
        bounds = [int(n) * units[u] for n, u in re.findall(r"(\d+) (B|KiB|MiB)", row[0])]
        span = [s for s in sizes if bounds[0] <= s <= bounds[-1]]
        expected = {tuple(f"`{c}`" for c in choice) for choice in auto_choices(DEFAULT_WORLD_SIZES, span)}
        assert expected == {tuple(row[1:])}, row[0]
        covered += span
    assert covered == sizes


def test_the_choices_are_the_default_models_whatever_the_calibration(
    rendered: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"alpha": 1e-3, "beta": 1e-9, "gamma": 1e-9}))
    monkeypatch.setenv(CALIBRATION_ENV, str(calibration))
    # the process's selector would read the file afresh, and the next test's would not see it
    default_selector.cache_clear()
    request.addfinalizer(default_selector.cache_clear)
    # the file is read and would change the choice, so an output that used it would differ
    calibrated = Selector(load_model(world_size=8))
    assert calibrated.model != DEFAULT_MODEL
    case = ("allreduce", 8, 2**16, 4)  # 256 KiB over 8 ranks: the ring by default, fewer steps at 1 ms each
    assert calibrated.choose(*case) != Selector(DEFAULT_MODEL).choose(*case)
    assert render() == rendered


def test_splice_replaces_the_generated_part_only() -> None:
    page = f"# title\n\nprose\n\n{BEGIN}\nold\ntables\n{END}\n\nmore prose\n"
    spliced = splice(page, "new\n")
    assert spliced == f"# title\n\nprose\n\n{BEGIN}\nnew\n{END}\n\nmore prose\n"
    assert generated_part(spliced) == "new\n"
    assert splice(spliced, "new\n") == spliced


@pytest.mark.parametrize(
    "page", ["no markers\n", f"{END}\n{BEGIN}\n", f"{BEGIN}\n{BEGIN}\n{END}\n", f"{BEGIN}\nno end\n"]
)
def test_a_page_without_one_pair_of_markers_is_refused(page: str) -> None:
    with pytest.raises(ValueError, match="expected one"):
        generated_part(page)


def test_update_rewrites_a_page_and_refuses_one_without_markers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"intro\n{BEGIN}\n{END}\n")
    assert main(["-p", "2", "-c", "4", "--update", str(page)]) == 0
    assert generated_part(page.read_text()) == render((2,), 4)
    assert page.read_text().startswith(f"intro\n{BEGIN}\n## Which algorithm")
    page.write_text("no markers\n")
    with pytest.raises(SystemExit):
        main(["-p", "2", "-c", "4", "--update", str(page)])
    assert "cannot update" in capsys.readouterr().err
    assert page.read_text() == "no markers\n"


@pytest.mark.parametrize("argv", [["-p", "0"], ["-p", "2,x"], ["-c", "-1"], ["-c", "many"]])
def test_bad_options_are_parser_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    assert "error:" in capsys.readouterr().err


def test_the_sub_command_runs_without_mpi() -> None:
    code = (
        "import sys\n"
        "from collectives.bench.__main__ import main\n"
        "assert main(['algorithms', '-p', '2', '-c', '8']) == 0\n"
        "print(sorted(m for m in ('mpi4py', 'cupy', 'torch') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, timeout=60
    )
    assert "| `ring` | 2 · 1 |" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "[]"
