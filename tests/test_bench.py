"""The benchmark: its pure parts without MPI, then whole runs under mpiexec."""

import itertools
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from collectives.algorithms import ALGORITHMS
from collectives.bench.config import (
    Settings,
    default_algorithm,
    element_count,
    parse_size,
    plan_sizes,
    size_sweep,
)
from collectives.bench.patterns import ExactData, count_wrong, numpy_dtype
from collectives.bench.report import (
    Row,
    Timing,
    bandwidths,
    format_footer,
    format_header,
    format_row,
    to_json,
)
from collectives.calibration import load_model, save_model
from collectives.specs import get_spec
from collectives.topology.cost_model import CostModel
from tests.mpirun import BENCH, mpiexec, run_mpi

MiB = 1024**2


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8", 8), ("1K", 1024), ("64M", 64 * MiB), ("2G", 2 * 1024**3), ("3k", 3072), (" 16 ", 16)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "1.5K", "12X", "-1", "1KB", "0x10"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_size_sweep_defaults() -> None:
    sizes = size_sweep(8, 64 * MiB, 2)
    assert sizes[0] == 8
    assert sizes[-1] == 64 * MiB
    assert len(sizes) == 24
    assert all(b == 2 * a for a, b in itertools.pairwise(sizes))


def test_size_sweep_stops_at_maxbytes() -> None:
    assert size_sweep(8, 100, 3) == (8, 24, 72)
    assert size_sweep(5, 5, 2) == (5,)


@pytest.mark.parametrize(("low", "high", "factor"), [(0, 8, 2), (16, 8, 2), (8, 64, 1)])
def test_size_sweep_rejects(low: int, high: int, factor: int) -> None:
    with pytest.raises(ValueError):
        size_sweep(low, high, factor)


def test_element_count_rounds_to_whole_shares() -> None:
    assert element_count("allreduce", 10, 4, 3) == 2
    assert element_count("reduce_scatter", 100, 4, 3) == 24  # 8 elements for each of 3 ranks
    assert element_count("allgather", 7, 1, 4) == 4
    assert element_count("allgather", 8, 4, 4) == 0
    assert element_count("broadcast", 10, 4, 3) == element_count("reduce", 10, 4, 3) == 2
    assert element_count("gather", 100, 4, 3) == element_count("scatter", 100, 4, 3) == 24
    assert element_count("alltoall", 100, 4, 3) == 24  # a share of 8 for each of 3 ranks


def test_plan_sizes_skips_empty_and_repeated_sizes() -> None:
    assert plan_sizes("reduce_scatter", (8, 16, 32), 4, 4) == ((16, 4), (32, 8))
    assert plan_sizes("allreduce", (5, 6, 8), 4, 1) == ((4, 1), (8, 2))
    assert plan_sizes("allgather", (8, 16), 8, 3) == ()
    assert plan_sizes("alltoall", (8, 16, 32), 4, 3) == ((12, 3), (24, 6))
    assert plan_sizes("barrier", (8, 1024), 4, 3) == ((0, 0),)


def test_default_algorithm_is_the_apis() -> None:
    # every collective lets the selector choose unless told otherwise, and the bench times that
    for collective in ("allreduce", "broadcast", "alltoall", "barrier"):
        assert default_algorithm(collective) == "auto"


def test_bandwidths() -> None:
    factor = get_spec("allreduce").busbw_factor(4)
    assert factor == 1.5
    assert bandwidths(2 * 10**9, 2.0, factor) == (1.0, 1.5)
    algbw, busbw = bandwidths(1024, 1e-6, get_spec("allgather").busbw_factor(8))
    assert algbw == pytest.approx(1.024)
    assert busbw == pytest.approx(1.024 * 7 / 8)
    assert bandwidths(8, 0.0, 1.0) == (0.0, 0.0)


def _row(algorithm: str = "ring", wrong: int | None = 0, busbw: float = 1.0) -> Row:
    return Row(
        size=64 * MiB, count=16 * MiB, dtype="float32", op="sum", algorithm=algorithm,
        out_of_place=Timing(83976.8349, 0.799, busbw, wrong),
        in_place=Timing(1234567.0, 0.05, busbw, wrong),
    )  # fmt: skip


def _settings(algorithms: tuple[str, ...] = ("ring",)) -> Settings:
    return Settings("allreduce", (8, 16), "float32", "sum", algorithms, iters=3, warmup=1)


def test_format_row_lines_up_with_the_header() -> None:
    header = format_header(_settings(), 4, "MPICH Version: 5.0.2")
    titles = header[-1]
    row = format_row(_row())
    assert row.split() == [
        "67108864", "16777216", "float32", "sum", "ring",
        "|", "83976.83", "0.80", "1.00", "0", "|", "1234567", "0.05", "1.00", "0",
    ]  # fmt: skip
    assert len(row) == len(titles)
    assert [i for i, c in enumerate(row) if c == "|"] == [i for i, c in enumerate(titles) if c == "|"]
    # right-justified: every value ends where its title does
    for title in ("size", "count", "algorithm", "time(us)", "#wrong"):
        end = titles.index(title) + len(title)
        assert row[end - 1] != " " and row[end] == " "


def test_format_row_unchecked() -> None:
    assert format_row(_row(wrong=None)).split()[9] == "N/A"


def test_a_row_timed_once_fills_its_in_place_half_with_na() -> None:
    barrier = replace(_row(wrong=None), size=0, count=0, in_place=None)
    line = format_row(barrier)
    assert line.split()[-5:] == ["|", "N/A", "N/A", "N/A", "N/A"]
    assert len(line) == len(format_row(_row()))
    assert format_footer([barrier, _row(wrong=2)])[0] == "# Out of bounds values : 4 FAILED"
    assert json.loads(json.dumps(to_json(_settings(), 2, "MPICH", [barrier])))["rows"][0]["in_place"] is None


def test_format_header() -> None:
    lines = format_header(_settings(("ring", "tree")), 4, "MPICH", {"mpi": "no bfloat16"})
    assert lines[0] == "# collectives allreduce benchmark"
    text = "\n".join(lines)
    for part in ("world size  : 4", "float32", "sum", "MPICH", "ring, tree", "mpi: no bfloat16"):
        assert part in text
    assert "root" not in text
    rooted = replace(_settings(), collective="gather", op=None, root=3)
    assert "# root        : 3" in format_header(rooted, 4, "MPICH")
    assert "out-of-place" in lines[-2] and "in-place" in lines[-2]
    assert all(line.startswith("#") for line in lines)


def test_format_footer() -> None:
    assert format_footer([_row(busbw=1.0), _row(busbw=2.0)]) == [
        "# Out of bounds values : 0 OK",
        "# Avg bus bandwidth    : 1.5000",
    ]
    lines = format_footer([_row("ring", wrong=3), _row("mpi", busbw=4.0)])
    assert lines[0] == "# Out of bounds values : 6 FAILED"
    assert lines[1:] == [
        "# Avg bus bandwidth    : 1.0000  (ring)",
        "# Avg bus bandwidth    : 4.0000  (mpi)",
    ]
    assert format_footer([])[-1] == "# Avg bus bandwidth    : 0.0000"


def test_to_json() -> None:
    record = json.loads(json.dumps(to_json(_settings(), 4, "MPICH", [_row()])))
    assert record["world_size"] == 4
    assert record["mpi_library_version"] == "MPICH"
    assert (record["dtype"], record["op"], record["iters"]) == ("float32", "sum", 3)
    assert record["rows"][0]["in_place"]["wrong"] == 0
    assert record["rows"][0]["algorithm"] == "ring"
    assert record["root"] is None
    assert to_json(replace(_settings(), root=1), 4, "MPICH", [])["root"] == 1


def _inputs(data: ExactData, count: int) -> list[np.ndarray]:
    return [data.rank_input(rank, count) for rank in range(data.world_size)]


@pytest.mark.parametrize("dtype", ["int32", "float16", "bfloat16"])
def test_exact_data_allreduce(dtype: str) -> None:
    data = ExactData.of("allreduce", "sum", dtype, 3)
    inputs = _inputs(data, 23)
    assert inputs[1][0] == data.pattern.values[1]
    total = sum(x.astype(np.float64) for x in inputs)
    expected = data.expected(2, 23)
    assert expected.dtype == numpy_dtype(dtype)
    assert np.array_equal(expected.astype(np.float64), total)


def test_exact_data_avg_divides_in_the_dtype() -> None:
    data = ExactData.of("allreduce", "avg", "float16", 3)
    total = sum(x.astype(np.float64) for x in _inputs(data, 10))
    assert np.array_equal(data.expected(0, 10), (total.astype(np.float16) / np.float16(3)))


def test_exact_data_reduce_scatter() -> None:
    data = ExactData.of("reduce_scatter", "max", "int8", 4)
    total = np.maximum.reduce(_inputs(data, 20))
    for rank in range(4):
        assert np.array_equal(data.expected(rank, 20), total[rank * 5 : rank * 5 + 5])


def test_exact_data_allgather_ignores_the_op() -> None:
    data = ExactData.of("allgather", None, "uint16", 3)
    inputs = _inputs(data, 12)
    assert [x.size for x in inputs] == [4, 4, 4]
    assert not np.array_equal(inputs[0], inputs[1])
    assert np.array_equal(data.expected(1, 12), np.concatenate(inputs))


def test_exact_data_of_the_collectives_that_move_data_differs_at_every_element() -> None:
    for collective in ("allgather", "broadcast", "gather", "scatter", "alltoall"):
        data = ExactData.of(collective, "sum", "int8", 5)
        inputs = np.stack([data.rank_input(rank, 505) for rank in range(5)])
        for a, b in itertools.combinations(range(5), 2):
            assert (inputs[a] != inputs[b]).all(), collective
        assert inputs.min() >= 0 and inputs.max() <= 100  # exact in int8 and bfloat16


def test_exact_data_broadcast_and_scatter_come_from_the_root() -> None:
    broadcast = ExactData.of("broadcast", None, "float16", 3, root=2)
    root_input = broadcast.rank_input(2, 12)
    assert all(np.array_equal(broadcast.expected(rank, 12), root_input) for rank in range(3))
    scatter = ExactData.of("scatter", None, "int16", 3, root=1)
    full = scatter.rank_input(1, 12)
    for rank in range(3):
        assert np.array_equal(scatter.expected(rank, 12), full[4 * rank : 4 * rank + 4])


def test_exact_data_reduce_and_gather_only_at_the_root() -> None:
    reduce = ExactData.of("reduce", "max", "int8", 4, root=3)
    total = np.maximum.reduce(_inputs(reduce, 20))
    assert np.array_equal(reduce.expected(3, 20), total)
    assert reduce.expected(0, 20) is None
    gather = ExactData.of("gather", None, "uint8", 3, root=0)
    assert [x.size for x in _inputs(gather, 12)] == [4, 4, 4]
    assert np.array_equal(gather.expected(0, 12), np.concatenate(_inputs(gather, 12)))
    assert gather.expected(1, 12) is None


def test_exact_data_alltoall_takes_this_ranks_share_of_every_input() -> None:
    data = ExactData.of("alltoall", None, "float32", 3)
    inputs = _inputs(data, 9)
    for rank in range(3):
        mine = [x[3 * rank : 3 * rank + 3] for x in inputs]
        assert np.array_equal(data.expected(rank, 9), np.concatenate(mine))
    assert ExactData.of("barrier", None, "float32", 3).expected(0, 0) is None


def test_count_wrong() -> None:
    expected = np.array([1.0, np.nan, 3.0, 4.0], dtype=np.float32)
    assert count_wrong(expected.copy(), expected) == 0
    actual = np.array([1.0, np.nan, np.nan, -4.0], dtype=np.float32)
    assert count_wrong(actual, expected) == 2
    assert count_wrong(np.array([0, 5], np.int8), np.array([0, 4], np.int8)) == 1


needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec: install the mpich extra")


@needs_mpiexec
@pytest.mark.parametrize(
    ("collective", "algorithms", "root"),
    [
        ("allreduce", None, None),  # the default algorithm, ring
        ("reduce_scatter", ("ring", "mpi"), None),
        ("allgather", ("ring", "mpi"), None),
        ("broadcast", ("direct", "ring", "mpi"), 1),
        ("alltoall", ("direct", "mpi"), None),
        ("scatter", ("direct", "mpi"), 1),
    ],
)
def test_bench_under_mpiexec(
    collective: str, algorithms: tuple[str, ...] | None, root: int | None, tmp_path: Path
) -> None:
    record = tmp_path / "rows.json"
    args = [*BENCH, collective, "-b", "8", "-e", "64K", "-n", "3", "-w", "1"]
    args += ["--json", str(record)]
    if algorithms is not None:
        args += ["-a", ",".join(algorithms)]
    if root is not None:
        args += ["-r", str(root)]
    result = run_mpi(2, args, timeout=60)
    assert result.returncode == 0, result.stdout
    assert f"# collectives {collective} benchmark" in result.stdout
    assert "out-of-place" in result.stdout
    assert "# Out of bounds values : 0 OK" in result.stdout
    assert "# Avg bus bandwidth" in result.stdout

    data = json.loads(record.read_text())
    assert data["world_size"] == 2
    assert data["collective"] == collective
    assert data["root"] == root
    sizes = plan_sizes(collective, size_sweep(8, 64 * 1024, 2), 4, 2)
    rows = data["rows"]
    # without -a the bench times the API's default, the selector's choice
    labels = [row["algorithm"] for row in rows]
    if algorithms is None:
        assert all(label.startswith("auto:") for label in labels)
        labels = ["auto"] * len(labels)
    assert [(row["size"], label) for row, label in zip(rows, labels, strict=True)] == [
        (size, algorithm) for size, _ in sizes for algorithm in algorithms or ("auto",)
    ]
    for row in rows:
        for half in (row["out_of_place"], row["in_place"]):
            assert half["wrong"] == 0
            assert half["time_us"] > 0


@needs_mpiexec
def test_bench_barrier_times_one_row_per_algorithm(tmp_path: Path) -> None:
    record = tmp_path / "rows.json"
    args = [*BENCH, "barrier", "-a", "dissemination,direct,mpi", "-n", "3", "-w", "1"]
    result = run_mpi(2, [*args, "--json", str(record)], timeout=60)
    assert result.returncode == 0, result.stdout
    rows = json.loads(record.read_text())["rows"]
    assert [(row["size"], row["algorithm"]) for row in rows] == [
        (0, "dissemination"), (0, "direct"), (0, "mpi")
    ]  # fmt: skip
    assert all(row["in_place"] is None and row["out_of_place"]["time_us"] > 0 for row in rows)


@needs_mpiexec
def test_bench_rejects_a_root_outside_the_world() -> None:
    result = run_mpi(2, [*BENCH, "reduce", "-r", "2"], timeout=30)
    assert result.returncode == 2
    assert "root 2 is not a rank: valid roots are 0..1" in result.stdout


@needs_mpiexec
def test_bench_rejects_an_op_the_dtype_lacks() -> None:
    result = run_mpi(1, [*BENCH, "allreduce", "-d", "int8", "-o", "avg"], timeout=30)
    assert result.returncode == 2
    assert "avg" in result.stdout and "int8" in result.stdout


def test_format_header_names_the_cost_model() -> None:
    lines = format_header(_settings(("auto",)), 2, "MPICH", cost_model="alpha 6.00 us/message; defaults")
    assert "# cost model  : alpha 6.00 us/message; defaults" in lines
    assert not any("cost model" in line for line in format_header(_settings(), 2, "MPICH"))


def test_auto_rows_line_up_and_average_together() -> None:
    titles = format_header(_settings(("auto",)), 4, "MPICH")[-1]
    for name in ALGORITHMS:
        row = format_row(_row(f"auto:{name}"))
        assert len(row) == len(titles)
        assert row.split()[4] == f"auto:{name}"
    lines = format_footer([_row("auto:ring", busbw=1.0), _row("auto:direct", busbw=3.0), _row("mpi")])
    assert lines[1:] == [
        "# Avg bus bandwidth    : 2.0000  (auto)",
        "# Avg bus bandwidth    : 1.0000  (mpi)",
    ]


def _no_calibration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Point the ranks at a calibration file of their own (absent until calibrate writes it)."""
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("COLLECTIVES_CALIBRATION", str(path))
    return path


@needs_mpiexec
def test_bench_auto_shows_its_choice_and_explains(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _no_calibration(monkeypatch, tmp_path)
    record = tmp_path / "rows.json"
    args = [*BENCH, "reduce_scatter", "-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1"]
    args += ["-a", "auto,ring", "--explain", "--json", str(record)]
    result = run_mpi(2, args, timeout=60)
    assert result.returncode == 0, result.stdout
    assert "# cost model  : alpha 3.00 us/message" in result.stdout
    sizes = plan_sizes("reduce_scatter", size_sweep(8, 4096, 8), 4, 2)
    # one explanation per size, ahead of its rows, every line a comment
    choices = re.findall(r"# choice: (\w+) \(predicted", result.stdout)
    assert len(choices) == len(sizes)
    assert re.search(r"# \*\s+(\w+)\s+reduce_scatter-\1\(n=2\)", result.stdout)
    assert "# Avg bus bandwidth    : " in result.stdout and "(auto)" in result.stdout
    rows = json.loads(record.read_text())["rows"]
    assert [row["algorithm"] for row in rows] == [
        name for choice in choices for name in (f"auto:{choice}", "ring")
    ]
    assert all(half["wrong"] == 0 for row in rows for half in (row["out_of_place"], row["in_place"]))


@needs_mpiexec
def test_bench_lists_auto_among_the_valid_algorithms() -> None:
    result = run_mpi(1, [*BENCH, "allgather", "-a", "ring,rign"], timeout=30)
    assert result.returncode == 2
    valid = ", ".join(name for name, module in ALGORITHMS.items() if hasattr(module, "allgather"))
    assert (
        f"unknown algorithm 'rign' for allgather; valid algorithms are auto, {valid}, or mpi" in result.stdout
    )


@needs_mpiexec
def test_calibrate_under_mpiexec_saves_where_the_env_var_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = _no_calibration(monkeypatch, tmp_path)
    # a calibration at another world size, which this one must keep
    at_3 = CostModel(alpha=1e-6, beta=2e-10, gamma=3e-10)
    save_model(at_3, path, world_size=3, host="elsewhere")
    before = json.loads(path.read_text())["calibrations"]["3"]
    result = run_mpi(2, [*BENCH, "calibrate", "--quick", "-n", "2", "-w", "0"], timeout=120)
    assert result.returncode == 0, result.stdout
    assert f"# saved to {path}" in result.stdout
    assert "# alpha " in result.stdout and "measured" in result.stdout
    calibrations = json.loads(path.read_text())["calibrations"]
    assert list(calibrations) == ["2", "3"] and calibrations["3"] == before
    assert load_model(path, world_size=3) == at_3
    saved = calibrations["2"]
    assert saved["world_size"] == 2 and saved["quick"] is True
    assert len(saved["exchanges"]) == 4
    model = load_model(path, world_size=2)
    assert all(0 <= value < 1 for value in (model.alpha, model.beta, model.gamma))
    # both ranks share this machine's memory, so the barrier was measured, not defaulted
    assert "barrier: the ranks share no memory" not in result.stdout
    assert 0 < saved["barrier_alone"] < 1 and 0 <= saved["barrier"] == model.barrier < 1
    # every candidate is timed at six sizes; the constants are fitted to five algorithms' calls
    timed = {(row["algorithm"], row["bytes"]) for row in saved["allreduces"]}
    sizes = (8, 2**11, 2**15, 2**18, 2**20, 2**23)
    names = {a for a, _ in timed}
    fitted = {"ring", "butterfly", "direct", "halving_doubling", "shared_memory"}
    assert {(a, b) for a in fitted for b in sizes} <= timed and {b for _, b in timed} == set(sizes)
    assert fitted | {"multi_ring"} <= names
    assert all(row["seconds"] > 0 for row in saved["allreduces"])
    fit = next(line for line in result.stdout.splitlines() if line.startswith("# fitted to the calls of "))
    fitted_names = "ring, butterfly, direct, halving_doubling, shared_memory"  # in bench.calibrate's order
    assert fit.startswith(f"# fitted to the calls of {fitted_names}: ")
    assert all(f" {name} " in fit for name in fitted)  # each one's median error
    # and each timed algorithm keeps what it measured over what the constants predict, per size
    assert set(saved["corrections"]) == names
    assert all(
        [b for b, _ in points] == sorted(b for a, b in timed if a == name)
        for name, points in saved["corrections"].items()
    )
    assert {name for name, _ in model.corrections} == names
    assert saved["copy"] == model.copy and saved["exchange_beta"] >= 0
    assert saved["overhead"] == model.overhead >= 0 and saved["step"] == model.step >= 0
    assert model.source == f"calibrated at 2 ranks, from {path}"
    assert load_model(path, world_size=4) == at_3  # nearer 3 than 2


@needs_mpiexec
def test_calibrate_needs_two_ranks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = _no_calibration(monkeypatch, tmp_path)
    result = run_mpi(1, [*BENCH, "calibrate", "--quick"], timeout=30)
    assert result.returncode == 2
    assert "calibrate times messages between ranks; run it under mpiexec -n 2 or more" in result.stdout
    assert not path.exists()


@needs_mpiexec
def test_the_exchange_fit_recovers_known_constants() -> None:
    # bench.calibrate imports mpi4py, which the test process itself keeps out of
    code = (
        "from collectives.bench.calibrate import TimedExchange, fit_exchange\n"
        "alpha, beta, overhead = 5e-6, 1e-10, 2e-6\n"
        "cases = [TimedExchange(k, b, overhead + k * (alpha + beta * b))\n"
        "         for k in (1, 4) for b in (8, 2**20)]\n"
        "fitted = fit_exchange(cases)\n"
        "assert all(abs(f - e) <= 1e-9 * e for f, e in zip(fitted, (alpha, beta, overhead))), fitted\n"
        # more steps taking less time fits a negative alpha, which noise it is
        "noisy = [TimedExchange(1, 8, 2e-5), TimedExchange(4, 8, 1e-5), TimedExchange(1, 10**6, 2e-5)]\n"
        "assert fit_exchange(noisy)[0] == 0, fit_exchange(noisy)\n"
    )
    result = run_mpi(1, ["-c", code], timeout=30)
    assert result.returncode == 0, result.stdout


def test_compare_ratio_is_the_ratio_of_medians_with_the_spread_of_rounds() -> None:
    from collectives.bench.compare_report import ratio

    ours = [1.0, 2.0, 3.0, 4.0, 100.0]
    peer = [2.0, 2.0, 2.0, 2.0, 2.0]
    r = ratio(ours, peer)
    assert r.median == 3.0 / 2.0
    assert (r.low, r.high) == (0.5, 50.0)
    assert (r.q25, r.q75) == (1.0, 2.0)  # per-round ratios 0.5, 1, 1.5, 2, 50
    one = ratio([3.0], [4.0])
    assert (one.median, one.q25, one.q75, one.low, one.high) == (0.75,) * 5
    with pytest.raises(ValueError):
        ratio([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        ratio([0.0], [1.0])


@needs_mpiexec
def test_bench_compare_end_to_end(tmp_path: Path) -> None:
    record, picture = tmp_path / "compare.json", tmp_path / "compare.png"
    args = [*BENCH, "compare", "-b", "8", "-e", "1K", "-f", "8", "-n", "3", "-w", "1"]
    args += ["-a", "auto,ring", "-p", "mpi", "--json", str(record), "--plot", str(picture)]
    result = run_mpi(2, args, timeout=90)
    assert result.returncode == 0, result.stdout
    assert "ours/mpi" in result.stdout and "# wrong elements: 0 OK" in result.stdout
    data = json.loads(record.read_text())
    assert data["world_size"] == 2 and data["peers"] == ["mpi"]
    assert [s["size"] for s in data["sizes"]] == [8, 64, 512]
    for entry in data["sizes"]:
        assert set(entry["times_us"]) == {"auto", "ring", "mpi"}
        assert {(r["ours"], r["peer"]) for r in entry["ratios"]} == {("auto", "mpi"), ("ring", "mpi")}
        assert all(r["low"] <= r["q25"] <= r["q75"] <= r["high"] for r in entry["ratios"])
    assert picture.stat().st_size > 0


def test_compare_times_small_messages_in_batches_and_large_ones_singly() -> None:
    from collectives.bench.compare import BATCH_BYTES, MAX_BATCH, calls_per_sample

    assert calls_per_sample(8) == MAX_BATCH
    assert calls_per_sample(64 * 1024) == BATCH_BYTES // (64 * 1024)
    assert calls_per_sample(BATCH_BYTES) == 1
    assert calls_per_sample(64 * BATCH_BYTES) == 1


@needs_mpiexec
def test_bench_kvstore_times_each_mode_and_layout_beside_allreduce(tmp_path: Path) -> None:
    record = tmp_path / "kvstore.json"
    args = [
        *BENCH,
        "kvstore",
        "-b",
        "4K",
        "-e",
        "64K",
        "-f",
        "16",
        "-m",
        "sync,async,ssp",
        "-s",
        "colocated,1",
    ]
    result = run_mpi(2, [*args, "-n", "2", "-w", "1", "--json", str(record)], timeout=120)
    assert result.returncode == 0, result.stdout
    assert "# collectives kvstore benchmark" in result.stdout
    # its length up front, and the time left as rows come (stderr, here merged into the output)
    assert "# rows        : 14, each printed" in result.stdout
    assert "bench kvstore: 1 of 14 rows after" in result.stdout and "14 of 14 rows" in result.stdout
    assert "allreduce(us)" in result.stdout and "pushpull/ar" in result.stdout
    assert "# Out of bounds values : 0 OK" in result.stdout
    rows = json.loads(record.read_text())["rows"]
    assert [(row["servers"], row["mode"], row["size"], row["path"]) for row in rows] == [
        (servers, mode, size, path)
        for servers in ("colocated", "1")
        for mode in ("sync", "async", "ssp")
        for size in (4096, 65536)
        # sync over colocated servers: the collective path and the messages, side by side
        for path in (
            ("collective", "messages") if (servers, mode) == ("colocated", "sync") else ("messages",)
        )
    ]
    for row in rows:
        assert row["wrong"] == 0
        assert set(row["times_us"]) == {"allreduce", "push", "pull", "push+pull", "pushpull"}
        assert all(us > 0 for us in row["times_us"].values())


@needs_mpiexec
def test_bench_kvstore_rejects_more_servers_than_ranks() -> None:
    result = run_mpi(2, [*BENCH, "kvstore", "-s", "2"], timeout=30)
    assert result.returncode != 0
    assert "a count from 1 to 1" in result.stdout


def test_a_bench_started_without_mpiexec_says_it_runs_on_one_rank() -> None:
    import subprocess
    import sys

    from tests.mpirun import ROOT

    args = [sys.executable, *BENCH, "allreduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0"]
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "bench: one rank, so nothing travels between ranks" in result.stderr
    assert "mpiexec -n 4" in result.stderr
    assert result.stdout.startswith("# collectives allreduce benchmark")  # the table as before


def test_the_device_bench_without_cupy_says_what_it_needs() -> None:
    import subprocess
    import sys

    from tests.mpirun import ROOT

    code = (
        "import sys; sys.modules['cupy'] = None; "
        "from collectives.bench.device_allreduce import main; main([])"
    )
    command = [sys.executable, "-c", code]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "--array cupy needs CuPy" in result.stderr and "--array numpy" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_repository_bench_package_runs_the_shipped_suite() -> None:
    import subprocess
    import sys

    from tests.mpirun import ROOT

    def run(*args: str) -> str:
        result = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=90)
        assert result.returncode == 0, result.stderr
        return result.stdout

    shipped = run(*BENCH, "--help")
    assert run("-m", "bench", "--help") == shipped  # python -m bench is python -m collectives bench
    for name in ("simulate", "kvstore", "segments", "small_path", "checkpoint", "guard_cost"):
        assert name in shipped
    # the old module paths still run, as the same modules
    assert "--segments" in run("-m", "bench.segments", "--help")
    assert run("-m", "bench", "plans", "--help") == run(*BENCH, "plans", "--help")


def test_the_standing_table_needs_auto_and_mpi_and_updates_a_page(tmp_path: Path) -> None:
    from collectives.bench.standing import BEGIN, main, render

    source = Path(__file__).resolve().parent.parent / "bench" / "compare-2ranks.json"
    record = json.loads(source.read_text())
    text = render(record, "r.json")
    assert text.startswith(f"Measured on {record['date']}, on {record['machine']}: 2 ranks")
    first = record["sizes"][0]  # 8 B: its row from the record's own figures
    ratio = next(r for r in first["ratios"] if r["ours"] == "auto" and r["peer"] == "mpi")
    times = first["times_us"]
    row = (
        f"| 8 B | {first['chosen']} | {times['auto']:.1f} | {times['mpi']:.1f} | {ratio['median']:.2f}x "
        f"| {ratio['q25']:.2f}-{ratio['q75']:.2f}x |"
    )
    assert row in text, text
    with pytest.raises(ValueError, match="need auto and mpi"):
        render({**record, "peers": ["gloo"]}, "r.json")
    with pytest.raises(ValueError, match="lacks the field 'sizes'"):
        render({k: v for k, v in record.items() if k != "sizes"}, "r.json")
    page = tmp_path / "page.md"
    page.write_text(f"# page\n{BEGIN}\nold\n<!-- end generated -->\nafter\n")
    assert main([str(source), "--update", str(page)]) == 0
    table = render(record, source.as_posix())
    assert page.read_text() == f"# page\n{BEGIN}\n{table}<!-- end generated -->\nafter\n"
