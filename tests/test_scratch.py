"""The pool that lends the backward kernels their float64 partial-sum scratch."""
import threading

import numpy as np
import pytest

import resnorm
from resnorm import _scratch


@pytest.fixture(autouse=True)
def empty_pool():
    with _scratch._lock:
        saved = list(_scratch._free)
        _scratch._free.clear()
    yield
    with _scratch._lock:
        _scratch._free[:] = saved


def test_views_have_the_asked_shapes_and_do_not_overlap():
    buffer, (a, b, c) = _scratch.lend_partials(5, 7, True, False, True)
    assert a.shape == (5, 7) and b.shape == (5, 0) and c.shape == (5, 7)
    assert a.dtype == c.dtype == np.float64 and a.flags.c_contiguous and c.flags.c_contiguous
    assert not np.shares_memory(a, c)
    assert np.shares_memory(a, buffer) and np.shares_memory(c, buffer)


def test_a_returned_buffer_is_lent_again_whole():
    buffer, _ = _scratch.lend_partials(4, 100, True)
    _scratch.give_back(buffer)
    again, (small,) = _scratch.lend_partials(2, 10, True)
    assert again is buffer and again.size == 400 and small.shape == (2, 10)


def test_a_lent_buffer_is_not_lent_twice():
    first, _ = _scratch.lend_partials(4, 100, True)
    second, _ = _scratch.lend_partials(4, 100, True)
    assert not np.shares_memory(first, second)


def test_pool_keeps_a_bounded_number_of_buffers_and_drops_big_ones():
    lent = [_scratch.lend_partials(1, 10 + k, True)[0] for k in range(_scratch.KEEP_BUFFERS + 3)]
    for buffer in lent:
        _scratch.give_back(buffer)
    assert len(_scratch._free) == _scratch.KEEP_BUFFERS
    assert sorted(b.size for b in _scratch._free) == [b.size for b in lent[-_scratch.KEEP_BUFFERS:]]
    big = np.empty(_scratch.KEEP_MAX_BYTES // 8 + 1)
    _scratch.give_back(big)
    assert all(b is not big for b in _scratch._free)


def test_concurrent_backward_calls_match_serial_ones():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 300)).astype(np.float32)
    w = rng.standard_normal(300).astype(np.float32)
    b = rng.standard_normal(300).astype(np.float32)
    dys = [rng.standard_normal(x.shape).astype(np.float32) for _ in range(8)]
    _, cache = resnorm.layer_norm_forward(x, w, b)
    serial = [resnorm.layer_norm_backward(dy, cache, n_threads=1) for dy in dys]
    results = [None] * len(dys)

    def work(k):
        for _ in range(20):
            results[k] = resnorm.layer_norm_backward(dys[k], cache, n_threads=1)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(dys))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, serial):
        for g, s in zip(got, want):
            np.testing.assert_array_equal(g, s)
