"""The benches' one table printer."""

import pytest

from collectives.bench.table import Column, Table, human_bytes


def test_columns_line_up_names_left_numbers_right_and_missing_values_dash() -> None:
    table = Table([Column("name", left=True), Column("time(us)", ".1f"), Column("ratio", ".2f")])
    header, *rows = table.lines([("ring", 12.345, 0.5), ("halving_doubling", 1234.5, None)])
    assert header.startswith("# name ") and header.endswith("time(us)  ratio")
    assert rows == ["  ring                  12.3   0.50", "  halving_doubling    1234.5      -"]
    assert len({len(line) for line in (header, *rows)}) == 1


def test_a_row_printed_as_it_comes_keeps_the_least_widths() -> None:
    table = Table([Column("size", width=6), Column("ms", ".3f", width=8)])
    assert table.header() == "#   size        ms"
    assert table.row(1024, 0.5) == "    1024     0.500"


def test_a_row_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="a row of 1 values for 2 columns"):
        Table([Column("a"), Column("b")]).row(1)


@pytest.mark.parametrize(
    ("size", "text"), [(8, "8"), (4096, "4K"), (3 << 20, "3M"), (1 << 30, "1G"), (1500, "1500")]
)
def test_sizes_as_the_options_write_them(size: int, text: str) -> None:
    assert human_bytes(size) == text
