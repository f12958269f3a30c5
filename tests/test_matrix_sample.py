"""--matrix-sample (conftest.py): the sanitizer stage runs a fixed part of each large
parametrized matrix, every other test whole."""
from types import SimpleNamespace

import pytest

import conftest


def _collect(nodeids, n):
    items = [SimpleNamespace(nodeid=i) for i in nodeids]
    dropped = []
    config = SimpleNamespace(getoption=lambda name: n,
                             hook=SimpleNamespace(pytest_deselected=lambda items: dropped.extend(items)))
    conftest.pytest_collection_modifyitems(config, items)
    return [i.nodeid for i in items], [i.nodeid for i in dropped]


BIG = [f"tests/test_a.py::test_matrix[{k}]" for k in range(conftest.MATRIX_CASES)]
SMALL = [f"tests/test_a.py::test_small[{k}]" for k in range(conftest.MATRIX_CASES - 1)]
PLAIN = ["tests/test_b.py::test_plain"]


def test_samples_only_matrices_keeping_their_first_case_and_order():
    kept, dropped = _collect(BIG + SMALL + PLAIN, 4)
    assert set(SMALL + PLAIN) <= set(kept)
    assert BIG[0] in kept
    assert 0 < len(set(BIG) & set(kept)) < len(BIG) // 2
    assert sorted(kept + dropped) == sorted(BIG + SMALL + PLAIN)
    assert kept == [i for i in BIG + SMALL + PLAIN if i in kept]   # collection order kept
    assert _collect(BIG + SMALL + PLAIN, 4) == (kept, dropped)     # the same in every run


def test_default_runs_everything_and_zero_is_refused():
    assert _collect(BIG + PLAIN, 1) == (BIG + PLAIN, [])
    with pytest.raises(pytest.UsageError, match="--matrix-sample must be at least 1, got 0"):
        _collect(BIG, 0)
