"""The pool that lends the kernels their scratch (the float64 partial sums of backward, row
statistics, per-thread rows and keep masks): resnorm._api's lend / give back."""
import threading

import numpy as np
import pytest

import resnorm
from resnorm import _api

KEEP_BUFFERS, KEEP_MAX_BYTES = _api.scratch_limits()


@pytest.fixture(autouse=True)
def empty_pool():
    _api.clear_scratch_pool()
    yield
    _api.clear_scratch_pool()


def test_a_returned_buffer_is_lent_again():
    first = _api.lend_scratch(4000)
    del first                                   # given back
    assert _api.scratch_pool() == [4000]
    again = _api.lend_scratch(100)              # the smallest kept buffer that fits
    assert _api.scratch_pool() == []
    del again
    assert _api.scratch_pool() == [4000]


def test_a_lent_buffer_is_not_lent_twice():
    first = _api.lend_scratch(4000)
    second = _api.lend_scratch(4000)
    del first, second
    assert _api.scratch_pool() == [4000, 4000]


def test_pool_keeps_a_bounded_number_of_buffers_and_drops_big_ones():
    lent = [_api.lend_scratch(1000 + k) for k in range(KEEP_BUFFERS + 3)]
    sizes = [1000 + k for k in range(KEEP_BUFFERS + 3)]
    del lent
    assert _api.scratch_pool() == sizes[-KEEP_BUFFERS:]   # the largest ones are kept
    big = _api.lend_scratch(KEEP_MAX_BYTES + 1)
    del big
    assert KEEP_MAX_BYTES + 1 not in _api.scratch_pool()


def test_backward_calls_give_their_scratch_back():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 300)).astype(np.float32)
    _, cache = resnorm.layer_norm_forward(x, np.ones(300, np.float32), np.zeros(300, np.float32))
    resnorm.layer_norm_backward(np.ones_like(x), cache)
    kept = _api.scratch_pool()
    assert len(kept) == 1
    for _ in range(10):
        resnorm.layer_norm_backward(np.ones_like(x), cache)
    assert _api.scratch_pool() == kept          # reused, not allocated again


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
