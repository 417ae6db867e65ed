"""``python -m bench simulate``: sizes, presets, the rows and their envelopes, the table, the plot; no MPI."""

import subprocess
import sys
from pathlib import Path

import pytest

from collectives.algorithms import ALGORITHMS, build_schedule
from collectives.bench.simulate import format_table, main, parse_bytes, parse_topology, rows
from collectives.topology import dgx1, multi_node, pcie_switch, predict
from collectives.topology.strategies import split_star

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("text", "expected"),
    [("160MB", 160 * 10**6), ("1GB", 10**9), ("3kB", 3000), ("64MiB", 64 * 2**20), ("64M", 64 * 2**20),
     ("2KiB", 2048), ("8", 8), (" 5 B ", 5)],
)  # fmt: skip
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "MB", "1.5MB", "-1", "12XB", "1TB"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_bytes(text)


@pytest.mark.parametrize(
    ("text", "name"),
    [("dgx1", "dgx1"), ("pcie_switch:4", "pcie_switch(4)"), ("multi_node(4,8,100)", "multi_node(4,8,100)"),
     ("multi_node:2,4,12.5", "multi_node(2,4,12.5)"), ("ring:3", "ring(3)")],
)  # fmt: skip
def test_parse_topology(text: str, name: str) -> None:
    assert parse_topology(text).name == name


@pytest.mark.parametrize(
    ("text", "message"),
    [("nope", "unknown topology"), ("ring:0", "at least 1"), ("dgx1:3", "topology 'dgx1:3'")],
)
def test_parse_topology_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_topology(text)


def test_the_pcie_rows_put_the_seeds_figures_beside_the_predictions() -> None:
    found = {row.label: row for row in rows(pcie_switch(4), "allreduce", 160 * 10**6, 4)}
    registered = [name for name, module in ALGORITHMS.items() if hasattr(module, "allreduce")]
    assert list(found) == [
        *registered, "aggregate on gpu0", "aggregate on cpu", "split aggregation over the GPUs",
    ]  # fmt: skip
    for label, seconds in [
        ("aggregate on gpu0", 0.060),
        ("aggregate on cpu", 0.080),
        ("split aggregation over the GPUs", 0.015),
    ]:
        row = found[label]
        assert row.prediction is not None
        assert row.envelope_s == pytest.approx(seconds)
        assert row.prediction.bandwidth_s == pytest.approx(seconds)
    assert found["ring"].envelope_s is None


def test_the_dgx1_rows_time_the_packed_rings_against_the_seeds_6_ms() -> None:
    found = {row.label: row for row in rows(dgx1(), "allreduce", 160 * 10**6, 4)}
    packed = found["multi_ring on packed rings"]
    assert packed.envelope_s == pytest.approx(2 * 160e6 / 54e9)
    times = [found[label].prediction for label in ("multi_ring on packed rings, both ways", "ring")]
    assert packed.prediction is not None and times[0] is not None and times[1] is not None
    assert times[0].time_s < packed.prediction.time_s < times[1].time_s
    assert found["aggregate on gpu0"].envelope_s is None  # GPU 0 has seven links: no one-link reckoning


def test_rows_the_topology_cannot_carry_say_why() -> None:
    found = {row.label: row for row in rows(parse_topology("ring:6"), "allreduce", 6000, 4)}
    assert found["hierarchical"].prediction is None
    assert "no route from gpu0 to gpu2" in found["hierarchical"].problem
    text = format_table(parse_topology("ring:6"), "allreduce", 6000, "float32", list(found.values()))
    assert "no route from gpu0 to gpu2" in text
    assert "# fastest: multi_ring" in text


def test_the_shared_collectives_have_the_algorithms_and_packed_rings_only() -> None:
    labels = [row.label for row in rows(dgx1(), "reduce_scatter", 2**20, 4)]
    registered = [name for name, module in ALGORITHMS.items() if hasattr(module, "reduce_scatter")]
    assert labels == [*registered, "multi_ring on packed rings", "multi_ring on packed rings, both ways"]


def test_the_table_names_the_run_the_rings_and_the_fastest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--topology", "dgx1", "--size", "160MB"]) == 0
    out = capsys.readouterr().out
    assert "# collectives simulate: allreduce of 160 MB (40000000 x float32) on dgx1" in out
    assert "rings found: 0-3-2-1-5-6-7-4 at 36 GB/s; 0-1-3-7-5-4-6-2 at 18 GB/s: 54 of at most 54 GB/s" in out
    assert "# fastest: multi_ring on packed rings, both ways (2.607 ms)" in out
    packed = next(line for line in out.splitlines() if line.startswith("  multi_ring on packed rings "))
    assert packed.split()[-1] == "5.926" and "5.199" in packed


def test_bad_arguments_exit_with_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["-t", "nope"], ["-s", "1.5MB"], ["-s", "2", "-d", "float64"]):
        with pytest.raises(SystemExit) as caught:
            main(argv)
        assert caught.value.code == 2
    assert "less than one float64" in capsys.readouterr().err


def test_python_m_bench_simulate_runs_without_mpiexec_or_mpi4py() -> None:
    code = (
        "import runpy, sys\n"
        "sys.argv = ['bench', 'simulate', '-t', 'multi_node:4,8,100']\n"
        "try:\n"
        "    runpy.run_module('bench', run_name='__main__')\n"
        "except SystemExit as done:\n"
        "    print('exit', done.code)\n"
        "print('mpi4py' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "# fastest: hierarchical, nodes of 8" in result.stdout
    assert result.stdout.splitlines()[-2:] == ["exit 0", "False"]


def test_plot_draws_the_topology_and_its_rings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    picture = tmp_path / "dgx1.png"
    assert main(["--plot", str(picture)]) == 0
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"drew dgx1 and its rings in {picture}" in capsys.readouterr().out


def test_past_the_checked_ranks_the_rows_come_from_programs_and_say_so() -> None:
    machines = multi_node(9, 8, 100)  # 72 ranks: past CHECK_RANKS, nothing is simulated
    count = 2**24
    found = {row.label: row for row in rows(machines, "allreduce", 4 * count, 4)}
    ring = build_schedule("allreduce", "ring", 72, count)
    prediction = found["ring"].prediction
    assert prediction is not None and prediction.sampled_nodes is None
    assert prediction.time_s == pytest.approx(predict(ring, machines, 4).time_s, rel=1e-9)
    assert found["ring"].steps == len(ring.steps) and found["ring"].schedule == ring.name
    split = found["split aggregation over the GPUs"].prediction
    assert split is not None
    assert split.time_s == pytest.approx(predict(split_star(72, count), machines, 4).time_s, rel=1e-9)
    sampled = rows(machines, "allreduce", 4 * count, 4, budget=0)
    ring_sampled = next(row for row in sampled if row.label == "ring").prediction
    assert ring_sampled is not None and ring_sampled.sampled_nodes == (0, 4, 8)
    assert ring_sampled.time_s == pytest.approx(prediction.time_s, rel=0.01)
    table = format_table(machines, "allreduce", 4 * count, "float32", sampled)
    assert "# from machines 0, 4, 8's ranks' programs, standing for all (alike machines): ring," in table
