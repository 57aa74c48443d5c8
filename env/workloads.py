"""Training workloads: model factory, real dataset, loss and evaluation, behind a registry.

A :class:`Workload` bundles everything a worker rank needs to run real training
iterations: ``build_model`` (the caller seeds torch first), ``load_data`` (real data that
ships with the installed packages, never downloaded), ``loss_fn``, and the defaults a user
would pick (per-rank batch size, learning rate, optimizer). Workloads are looked up by name
in :data:`WORKLOADS`; :func:`register_workload` adds a user workload and
:func:`get_workload` resolves a name (or passes a :class:`Workload` through).

Built-in workloads (parameter counts are exact; FLOPs are the analytic training estimate
of :meth:`Workload.flops_per_sample`):

============  ==========  ================  ====================================  =========
name          params      train FLOPs/samp  data                                  optimizer
============  ==========  ================  ====================================  =========
mlp-digits    26,122      156.7 K           sklearn digits, 8x8 grey, 10 classes  SGD 0.05
cnn-digits    38,282      2.04 M            same, as 1x8x8 images                 SGD 0.05
charlm        116,705     47.1 M            CPython stdlib source, char-level     Adam 3e-3
wide-mlp      21,253,130  127.5 M           sklearn digits                        SGD 0.01
============  ==========  ================  ====================================  =========

``wide-mlp`` exists so that communication dominates the step: its fp32 gradient is
about 85 MB (81.1 MiB) per step, against a few milliseconds of compute per sample.

Workloads that a torchrun worker must find by name have to be registered in every
process, e.g. at import time of a module the worker imports; a registration made only in
the parent process is not visible to worker ranks.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import itertools
import math
import re
import sysconfig
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "CHARLM_SOURCE_FILES",
    "CHARLM_VOCAB",
    "WORKLOADS",
    "CharTransformer",
    "DigitsCNN",
    "Workload",
    "WorkloadData",
    "build_mlp_digits",
    "build_wide_mlp",
    "charlm_split_point",
    "charlm_text",
    "decode_chars",
    "digits_split_indices",
    "encode_chars",
    "get_workload",
    "load_charlm_data",
    "load_digits_data",
    "load_digits_images",
    "register_workload",
    "top1_accuracy",
]

_OPTIMIZERS = ("sgd", "adam")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Samples per forward pass in ``Workload.evaluate``: bounds peak memory of the logits
# (charlm: 1024 x 64 x 97 fp32 = 25 MB) without making evaluation slow.
_EVAL_CHUNK = 1024


# --------------------------------------------------------------------------------------
# Workload dataclasses
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadData:
    """A workload's dataset: the full training set and a held-out evaluation split.

    All tensors live on the CPU. The loaders of the built-in workloads cache one instance
    per process (``functools.cache``) and hand the same tensors to every caller, so
    treat them as read-only: index or copy, never modify in place.

    Attributes:
        train_x: Training inputs, first dimension = sample. float32 features or int64
            token ids, depending on the workload.
        train_y: Training targets, first dimension = sample (int64 class ids).
        eval_x: Held-out inputs (never trained on), same trailing shape as ``train_x``.
        eval_y: Held-out targets, same trailing shape as ``train_y``.

    Raises:
        TypeError: If a field is not a ``torch.Tensor``.
        ValueError: If inputs and targets disagree on the number of samples.
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    eval_x: torch.Tensor
    eval_y: torch.Tensor

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"WorkloadData.{field.name} must be a torch.Tensor, got {type(value).__name__}"
                )
        for split in ("train", "eval"):
            x, y = getattr(self, f"{split}_x"), getattr(self, f"{split}_y")
            if x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"{split}_x has {x.shape[0]} samples but {split}_y has "
                    f"{y.shape[0]} (shapes {tuple(x.shape)} vs {tuple(y.shape)})"
                )

    @property
    def num_train(self) -> int:
        """Number of training samples (``train_x.shape[0]``)."""
        return int(self.train_x.shape[0])

    @property
    def num_eval(self) -> int:
        """Number of held-out samples (``eval_x.shape[0]``)."""
        return int(self.eval_x.shape[0])


# (name, build_model) -> parameter count. Keyed on the factory too, so that re-registering
# a name with a different model (``overwrite=True``) never returns a stale count.
_NUM_PARAMS_CACHE: dict[tuple[str, Callable[[], nn.Module]], int] = {}


def top1_accuracy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Fraction of positions whose arg-max over the last dimension equals the target.

    Args:
        output: Logits, shape ``(..., C)``, any float dtype.
        target: Class ids, shape ``(...)`` (``output.shape[:-1]``), int64.

    Returns:
        0-dim float32 tensor in ``[0, 1]``, on ``output``'s device.

    Raises:
        ValueError: If ``target.shape != output.shape[:-1]``.
    """
    if output.shape[:-1] != target.shape:
        raise ValueError(
            f"top-1 accuracy needs target shape == output.shape[:-1]; got output "
            f"{tuple(output.shape)} and target {tuple(target.shape)}"
        )
    return (output.argmax(dim=-1) == target).float().mean()


@dataclass(frozen=True)
class Workload:
    """One training job: model factory, dataset, loss, evaluation and default hyperparameters.

    Attributes:
        name: Registry name, e.g. ``"mlp-digits"`` (letters, digits, ``.``, ``_``, ``-``).
        description: One paragraph for humans: model, data source, parameter count and
            per-step compute.
        build_model: ``() -> nn.Module`` on the CPU. Draws its initial weights from the
            global torch RNG, so the caller runs ``torch.manual_seed(seed)`` first; the
            same seed gives identical parameters.
        load_data: ``() -> WorkloadData``; deterministic, no downloads. Should be cached
            (``functools.cache``) so repeated env resets are fast.
        loss_fn: ``(model output, target) -> 0-dim tensor``, the mean loss over the batch
            (and over positions for sequence models).
        default_batch_size: Samples per rank per step.
        default_lr: Learning rate for ``optimizer``.
        optimizer: ``"sgd"`` (SGD with momentum 0.9) or ``"adam"`` (torch defaults).
        train_flops_per_sample: Analytic training FLOPs (forward + backward) per sample;
            ``None`` means the dense-layer estimate ``6 * num_params()``.
        accuracy_fn: ``(model output, target) -> 0-dim tensor in [0, 1]``; ``None`` means
            :func:`top1_accuracy` (arg-max over the last dimension).

    Raises:
        TypeError: If a callable field is not callable.
        ValueError: If the name, batch size, learning rate, optimizer or FLOPs are invalid.
    """

    name: str
    description: str
    build_model: Callable[[], nn.Module]
    load_data: Callable[[], WorkloadData]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    default_batch_size: int
    default_lr: float
    optimizer: str = "sgd"
    train_flops_per_sample: float | None = None
    accuracy_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def __post_init__(self) -> None:
        _check_name(self.name)
        for attr in ("build_model", "load_data", "loss_fn"):
            if not callable(getattr(self, attr)):
                raise TypeError(
                    f"Workload {self.name!r}: {attr} must be callable, got "
                    f"{type(getattr(self, attr)).__name__}"
                )
        if self.accuracy_fn is not None and not callable(self.accuracy_fn):
            raise TypeError(f"Workload {self.name!r}: accuracy_fn must be callable or None")
        batch = self.default_batch_size
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(
                f"Workload {self.name!r}: default_batch_size must be a positive "
                f"int, got {self.default_batch_size!r}"
            )
        if not (
            isinstance(self.default_lr, int | float)
            and math.isfinite(self.default_lr)
            and self.default_lr > 0
        ):
            raise ValueError(
                f"Workload {self.name!r}: default_lr must be a finite float > 0, "
                f"got {self.default_lr!r}"
            )
        if self.optimizer not in _OPTIMIZERS:
            raise ValueError(
                f"Workload {self.name!r}: optimizer must be one of {_OPTIMIZERS}, "
                f"got {self.optimizer!r}"
            )
        flops = self.train_flops_per_sample
        if flops is not None and not (math.isfinite(flops) and flops > 0):
            raise ValueError(
                f"Workload {self.name!r}: train_flops_per_sample must be a "
                f"finite number > 0 or None, got {flops!r}"
            )

    def evaluate(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        """Mean loss and accuracy of ``model`` on ``(x, y)``, without touching gradients.

        Runs under ``torch.no_grad()`` with ``model.eval()``, in chunks of 1024 samples
        moved to the model's device, then restores the model's previous train/eval mode
        (also when the forward pass raises).

        Args:
            model: Model built by ``build_model`` (on any device).
            x: Inputs, first dimension = sample (CPU or model device).
            y: Targets, first dimension = sample.

        Returns:
            ``(mean_loss, accuracy)``: sample-weighted mean of ``loss_fn`` over the chunks
            (nats for cross-entropy) and accuracy in ``[0, 1]`` (per token for ``charlm``).

        Raises:
            ValueError: If ``x`` is empty or ``x`` and ``y`` differ in sample count.
        """
        n = int(x.shape[0])
        if n == 0 or y.shape[0] != n:
            raise ValueError(
                f"evaluate needs a non-empty x and y with equal sample counts; "
                f"got x {tuple(x.shape)} and y {tuple(y.shape)}"
            )
        accuracy_fn = self.accuracy_fn or top1_accuracy
        device = next((p.device for p in model.parameters()), x.device)
        was_training = model.training
        loss_sum = torch.zeros((), dtype=torch.float64)
        correct_sum = torch.zeros((), dtype=torch.float64)
        model.eval()
        try:
            with torch.no_grad():
                for start in range(0, n, _EVAL_CHUNK):
                    xb = x[start : start + _EVAL_CHUNK].to(device)
                    yb = y[start : start + _EVAL_CHUNK].to(device)
                    out = model(xb)
                    weight = xb.shape[0]
                    loss_sum += self.loss_fn(out, yb).double().cpu() * weight
                    correct_sum += accuracy_fn(out, yb).double().cpu() * weight
        finally:
            model.train(was_training)
        return float(loss_sum) / n, float(correct_sum) / n

    def num_params(self) -> int:
        """Number of elements in ``model.parameters()`` (shared tensors counted once).

        Builds the model once per ``(name, build_model)`` and caches the count. The build
        runs inside ``torch.random.fork_rng``, so calling this never changes the global
        RNG state the caller seeded for its own ``build_model()``.

        Returns:
            Parameter count (trainable and frozen alike).
        """
        key = (self.name, self.build_model)
        try:
            cached = _NUM_PARAMS_CACHE.get(key)
        except TypeError:  # unhashable callable object: count without caching
            key, cached = None, None
        if cached is not None:
            return cached
        with torch.random.fork_rng(devices=[]):
            model = self.build_model()
        count = sum(p.numel() for p in model.parameters())
        if key is not None:
            _NUM_PARAMS_CACHE[key] = count
        return count

    def flops_per_sample(self) -> float:
        """Estimated training FLOPs (forward + backward) per sample.

        Training costs about three forward passes: the forward pass does one
        multiply-accumulate (2 FLOPs) per weight per use, the backward pass two (gradients
        with respect to inputs and to weights). Hence ``6 * sum_l(params_l * uses_l)``
        where ``uses_l`` is 1 for a dense layer, the number of output positions for a
        convolution and the sequence length for a transformer's per-token layers;
        transformers add the attention score/value products ``12 * n_layers * T^2 * d``
        (three passes of ``2 * 2 * T^2 * d``), embedding look-ups count zero.
        Element-wise ops (activations, norms, optimizer) are not counted.

        Returns:
            ``train_flops_per_sample`` if the workload states one, else
            ``6 * num_params()`` (exact for dense layers, biases included).
        """
        if self.train_flops_per_sample is not None:
            return float(self.train_flops_per_sample)
        return 6.0 * self.num_params()


# --------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------

WORKLOADS: dict[str, Callable[[], Workload]] = {}
"""Registry: workload name -> zero-argument factory returning a :class:`Workload`."""


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"workload name must be 1-64 characters of letters, digits, '.', '_' "
            f"or '-', starting with a letter or digit; got {name!r}"
        )


def register_workload(
    name: str, factory: Callable[[], Workload], *, overwrite: bool = False
) -> None:
    """Add a workload factory to :data:`WORKLOADS`.

    Example:
        >>> def my_factory() -> Workload:
        ...     return Workload(name="my-mlp", description="...", build_model=...,
        ...                     load_data=..., loss_fn=F.cross_entropy,
        ...                     default_batch_size=64, default_lr=0.1)
        >>> register_workload("my-mlp", my_factory)

    Args:
        name: Registry key (1-64 letters, digits, ``.``, ``_``, ``-``; starts with a letter
            or digit). Usually equal to the ``name`` of the workload the factory returns.
        factory: Zero-argument callable returning a :class:`Workload`. It is called on
            every :func:`get_workload`, so keep it cheap (no model build, no data load).
        overwrite: Replace an existing registration instead of raising.

    Raises:
        TypeError: If ``factory`` is not callable.
        ValueError: If ``name`` is malformed, or already registered and ``overwrite`` is
            false.
    """
    _check_name(name)
    if not callable(factory):
        raise TypeError(
            f"factory for workload {name!r} must be callable "
            f"(a zero-argument function returning a Workload), "
            f"got {type(factory).__name__}"
        )
    if name in WORKLOADS and not overwrite:
        raise ValueError(
            f"workload {name!r} is already registered; pass overwrite=True to "
            f"replace it or choose another name"
        )
    WORKLOADS[name] = factory


def get_workload(name: str | Workload) -> Workload:
    """Resolve a workload by registry name; a :class:`Workload` instance passes through.

    Args:
        name: Registry name (exact, case-sensitive) or a ready :class:`Workload`.

    Returns:
        A fresh :class:`Workload` from the registered factory (or ``name`` itself).

    Raises:
        ValueError: If the name is unknown; the message lists the known names and the
            closest match.
        TypeError: If ``name`` is neither a string nor a Workload, or the factory does not
            return a Workload.
    """
    if isinstance(name, Workload):
        return name
    if not isinstance(name, str):
        raise TypeError(
            f"get_workload expects a name (str) or a Workload, got {type(name).__name__}"
        )
    factory = WORKLOADS.get(name)
    if factory is None:
        known = sorted(WORKLOADS)
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        if not close:  # case slips ("MLP-Digits") and missing dashes ("mlpdigits")
            folded = {k.lower().replace("-", "").replace("_", ""): k for k in known}
            key = name.lower().replace("-", "").replace("_", "")
            close = [folded[key]] if key in folded else []
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown workload {name!r}; known workloads: {', '.join(known)}.{hint}")
    workload = factory()
    if not isinstance(workload, Workload):
        raise TypeError(
            f"factory registered for workload {name!r} returned "
            f"{type(workload).__name__}, expected a Workload"
        )
    return workload


# --------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------


def _cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over all positions: ``output`` ``(..., C)``, ``target`` ``(...)``."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def _fmt(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} "


def _describe(summary: str, params: int, flops: float, batch: int) -> str:
    return (
        f"{summary} {params:,} parameters ({params * 4 / 2**20:.2f} MiB fp32); "
        f"~{_fmt(flops)}FLOPs per training sample (6 x params x uses, see "
        f"Workload.flops_per_sample), ~{_fmt(flops * batch)}FLOPs per step at the default "
        f"batch of {batch} per rank."
    )


# --------------------------------------------------------------------------------------
# Digits (scikit-learn's bundled copy of the UCI optical digits test set)
# --------------------------------------------------------------------------------------

DIGITS_EVAL_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0


@functools.cache
def digits_split_indices() -> tuple[np.ndarray, np.ndarray]:
    """Row indices of the fixed digits train/eval split.

    Stratified by class, ``DIGITS_EVAL_FRACTION`` (20%) held out, ``random_state=0``.

    Returns:
        ``(train_idx, eval_idx)``: disjoint int64 arrays into the 1797 rows of
        ``sklearn.datasets.load_digits()``; 1437 and 360 rows.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    target = load_digits().target
    train_idx, eval_idx = train_test_split(
        np.arange(len(target), dtype=np.int64),
        test_size=DIGITS_EVAL_FRACTION,
        stratify=target,
        random_state=DIGITS_SPLIT_SEED,
    )
    return train_idx, eval_idx


@functools.cache
def load_digits_data() -> WorkloadData:
    """scikit-learn's ``load_digits`` (bundled with the package, no download), split 80/20.

    1797 greyscale 8x8 images of handwritten digits (UCI ML optical recognition of
    handwritten digits), pixel counts 0..16 scaled to ``[0, 1]`` by dividing by 16.
    Cached per process.

    Returns:
        WorkloadData with ``train_x`` float32 ``(1437, 64)``, ``train_y`` int64 ``(1437,)``
        in ``0..9``, ``eval_x`` float32 ``(360, 64)``, ``eval_y`` int64 ``(360,)``.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.from_numpy((digits.data / 16.0).astype(np.float32))
    y = torch.from_numpy(digits.target.astype(np.int64))
    train_idx, eval_idx = digits_split_indices()
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


def _mlp(widths: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _mlp_params(widths: tuple[int, ...]) -> int:
    return sum(a * b + b for a, b in itertools.pairwise(widths))


_MLP_DIGITS_WIDTHS = (64, 128, 128, 10)
_WIDE_MLP_WIDTHS = (64, 4096, 4096, 1024, 10)


def build_mlp_digits() -> nn.Module:
    """MLP 64 -> 128 -> 128 -> 10 with ReLU: input float32 ``(B, 64)``, logits ``(B, 10)``."""
    return _mlp(_MLP_DIGITS_WIDTHS)


def build_wide_mlp() -> nn.Module:
    """MLP 64 -> 4096 -> 4096 -> 1024 -> 10 with ReLU (21.25 M params, 85 MB fp32).

    Input float32 ``(B, 64)``, logits ``(B, 10)``.
    """
    return _mlp(_WIDE_MLP_WIDTHS)


def mlp_digits() -> Workload:
    """``mlp-digits``: 26,122-parameter MLP on sklearn digits; SGD(momentum 0.9) lr 0.05."""
    params = _mlp_params(_MLP_DIGITS_WIDTHS)
    flops, batch = 6.0 * params, 32
    return Workload(
        name="mlp-digits",
        description=_describe(
            "MLP 64-128-128-10 (ReLU) on scikit-learn's bundled digits (8x8 greyscale, "
            "10 classes, 1437 train / 360 held-out, stratified, seed 0).",
            params,
            flops,
            batch,
        ),
        build_model=build_mlp_digits,
        load_data=load_digits_data,
        loss_fn=_cross_entropy,
        default_batch_size=batch,
        default_lr=0.05,
        optimizer="sgd",
        train_flops_per_sample=flops,
    )


def wide_mlp() -> Workload:
    """``wide-mlp``: 21.25 M-parameter MLP on sklearn digits, communication-dominated."""
    params = _mlp_params(_WIDE_MLP_WIDTHS)
    flops, batch = 6.0 * params, 32
    return Workload(
        name="wide-mlp",
        description=_describe(
            "Wide MLP 64-4096-4096-1024-10 (ReLU) on scikit-learn's bundled digits, sized so "
            "that gradient communication (~85 MB fp32 per step) dominates the step time; "
            "each rank holds ~85 MB of weights plus as much again for gradients and "
            "momentum.",
            params,
            flops,
            batch,
        ),
        build_model=build_wide_mlp,
        load_data=load_digits_data,
        loss_fn=_cross_entropy,
        default_batch_size=batch,
        default_lr=0.01,
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
        description=_describe(
            "CNN conv3x3(16)-conv3x3(32)-maxpool-dense(64)-dense(10) on scikit-learn's "
            "bundled digits as 1x8x8 images (same split as mlp-digits).",
            params,
            flops,
            batch,
        ),
        build_model=DigitsCNN,
        load_data=load_digits_images,
        loss_fn=_cross_entropy,
        default_batch_size=batch,
        default_lr=0.05,
        optimizer="sgd",
        train_flops_per_sample=flops,
    )


# --------------------------------------------------------------------------------------
# charlm: character-level causal transformer on CPython's own standard-library source
# --------------------------------------------------------------------------------------

CHARLM_SOURCE_FILES: tuple[str, ...] = (
    "_pydecimal.py",
    "turtle.py",
    "inspect.py",
    "typing.py",
    "pydoc.py",
    "tarfile.py",
    "doctest.py",
    "argparse.py",
    "subprocess.py",
    "_pyio.py",
    "pickletools.py",
    "difflib.py",
    "mailbox.py",
    "enum.py",
    "ipaddress.py",
    "pickle.py",
)
"""Top-level stdlib modules (single files on CPython 3.11-3.14) concatenated, in this
order, into the charlm corpus: about 1.7 MB of text on CPython 3.11. The exact text
follows the running interpreter's version, so compare runs on the same Python."""

CHARLM_VOCAB: str = "\x00\n" + "".join(chr(c) for c in range(0x20, 0x7F))
"""The 97-symbol vocabulary: id 0 = placeholder for any other character (shown as
``chr(0)``), id 1 = newline, ids 2..96 = printable ASCII 0x20..0x7E."""

CHARLM_CONTEXT = 64
CHARLM_EVAL_FRACTION = 0.1
_CHARLM_MIN_CHARS = 256 * 1024
_CHARLM_D_MODEL, _CHARLM_HEADS, _CHARLM_LAYERS, _CHARLM_FF = 64, 4, 2, 256

# code point -> token id, for code points < 128; everything else maps to 0.
_ASCII_TO_ID = np.zeros(128, dtype=np.int64)
_ASCII_TO_ID[ord("\n")] = 1
_ASCII_TO_ID[0x20:0x7F] = np.arange(2, 97)


def encode_chars(text: str) -> torch.Tensor:
    """Map text to :data:`CHARLM_VOCAB` ids.

    Args:
        text: Any Python string.

    Returns:
        int64 tensor ``(len(text),)`` of ids in ``0..96``; characters outside printable
        ASCII and newline (tabs, non-ASCII, ...) become the placeholder id 0.
    """
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    ids = np.zeros(codes.shape, dtype=np.int64)
    ascii_mask = codes < 128
    ids[ascii_mask] = _ASCII_TO_ID[codes[ascii_mask]]
    return torch.from_numpy(ids)


def decode_chars(ids: torch.Tensor) -> str:
    """Inverse of :func:`encode_chars` (placeholders come back as ``chr(0)``).

    Args:
        ids: Integer tensor of ids in ``0..96``, any shape (flattened in row-major order).

    Returns:
        The decoded string.
    """
    return "".join(CHARLM_VOCAB[i] for i in ids.reshape(-1).tolist())


@functools.cache
def charlm_text() -> str:
    """The charlm corpus: :data:`CHARLM_SOURCE_FILES` from this interpreter's stdlib.

    Files are read as UTF-8 with universal newlines and joined with no separator; files
    missing from a trimmed installation are skipped with a warning. Cached per process.

    Returns:
        The concatenated source text (about 1.7 M characters on CPython 3.11).

    Raises:
        FileNotFoundError: If fewer than 256 K characters of the listed files exist.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts, missing = [], []
    for name in CHARLM_SOURCE_FILES:
        path = stdlib / name
        if path.is_file():
            parts.append(path.read_text(encoding="utf-8", errors="replace"))
        else:
            missing.append(name)
    text = "".join(parts)
    if len(text) < _CHARLM_MIN_CHARS:
        raise FileNotFoundError(
            f"charlm needs the Python source files of the standard "
            f"library in {stdlib}; found only {len(text)} characters "
            f"(missing: {', '.join(missing) or 'none'})"
        )
    if missing:
        warnings.warn(
            f"charlm: {len(missing)} stdlib source files not found in {stdlib} "
            f"({', '.join(missing)}); the corpus is smaller than usual",
            stacklevel=2,
        )
    return text


def _windows(ids: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = (ids.numel() - 1) // context
    x = ids[: n * context].reshape(n, context)
    y = ids[1 : n * context + 1].reshape(n, context)
    return x.contiguous(), y.contiguous()


def charlm_split_point() -> int:
    """Character offset where the held-out text starts (first 90% train, last 10% eval).

    Returns:
        ``int(len(charlm_text()) * 0.9)``; no training input or target lies at or after
        it, no evaluation input or target lies before it.
    """
    return int(len(charlm_text()) * (1.0 - CHARLM_EVAL_FRACTION))


@functools.cache
def load_charlm_data() -> WorkloadData:
    """Non-overlapping next-character windows of the stdlib-source corpus, split by position.

    The first 90% of the corpus (:func:`charlm_text`) is the training text, the last 10%
    the held-out text. Each is cut into consecutive windows of ``T = 64`` ids; the target
    is the input shifted by one character (``y[i, t] = x[i, t + 1]`` within the text), so
    no target crosses the split. Cached per process.

    Returns:
        WorkloadData with int64 ``train_x``, ``train_y`` ``(N_train, 64)`` and
        ``eval_x``, ``eval_y`` ``(N_eval, 64)`` of ids in ``0..96`` (about 23.8 K and
        2.6 K windows on CPython 3.11).
    """
    ids = encode_chars(charlm_text())
    split = charlm_split_point()
    train_x, train_y = _windows(ids[:split], CHARLM_CONTEXT)
    eval_x, eval_y = _windows(ids[split:], CHARLM_CONTEXT)
    return WorkloadData(train_x=train_x, train_y=train_y, eval_x=eval_x, eval_y=eval_y)


class _CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads, t, dh)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class _Block(nn.Module):
    """Pre-LayerNorm transformer block (GPT-2 layout), no dropout."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = _CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    """Causal character-level transformer (GPT-2 style, pre-LayerNorm, no dropout).

    Token + learned position embeddings, ``n_layers`` blocks of causal multi-head
    self-attention (``F.scaled_dot_product_attention(is_causal=True)``) and a GELU MLP,
    final LayerNorm, untied output projection. Defaults: vocabulary 97, context 64,
    d_model 64, 4 heads, 2 layers, MLP width 256: 116,705 parameters.

    Args:
        vocab_size: Number of token ids.
        context: Longest input sequence ``T``.
        d_model: Embedding width.
        n_heads: Attention heads (must divide ``d_model``).
        n_layers: Transformer blocks.
        d_ff: Hidden width of each block's MLP.

    Input: int64 ids ``(B, T)`` with ``T <= context``. Output: float32 logits
    ``(B, T, vocab_size)``; position ``t`` sees only ids ``0..t``.

    Raises:
        ValueError: If ``n_heads`` does not divide ``d_model`` (at construction) or the
            input is longer than ``context`` (in ``forward``).
    """

    def __init__(
        self,
        vocab_size: int = len(CHARLM_VOCAB),
        context: int = CHARLM_CONTEXT,
        d_model: int = _CHARLM_D_MODEL,
        n_heads: int = _CHARLM_HEADS,
        n_layers: int = _CHARLM_LAYERS,
        d_ff: int = _CHARLM_FF,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.context = context
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)
        self.register_buffer("positions", torch.arange(context), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, vocab_size)`` for ids ``(B, T)``."""
        t = ids.shape[1]
        if t > self.context:
            raise ValueError(f"sequence length {t} exceeds the model context {self.context}")
        x = self.tok_emb(ids) + self.pos_emb(self.positions[:t])
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def charlm() -> Workload:
    """``charlm``: 116,705-parameter causal char transformer on CPython stdlib source."""
    d, v, t, layers, ff = (
        _CHARLM_D_MODEL,
        len(CHARLM_VOCAB),
        CHARLM_CONTEXT,
        _CHARLM_LAYERS,
        _CHARLM_FF,
    )
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * ff + ff) + (ff * d + d)
    embeddings = v * d + t * d
    per_token = layers * block + 2 * d + (d * v + v)  # everything applied once per position
    params = embeddings + per_token
    flops, batch = 6.0 * per_token * t + 12.0 * layers * t * t * d, 16
    return Workload(
        name="charlm",
        description=_describe(
            f"Causal character-level transformer ({layers} layers, d_model {d}, "
            f"{_CHARLM_HEADS} heads, context {t}, vocabulary {v}: printable ASCII + newline "
            f"+ placeholder) on source text of {len(CHARLM_SOURCE_FILES)} modules of this "
            f"interpreter's standard library (last 10% held out; one sample = one window "
            f"of {t} characters, accuracy = next-character top-1).",
            params,
            flops,
            batch,
        ),
        build_model=CharTransformer,
        load_data=load_charlm_data,
        loss_fn=_cross_entropy,
        default_batch_size=batch,
        default_lr=3e-3,
        optimizer="adam",
        train_flops_per_sample=flops,
    )


for _factory in (mlp_digits, cnn_digits, charlm, wide_mlp):
    register_workload(_factory().name, _factory)
del _factory
