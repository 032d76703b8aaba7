"""The order the suite's files are queued in under `-n 2 --dist loadfile`: heaviest first (tests/conftest.py)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from conftest import SLOW_TEST_WEIGHT, heaviest_files_first


@dataclass
class Item:
    """As much of a pytest item as the ordering reads: its id and whether it is marked slow."""

    nodeid: str
    slow: bool = False

    def get_closest_marker(self, name: str):
        return pytest.mark.slow if name == "slow" and self.slow else None


def test_a_file_of_few_slow_tests_goes_before_one_of_many_fast_ones_and_each_keeps_its_order():
    fast = [Item(f"tests/test_many.py::test_{i}") for i in range(int(SLOW_TEST_WEIGHT) * 2 + 1)]
    slow = [Item("tests/test_kill.py::test_b", slow=True), Item("tests/test_kill.py::test_a", slow=True),
            Item("tests/test_kill.py::test_c")]
    light = [Item("tests/test_light.py::test_x")]
    order = heaviest_files_first([*light, *fast, *slow])
    assert [i.nodeid for i in order] == [i.nodeid for i in [*fast, *slow, *light]]  # 21 fast tests against 2 slow + 1
    assert [i.nodeid for i in heaviest_files_first([*light, *slow, *fast[:5]])] == [
        i.nodeid for i in [*slow, *fast[:5], *light]]


def test_files_of_equal_weight_keep_their_collection_order():
    items = [Item("tests/test_b.py::test_1"), Item("tests/test_a.py::test_1"), Item("tests/test_b.py::test_2"),
             Item("tests/test_a.py::test_2")]
    assert [i.nodeid for i in heaviest_files_first(items)] == [
        "tests/test_b.py::test_1", "tests/test_b.py::test_2", "tests/test_a.py::test_1", "tests/test_a.py::test_2"]


def test_pytest_xdist_queues_the_files_in_that_order(pytestconfig):
    """Its own reordering (by number of tests) is off, so its queue is the collection order set above."""
    if not pytestconfig.pluginmanager.hasplugin("xdist"):
        pytest.skip("pytest-xdist is not loaded")
    assert pytestconfig.option.loadscopereorder is False
