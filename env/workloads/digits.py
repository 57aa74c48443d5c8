"""Digits workloads: ``mlp-digits`` and ``cnn-digits`` on scikit-learn's bundled digits."""

from __future__ import annotations

import functools
import itertools
import os
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from commgym.env.workloads.registry import Workload, WorkloadData, cross_entropy, describe_workload

# --------------------------------------------------------------------------------------
# Digits (scikit-learn's bundled copy of the UCI optical digits test set)
# --------------------------------------------------------------------------------------

DIGITS_EVAL_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0


def cache_dir() -> Path:
    """Folder of commgym's disk cache on this host (the XDG base-directory convention).

    Returns:
        ``$XDG_CACHE_HOME/commgym``, ``~/.cache/commgym`` where ``XDG_CACHE_HOME`` is
        unset or empty.
    """
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "commgym"


def _digits_from_sklearn(
    sklearn_version: str, test_size: float, random_state: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    # the version is an argument only so that a scikit-learn upgrade misses the cache
    del sklearn_version
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    target = digits.target.astype(np.int64)
    train_idx, eval_idx = train_test_split(
        np.arange(len(target), dtype=np.int64),
        test_size=test_size,
        stratify=target,
        random_state=random_state,
    )
    return digits.data, target, train_idx, eval_idx


@functools.cache
def digits_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits and their fixed split, cached on disk between processes.

    ``sklearn.datasets.load_digits()`` and a stratified ``train_test_split``
    (``DIGITS_EVAL_FRACTION`` held out, ``random_state=DIGITS_SPLIT_SEED``), memoised by
    ``joblib.Memory`` in :func:`cache_dir` keyed by the scikit-learn version, the split's
    parameters and this code. Why: importing scikit-learn costs a process ~1.7 s of CPU,
    and every rank of every environment launch loads the digits; from the cache they load
    in milliseconds. A cache folder that cannot be written, or a damaged entry, only
    costs the import (joblib recomputes the entry). Cached per process too.

    Returns:
        ``(pixels, target, train_idx, eval_idx)``: float64 ``(1797, 64)`` pixel counts
        0..16, int64 ``(1797,)`` classes 0..9, and the disjoint int64 row indices of the
        1437 training and 360 held-out rows.
    """
    import joblib

    args = (version("scikit-learn"), DIGITS_EVAL_FRACTION, DIGITS_SPLIT_SEED)
    try:
        return joblib.Memory(cache_dir(), verbose=0).cache(_digits_from_sklearn)(*args)
    except OSError:  # a read-only or unusable cache folder: load without it
        return _digits_from_sklearn(*args)


def digits_split_indices() -> tuple[np.ndarray, np.ndarray]:
    """Row indices of the fixed digits train/eval split.

    Stratified by class, ``DIGITS_EVAL_FRACTION`` (20%) held out, ``random_state=0``
    (:func:`digits_arrays`).

    Returns:
        ``(train_idx, eval_idx)``: disjoint int64 arrays into the 1797 rows of
        ``sklearn.datasets.load_digits()``; 1437 and 360 rows.
    """
    _, _, train_idx, eval_idx = digits_arrays()
    return train_idx, eval_idx


@functools.cache
def load_digits_data() -> WorkloadData:
    """scikit-learn's ``load_digits`` (bundled with the package, no download), split 80/20.

    1797 greyscale 8x8 images of handwritten digits (UCI ML optical recognition of
    handwritten digits), pixel counts 0..16 scaled to ``[0, 1]`` by dividing by 16.
    Read through :func:`digits_arrays` (a disk cache shared by processes); cached per
    process.

    Returns:
        WorkloadData with ``train_x`` float32 ``(1437, 64)``, ``train_y`` int64 ``(1437,)``
        in ``0..9``, ``eval_x`` float32 ``(360, 64)``, ``eval_y`` int64 ``(360,)``.
    """
    pixels, target, train_idx, eval_idx = digits_arrays()
    x = torch.from_numpy((pixels / 16.0).astype(np.float32))
    y = torch.from_numpy(target)  # int64 already (digits_arrays)
    tr, ev = torch.from_numpy(train_idx), torch.from_numpy(eval_idx)
    return WorkloadData(
        train_x=x[tr].contiguous(),
        train_y=y[tr].contiguous(),
        eval_x=x[ev].contiguous(),
        eval_y=y[ev].contiguous(),
    )


@functools.cache
def load_digits_images() -> WorkloadData:
    """The digits split of :func:`load_digits_data` with inputs shaped as images.

    Returns:
        WorkloadData with ``train_x`` float32 ``(1437, 1, 8, 8)`` and ``eval_x`` float32
        ``(360, 1, 8, 8)`` in ``[0, 1]``; targets as in :func:`load_digits_data`.
    """
    flat = load_digits_data()
    return WorkloadData(
        train_x=flat.train_x.reshape(-1, 1, 8, 8),
        train_y=flat.train_y,
        eval_x=flat.eval_x.reshape(-1, 1, 8, 8),
        eval_y=flat.eval_y,
    )


def build_mlp(widths: tuple[int, ...]) -> nn.Sequential:
    """Dense layers ``widths[0] -> ... -> widths[-1]`` with ReLU between them (not after)."""
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def mlp_param_count(widths: tuple[int, ...]) -> int:
    """Parameters of :func:`build_mlp` ``(widths)``, biases included."""
    return sum(a * b + b for a, b in itertools.pairwise(widths))


_MLP_DIGITS_WIDTHS = (64, 128, 128, 10)


def build_mlp_digits() -> nn.Module:
    """MLP 64 -> 128 -> 128 -> 10 with ReLU: input float32 ``(B, 64)``, logits ``(B, 10)``."""
    return build_mlp(_MLP_DIGITS_WIDTHS)


def mlp_digits() -> Workload:
    """``mlp-digits``: 26,122-parameter MLP on sklearn digits; SGD(momentum 0.9) lr 0.05."""
    params = mlp_param_count(_MLP_DIGITS_WIDTHS)
    flops, batch = 6.0 * params, 32
    return Workload(
        name="mlp-digits",
        description=describe_workload(
            "MLP 64-128-128-10 (ReLU) on scikit-learn's bundled digits (8x8 greyscale, "
            "10 classes, 1437 train / 360 held-out, stratified, seed 0).",
            params,
            flops,
            batch,
        ),
        build_model=build_mlp_digits,
        load_data=load_digits_data,
        loss_fn=cross_entropy,
        default_batch_size=batch,
        default_lr=0.05,
        optimizer="sgd",
        train_flops_per_sample=flops,
    )


class DigitsCNN(nn.Module):
    """Small CNN for 8x8 digits: two 3x3 convolutions, 2x2 max-pool, two dense layers.

    conv(1->16, 3x3, pad 1) -> ReLU -> conv(16->32, 3x3, pad 1) -> ReLU -> maxpool 2
    -> flatten (512) -> dense 64 -> ReLU -> dense 10. 38,282 parameters.

    Input float32 ``(B, 1, 8, 8)``; output logits float32 ``(B, 10)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, 10)`` for images ``(B, 1, 8, 8)``."""
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def cnn_digits() -> Workload:
    """``cnn-digits``: 38,282-parameter CNN on sklearn digits as 1x8x8 images."""
    conv1, conv2 = 16 * 1 * 9 + 16, 32 * 16 * 9 + 32
    dense = 512 * 64 + 64 + 64 * 10 + 10
    params = conv1 + conv2 + dense
    flops, batch = 6.0 * ((conv1 + conv2) * 8 * 8 + dense), 32  # convs: 64 output positions
    return Workload(
        name="cnn-digits",
        description=describe_workload(
            "CNN conv3x3(16)-conv3x3(32)-maxpool-dense(64)-dense(10) on scikit-learn's "
            "bundled digits as 1x8x8 images (same split as mlp-digits).",
            params,
            flops,
            batch,
        ),
        build_model=DigitsCNN,
        load_data=load_digits_images,
        loss_fn=cross_entropy,
        default_batch_size=batch,
        default_lr=0.05,
        optimizer="sgd",
        train_flops_per_sample=flops,
    )
