"""Built-in workloads (shapes, determinism, splits, FLOPs) and the WORKLOADS registry."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from commgym.env import workloads as wl
from commgym.env.workloads import (
    WORKLOADS,
    Workload,
    WorkloadData,
    get_workload,
    register_workload,
)

SMALL = ["mlp-digits", "cnn-digits", "charlm"]
# Documented parameter ranges (inclusive).
PARAM_RANGE = {
    "mlp-digits": (20_000, 35_000),
    "cnn-digits": (20_000, 60_000),
    "charlm": (50_000, 250_000),
    "wide-mlp": (20_000_000, 30_000_000),
}


@pytest.fixture(scope="module")
def wide_model() -> nn.Module:
    """wide-mlp built once for the whole module (85 MB)."""
    torch.manual_seed(0)
    return get_workload("wide-mlp").build_model()


@pytest.fixture
def registry():
    """Restore WORKLOADS after a test that registers custom workloads."""
    saved = dict(WORKLOADS)
    yield WORKLOADS
    WORKLOADS.clear()
    WORKLOADS.update(saved)


def _model(name: str, wide_model: nn.Module, seed: int = 0) -> nn.Module:
    if name == "wide-mlp":
        return wide_model
    torch.manual_seed(seed)
    return get_workload(name).build_model()


def test_builtins_registered():
    assert set(PARAM_RANGE) <= set(WORKLOADS)
    for name in PARAM_RANGE:
        workload = get_workload(name)
        assert workload.name == name
        assert workload.optimizer in ("sgd", "adam")
        assert workload.default_batch_size > 0 and workload.default_lr > 0


@pytest.mark.parametrize("name", [*SMALL, "wide-mlp"])
def test_builtin_shapes_loss_and_evaluate(name, wide_model):
    workload = get_workload(name)
    data = workload.load_data()
    model = _model(name, wide_model)

    n = sum(p.numel() for p in model.parameters())
    lo, hi = PARAM_RANGE[name]
    assert lo <= n <= hi
    assert workload.num_params() == n
    assert f"{n:,} parameters" in workload.description
    assert "FLOPs per step" in workload.description

    xb = data.train_x[: workload.default_batch_size]
    yb = data.train_y[: workload.default_batch_size]
    out = model(xb)
    assert out.dtype == torch.float32
    assert out.shape[:-1] == yb.shape  # logits (..., C) against class ids (...)
    loss = workload.loss_fn(out, yb)
    assert loss.ndim == 0 and torch.isfinite(loss)
    # Untrained classifier: loss near log(C).
    assert abs(loss.item() - math.log(out.shape[-1])) < 1.0

    model.train()
    ev_loss, acc = workload.evaluate(model, data.eval_x[:64], data.eval_y[:64])
    assert math.isfinite(ev_loss) and 0.0 <= acc <= 1.0
    assert model.training  # train mode restored
    model.eval()
    workload.evaluate(model, data.eval_x[:8], data.eval_y[:8])
    assert not model.training  # eval mode kept
    model.train()


def test_evaluate_matches_single_pass_and_restores_mode_on_error():
    workload = get_workload("charlm")
    data = workload.load_data()
    torch.manual_seed(0)
    model = workload.build_model()
    x, y = data.eval_x[:1100], data.eval_y[:1100]  # > one 1024-sample chunk
    loss, acc = workload.evaluate(model, x, y)
    with torch.no_grad():
        out = model(x)
    assert loss == pytest.approx(workload.loss_fn(out, y).item(), rel=1e-5)
    assert acc == pytest.approx((out.argmax(-1) == y).float().mean().item(), abs=1e-6)

    # one chunk (the env's per-decision case) is the single pass exactly, in train mode too
    model.train()
    loss1, acc1 = workload.evaluate(model, x[:100], y[:100])
    model.eval()
    with torch.no_grad():
        out1 = model(x[:100])
    model.train()
    assert loss1 == workload.loss_fn(out1, y[:100]).item()
    assert acc1 == (out1.argmax(-1) == y[:100]).float().mean().item()
    assert model.training

    with pytest.raises(ValueError, match="sequence length"):
        workload.evaluate(
            model, torch.zeros(2, 100, dtype=torch.long), torch.zeros(2, 100, dtype=torch.long)
        )
    assert model.training
    with pytest.raises(ValueError, match="non-empty"):
        workload.evaluate(model, data.eval_x[:0], data.eval_y[:0])


@pytest.mark.parametrize("name", SMALL)
def test_same_seed_same_initial_parameters(name):
    workload = get_workload(name)
    torch.manual_seed(123)
    a = workload.build_model().state_dict()
    torch.manual_seed(123)
    b = workload.build_model().state_dict()
    torch.manual_seed(124)
    c = workload.build_model().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_num_params_leaves_global_rng_untouched(registry):
    def build() -> nn.Module:
        return nn.Linear(3, 2)

    register_workload("rng-probe", lambda: _custom("rng-probe", build))
    workload = get_workload("rng-probe")
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    assert workload.num_params() == 8
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name", [*SMALL, "wide-mlp"])
def test_flops_estimate_close_to_flop_counter(name, wide_model):
    """The analytic 6 x params x uses estimate vs. torch's counted matmul/conv/attention FLOPs.

    The counter skips bias adds, norms and the (unneeded) input gradient of the first
    layer, so the analytic estimate is a bit higher; within 0.95..1.3 of the count.
    """
    workload = get_workload(name)
    data = workload.load_data()
    model = _model(name, wide_model)
    counter = FlopCounterMode(display=False)
    with counter:
        workload.loss_fn(model(data.train_x[:2]), data.train_y[:2]).backward()
    model.zero_grad(set_to_none=True)
    ratio = workload.flops_per_sample() / (counter.get_total_flops() / 2)
    assert 0.95 <= ratio <= 1.3


def test_wide_mlp_is_communication_heavy(wide_model):
    workload = get_workload("wide-mlp")
    n = workload.num_params()
    assert n >= 10_000_000
    assert n == sum(p.numel() for p in wide_model.parameters())
    assert workload.flops_per_sample() == pytest.approx(6.0 * n)


def test_digits_split_deterministic_disjoint_stratified():
    train_idx, eval_idx = wl.digits_split_indices()
    assert len(train_idx) == 1437 and len(eval_idx) == 360
    assert not set(train_idx.tolist()) & set(eval_idx.tolist())
    assert sorted([*train_idx.tolist(), *eval_idx.tolist()]) == list(range(1797))

    data = wl.load_digits_data()
    fresh = wl.load_digits_data.__wrapped__()  # uncached: a second, independent load
    for field in ("train_x", "train_y", "eval_x", "eval_y"):
        assert torch.equal(getattr(data, field), getattr(fresh, field))
    assert wl.load_digits_data() is data  # cached
    assert data.train_x.dtype == torch.float32 and data.train_y.dtype == torch.int64
    assert data.train_x.shape == (1437, 64) and data.eval_x.shape == (360, 64)
    assert 0.0 <= data.train_x.min() and data.train_x.max() <= 1.0
    # Stratified: every class in both splits, in near-equal proportions.
    train_frac = torch.bincount(data.train_y, minlength=10).double() / data.num_train
    eval_frac = torch.bincount(data.eval_y, minlength=10).double() / data.num_eval
    assert (eval_frac > 0).all() and (train_frac - eval_frac).abs().max() < 0.01

    images = wl.load_digits_images()
    assert images.train_x.shape == (1437, 1, 8, 8)
    assert torch.equal(images.train_x.reshape(1437, 64), data.train_x)


_DIGITS_PROBE = """
import json, sys
from commgym.env.workloads import load_digits_data
d = load_digits_data()
print(json.dumps({"sklearn": "sklearn" in sys.modules, "x": d.train_x.sum().item(),
                  "y": d.eval_y.tolist()}))
"""


def test_digits_load_from_the_disk_cache_without_importing_sklearn(tmp_path, monkeypatch):
    """Ranks read the digits from joblib's cache: the same rows as scikit-learn's loader,
    without its import; a damaged entry or an unusable folder costs only the import."""
    import json
    import os
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    ref = load_digits()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    pixels, target, train_idx, eval_idx = wl.digits_arrays.__wrapped__()  # fills the cache
    assert np.array_equal(pixels, ref.data) and np.array_equal(target, ref.target)
    assert np.array_equal(np.sort(np.concatenate([train_idx, eval_idx])), np.arange(1797))
    [entry] = list((tmp_path / "cache" / "commgym").rglob("output.pkl"))

    out = subprocess.run(
        [sys.executable, "-c", _DIGITS_PROBE],
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    fresh = json.loads(out.stdout.strip().splitlines()[-1])
    data = wl.load_digits_data()
    assert not fresh["sklearn"]  # a new process, e.g. a rank: read from the cache
    assert fresh["x"] == data.train_x.sum().item() and fresh["y"] == data.eval_y.tolist()

    entry.write_bytes(b"damaged")
    again = wl.digits_arrays.__wrapped__()  # recomputed and written again
    assert all(
        np.array_equal(a, b)
        for a, b in zip(again, (pixels, target, train_idx, eval_idx), strict=True)
    )
    assert entry.read_bytes() != b"damaged"

    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    unusable = wl.digits_arrays.__wrapped__()
    assert all(np.array_equal(a, b) for a, b in zip(unusable, again, strict=True))
    assert (tmp_path / "a-file").read_text() == "not a folder"


def test_charlm_data_windows_and_positional_split():
    data = wl.load_charlm_data()
    text = wl.charlm_text()
    split = wl.charlm_split_point()
    t = wl.CHARLM_CONTEXT
    assert 1_000_000 <= len(text) <= 2_500_000
    assert data.train_x.dtype == torch.int64 and data.train_x.shape[1] == t
    assert data.eval_x.shape[1] == t and data.num_eval > 0
    assert int(data.train_x.max()) < len(wl.CHARLM_VOCAB)

    ids = wl.encode_chars(text)
    n_tr, n_ev = data.num_train, data.num_eval
    # Train windows tile the text from offset 0; all targets end before the split.
    assert torch.equal(data.train_x.reshape(-1), ids[: n_tr * t])
    assert torch.equal(data.train_y.reshape(-1), ids[1 : n_tr * t + 1])
    assert n_tr * t + 1 <= split
    # Eval windows tile the text from the split point onwards: strictly after train.
    assert torch.equal(data.eval_x.reshape(-1), ids[split : split + n_ev * t])
    assert torch.equal(data.eval_y.reshape(-1), ids[split + 1 : split + n_ev * t + 1])
    assert n_tr * t >= 0.85 * len(text)  # ~90% trained on
    assert decode_window(data.eval_x[0]) == text[split : split + t].replace("\t", "\x00")

    fresh = wl.load_charlm_data.__wrapped__()
    assert torch.equal(fresh.train_x, data.train_x) and torch.equal(fresh.eval_y, data.eval_y)


def decode_window(ids: torch.Tensor) -> str:
    return wl.decode_chars(ids)


def test_encode_decode_chars():
    text = "def f(x):\n    return x ~ 'ok'\n"
    ids = wl.encode_chars(text)
    assert ids.dtype == torch.int64 and ids.shape == (len(text),)
    assert wl.decode_chars(ids) == text
    assert wl.encode_chars("\tü€\r").tolist() == [0, 0, 0, 0]
    assert len(wl.CHARLM_VOCAB) == 97


def test_charlm_is_causal():
    torch.manual_seed(0)
    model = get_workload("charlm").build_model().eval()
    x = wl.load_charlm_data().train_x[:2].clone()
    with torch.no_grad():
        before = model(x)
        x[:, 40:] = (x[:, 40:] + 1) % len(wl.CHARLM_VOCAB)
        after = model(x)
    assert torch.allclose(before[:, :40], after[:, :40], atol=1e-6)
    assert not torch.allclose(before[:, 40:], after[:, 40:])


def test_sgd_steps_reduce_mlp_digits_training_loss():
    workload = get_workload("mlp-digits")
    data = workload.load_data()
    torch.manual_seed(0)
    model = workload.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=workload.default_lr, momentum=0.9)
    loss_before, _ = workload.evaluate(model, data.train_x, data.train_y)
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        idx = torch.randint(0, data.num_train, (workload.default_batch_size,), generator=gen)
        opt.zero_grad()
        workload.loss_fn(model(data.train_x[idx]), data.train_y[idx]).backward()
        opt.step()
    loss_after, acc_after = workload.evaluate(model, data.train_x, data.train_y)
    assert loss_after < 0.7 * loss_before
    assert acc_after > 0.5


# ---- registry ----------------------------------------------------------------------


def _tiny_data() -> WorkloadData:
    g = torch.Generator().manual_seed(0)
    return WorkloadData(
        train_x=torch.randn(20, 4, generator=g),
        train_y=torch.arange(20) % 3,
        eval_x=torch.randn(6, 4, generator=g),
        eval_y=torch.arange(6) % 3,
    )


def _custom(name: str, build=lambda: nn.Linear(4, 3)) -> Workload:
    return Workload(
        name=name,
        description="tiny linear model on random data",
        build_model=build,
        load_data=_tiny_data,
        loss_fn=nn.functional.cross_entropy,
        default_batch_size=4,
        default_lr=0.1,
    )


def test_register_custom_workload(registry):
    register_workload("tiny", lambda: _custom("tiny"))
    workload = get_workload("tiny")
    assert workload.name == "tiny" and workload.optimizer == "sgd"
    assert workload.num_params() == 15
    assert workload.flops_per_sample() == 6.0 * 15  # default dense estimate
    data = workload.load_data()
    loss, acc = workload.evaluate(workload.build_model(), data.eval_x, data.eval_y)
    assert math.isfinite(loss) and 0.0 <= acc <= 1.0
    assert get_workload(workload) is workload  # instance passes through

    with pytest.raises(ValueError, match=r"'tiny' is already registered.*overwrite=True"):
        register_workload("tiny", lambda: _custom("tiny"))
    register_workload(
        "tiny", lambda: _custom("tiny", lambda: nn.Linear(4, 3, bias=False)), overwrite=True
    )
    assert get_workload("tiny").num_params() == 12  # no stale cached count


def test_register_rejects_bad_input(registry):
    for bad in ("", "has space", "-leading", "a/b", 3, "x" * 65):
        with pytest.raises(ValueError, match="workload name"):
            register_workload(bad, lambda: _custom("tiny"))
    with pytest.raises(TypeError, match="must be callable"):
        register_workload("tiny", _custom("tiny"))
    register_workload("not-a-workload", lambda: "oops")
    with pytest.raises(TypeError, match="returned str, expected a Workload"):
        get_workload("not-a-workload")


def test_unknown_name_lists_known_and_suggests():
    with pytest.raises(ValueError, match="unknown workload 'mlp-digit'") as info:
        get_workload("mlp-digit")
    message = str(info.value)
    assert all(name in message for name in PARAM_RANGE)
    assert "Did you mean 'mlp-digits'?" in message
    with pytest.raises(ValueError, match="Did you mean 'wide-mlp'"):
        get_workload("WIDEMLP")
    with pytest.raises(ValueError) as info:
        get_workload("resnet50")
    assert "Did you mean" not in str(info.value)
    with pytest.raises(TypeError, match="name"):
        get_workload(3)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"optimizer": "rmsprop"}, "optimizer must be one of"),
        ({"default_lr": 0.0}, "default_lr"),
        ({"default_lr": float("nan")}, "default_lr"),
        ({"default_batch_size": 0}, "default_batch_size"),
        ({"default_batch_size": 2.5}, "default_batch_size"),
        ({"train_flops_per_sample": -1.0}, "train_flops_per_sample"),
        ({"name": "bad name"}, "workload name"),
    ],
)
def test_workload_validation(change, match):
    fields = {
        "name": "tiny",
        "description": "",
        "build_model": lambda: nn.Linear(4, 3),
        "load_data": _tiny_data,
        "loss_fn": nn.functional.cross_entropy,
        "default_batch_size": 4,
        "default_lr": 0.1,
    }
    with pytest.raises(ValueError, match=match):
        Workload(**{**fields, **change})
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        Workload(**{**fields, "loss_fn": None})


def test_workload_data_validation():
    x = torch.zeros(5, 2)
    with pytest.raises(ValueError, match="train_x has 5 samples but train_y has 4"):
        WorkloadData(train_x=x, train_y=torch.zeros(4), eval_x=x, eval_y=torch.zeros(5))
    with pytest.raises(TypeError, match=r"eval_y must be a torch\.Tensor"):
        WorkloadData(train_x=x, train_y=x, eval_x=x, eval_y=np.zeros(5))
