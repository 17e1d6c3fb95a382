"""CPU list parsing and formatting in the kernel's notation."""

import pytest

from tracekit.cpus import format_cpu_list, parse_cpu_list
from tracekit.errors import TracekitError


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0", [0]), ("0-2,5", [0, 1, 2, 5]), (" 3,1-2 ", [1, 2, 3]), ("", []), ("1,1", [1])],
)
def test_parse_cpu_list(text: str, cpus: list[int]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["a", "3-1", "1-", "-1", "0,,2"])
def test_parse_cpu_list_rejects(text: str) -> None:
    with pytest.raises(TracekitError, match="bad CPU list"):
        parse_cpu_list(text)


def test_format_round_trip() -> None:
    assert format_cpu_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert parse_cpu_list(format_cpu_list([0, 2, 3, 4, 9])) == [0, 2, 3, 4, 9]
