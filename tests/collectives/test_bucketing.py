"""BucketPlan: DDP's assignment, no splitting, true sizes, aliasing views, edge cases."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from commgym.collectives import BucketPlan


def _params(*shapes, dtype=torch.float32):
    return [torch.nn.Parameter(torch.zeros(s, dtype=dtype)) for s in shapes]


def _check_invariants(plan: BucketPlan, bucket_bytes: float) -> None:
    n = len(plan.params)
    flat = [i for b in plan.buckets for i in b]
    # every parameter in exactly one bucket; DDP's assignment: buckets reversed (last
    # layers first), registration order inside a bucket
    assert sorted(flat) == list(range(n))
    assert all(b == sorted(b) for b in plan.buckets)
    assert [min(b) for b in plan.buckets] == sorted((min(b) for b in plan.buckets), reverse=True)
    if n:
        ddp, _ = dist._compute_bucket_assignment_by_size(
            plan.params,
            [int(-(-plan.first_bucket_bytes // 1)), int(-(-bucket_bytes // 1))],
            [False] * n,
        )
        assert plan.buckets == [list(b) for b in reversed(ddp)]
    assert len(plan.buffers) == len(plan.buckets) == len(plan.layouts) == len(plan)
    for b, idxs in enumerate(plan.buckets):
        buf = plan.buffers[b]
        nbytes = sum(plan.params[i].numel() * plan.params[i].element_size() for i in idxs)
        assert plan.bucket_bytes[b] == nbytes == buf.numel() * buf.element_size()
        assert buf.is_contiguous() and buf.dim() == 1
        assert len({(plan.params[i].dtype, plan.params[i].device) for i in idxs}) == 1
        assert buf.dtype == plan.params[idxs[0]].dtype
        off = 0
        for j, i in enumerate(idxs):
            p, view = plan.params[i], plan.views[i]
            assert plan.bucket_of[i] == b and plan.offsets[b][j] == off
            assert view.shape == p.shape and view.dtype == p.dtype
            if p.numel():
                assert view.data_ptr() == buf.data_ptr() + off * buf.element_size()
            off += p.numel()
        assert off == buf.numel()
        assert plan.layouts[b].shapes == tuple(plan.params[i].shape for i in idxs)
        assert plan.layouts[b].numel == buf.numel()
        # closed as soon as it held >= its limit: without its last parameter it was below
        last = plan.params[idxs[-1]]
        before = nbytes - last.numel() * last.element_size()
        assert before < max(bucket_bytes, plan.first_bucket_bytes)
    assert plan.total_bytes == sum(plan.bucket_bytes)
    assert len({lay.key for lay in plan.layouts}) == len(plan.layouts)


def test_registration_order_one_bucket():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    plan = BucketPlan(model.parameters(), 2**20)
    assert plan.buckets == [[0, 1, 2, 3]]
    assert plan.bucket_bytes == [4 * (8 * 4 + 8 + 2 * 8 + 2)]
    _check_invariants(plan, 2**20)


def test_tiny_target_gives_one_bucket_per_parameter():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    plan = BucketPlan(model.parameters(), 1)
    assert plan.buckets == [[3], [2], [1], [0]]
    assert plan.bucket_bytes == [8, 64, 32, 128]
    _check_invariants(plan, 1)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (40, [[3], [2], [1], [0]]),
        (41, [[2, 3], [0, 1]]),
        (80, [[2, 3], [0, 1]]),
        (81, [[3], [0, 1, 2]]),
        (160, [[0, 1, 2, 3]]),
        (1e9, [[0, 1, 2, 3]]),
    ],
)
def test_bucket_closes_once_target_reached(target, expected):
    params = _params(10, 10, 10, 10)  # 40 bytes each
    plan = BucketPlan(params, target)
    assert plan.buckets == expected
    _check_invariants(plan, target)


def test_parameters_are_never_split():
    params = _params(1000, 3, 5000)  # target much smaller than any large parameter
    plan = BucketPlan(params, 100)
    assert plan.buckets == [[1, 2], [0]]
    assert plan.bucket_bytes == [20012, 4000]
    _check_invariants(plan, 100)


def test_views_alias_the_buffer():
    params = _params((3, 4), (5,), (2, 2, 2))
    plan = BucketPlan(params, 1e9)
    (buf,) = plan.buffers
    buf.copy_(torch.arange(buf.numel(), dtype=torch.float32))
    # order in the buffer: params 0, 1, 2 (DDP's layout)
    assert torch.equal(plan.views[0].reshape(-1), torch.arange(0, 12, dtype=torch.float32))
    assert torch.equal(plan.views[1], torch.arange(12, 17, dtype=torch.float32))
    assert torch.equal(plan.views[2].reshape(-1), torch.arange(17, 25, dtype=torch.float32))
    plan.views[0].fill_(-1.0)
    assert bool((buf[:12] == -1).all()) and bool((buf[12:] >= 0).all())
    assert plan.views[0]._base is buf or plan.views[0].untyped_storage().data_ptr() == (
        buf.untyped_storage().data_ptr()
    )


def test_zero_size_scalar_and_one_element_parameters():
    params = _params((0, 3), (1,), (), (4, 0), (6,))
    plan = BucketPlan(params, 1e9)
    assert plan.buckets == [[0, 1, 2, 3, 4]]
    assert plan.bucket_bytes == [4 * (6 + 1 + 1)]
    assert plan.views[0].shape == (0, 3) and plan.views[3].shape == (4, 0)
    assert plan.views[2].shape == () and plan.views[1].shape == (1,)
    plan.views[2].fill_(7.0)
    plan.views[1].fill_(9.0)
    assert plan.buffers[0].tolist() == [9.0, 7.0, 0, 0, 0, 0, 0, 0]
    _check_invariants(plan, 1e9)
    # a single 1-element parameter, and a single empty one
    one = BucketPlan(_params((1,)), 1)
    assert one.buckets == [[0]] and one.bucket_bytes == [4]
    empty = BucketPlan(_params((0,)), 1)
    assert empty.bucket_bytes == [0] and empty.views[0].shape == (0,)


def test_zero_size_parameters_in_small_buckets():
    params = _params((0,), 10, (0, 2), 10)
    plan = BucketPlan(params, 40)
    _check_invariants(plan, 40)
    assert sorted(i for b in plan.buckets for i in b) == [0, 1, 2, 3]
    assert plan.total_bytes == 80


def test_no_parameters_no_buckets():
    plan = BucketPlan([], 100)
    assert len(plan) == 0 and plan.bucket_bytes == [] and plan.total_bytes == 0


def test_mixed_dtypes_get_separate_buckets():
    a = torch.nn.Parameter(torch.zeros(4))
    b = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    c = torch.nn.Parameter(torch.zeros(3))
    d = torch.nn.Parameter(torch.zeros(2, dtype=torch.float16))
    plan = BucketPlan([a, b, c, d], 1e9)
    # DDP keeps one open bucket per dtype: a and c share one
    assert plan.buckets == [[3], [1], [0, 2]]
    assert [buf.dtype for buf in plan.buffers] == [torch.float16, torch.float64, torch.float32]
    assert plan.bucket_bytes == [4, 32, 28]
    _check_invariants(plan, 1e9)
    same = BucketPlan([a, c, b], 1e9)
    assert same.buckets == [[2], [0, 1]]


def test_frozen_parameters_are_skipped():
    params = _params(5, 6, 7)
    params[1].requires_grad_(False)
    plan = BucketPlan(params, 1e9)
    assert plan.params == [params[0], params[2]]
    assert plan.bucket_bytes == [4 * 12]


@pytest.mark.parametrize("bad", [0, -1, 0.0, float("nan"), True, False, "1024", None])
def test_bad_bucket_bytes_raise(bad):
    with pytest.raises(ValueError, match="bucket_bytes") as info:
        BucketPlan(_params(3), bad)
    assert repr(bad) in str(info.value)


def test_same_as():
    params = _params(10, 10, 10, 10)
    plan = BucketPlan(params, 80)
    assert plan.same_as(params, 80)
    assert plan.same_as(params, 41)  # same grouping
    assert not plan.same_as(params, 81)
    assert not plan.same_as(params[:3], 80)
    assert not plan.same_as(_params(10, 10, 10, 10), 80)  # other parameter objects


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), max_size=12),
    dtypes=st.lists(st.sampled_from([torch.float32, torch.float64, torch.float16]), max_size=12),
    target=st.one_of(st.integers(1, 3000), st.floats(0.5, 5000.0)),
)
def test_plan_invariants_property(sizes, dtypes, target):
    params = [
        torch.nn.Parameter(torch.zeros(s, dtype=dtypes[i] if i < len(dtypes) else torch.float32))
        for i, s in enumerate(sizes)
    ]
    plan = BucketPlan(params, target)
    _check_invariants(plan, target)
