"""``python -m bench kernels`` without a GPU: its report from synthetic timings, its error without CuPy."""

import json
import re
import subprocess
import sys

import pytest

from collectives.bench.kernel_bench import INPUTS, Measurement, bytes_moved, format_table, to_json

MiB = 1024**2


def test_bytes_moved_counts_reads_and_writes() -> None:
    assert bytes_moved("copy", MiB) == 2 * MiB
    assert bytes_moved("combine", MiB) == 3 * MiB
    assert bytes_moved("cupy.add", MiB) == 3 * MiB
    assert bytes_moved("torch.add_", MiB) == 3 * MiB
    assert bytes_moved("divide", MiB) == 2 * MiB
    assert bytes_moved(f"reduce_many({INPUTS})", MiB) == (INPUTS + 1) * MiB
    assert bytes_moved(f"{INPUTS - 1}x combine", MiB) == 3 * (INPUTS - 1) * MiB


def _measurements() -> list[Measurement]:
    size = 4 * MiB
    return [
        Measurement(size, "copy", 2, (0.004, 0.002, 0.003)),  # median 3 us
        Measurement(size, "combine", 3, (0.009, 0.006, 0.0045)),  # median 6 us
        Measurement(size, f"reduce_many({INPUTS})", INPUTS + 1, (0.010,)),
        Measurement(size, f"{INPUTS - 1}x combine", 3 * (INPUTS - 1), (0.025,)),
        Measurement(MiB, "cupy.add", 3, (0.002,)),  # no copy at this size
    ]


def test_measurement_median_and_bandwidth() -> None:
    copy, combine = _measurements()[:2]
    assert copy.median_us == pytest.approx(3.0)
    assert copy.gbps == pytest.approx(2 * 4 * MiB / 3e-6 / 1e9)
    assert combine.gbps == pytest.approx(3 * 4 * MiB / 6e-6 / 1e9)


def test_table() -> None:
    header, *rows, speedup = format_table(_measurements())
    titles = re.split(r"\s{2,}", header.removeprefix("#").strip())
    assert titles == ["size", "kernel", "time(us)", "GB/s", "of copy"]
    assert rows[0].split() == ["4M", "copy", "3.0", "2796.2", "1.00"]
    assert rows[1].split() == ["4M", "combine", "6.0", "2097.2", "0.75"]
    assert rows[4].split() == ["1M", "cupy.add", "2.0", "1572.9", "-"]
    assert speedup == f"# 4M: reduce_many({INPUTS}) 10.0 us, {INPUTS - 1} combines 25.0 us: speedup 2.50x"
    widths = {len(line) for line in (header, *rows)}
    assert len(widths) == 1, "columns line up"


def test_json_record() -> None:
    record = json.loads(json.dumps(to_json(_measurements(), {"device": "H100", "dtype": "float32"})))
    assert record["device"] == "H100"
    first = record["rows"][0]
    assert first == {
        "size": 4 * MiB,
        "kernel": "copy",
        "bytes_moved": 8 * MiB,
        "median_us": pytest.approx(3.0),
        "gbps": pytest.approx(2796.2, abs=0.1),
        "times_ms": [0.004, 0.002, 0.003],
    }


def test_without_cupy_it_says_so_and_fails() -> None:
    # None in sys.modules makes `import cupy` fail even where CuPy is installed
    code = (
        "import sys; sys.modules['cupy'] = None; from collectives.bench.__main__ import main; "
        "sys.exit(main(['kernels']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("python -m collectives bench kernels needs CuPy")


def test_bad_arguments_are_refused() -> None:
    code = "import sys; from collectives.bench.__main__ import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-c", code, "kernels", "-d", "float32", "-o", "bxor"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "op 'bxor' does not apply to float32" in result.stderr
