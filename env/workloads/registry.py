"""The workload contract (:class:`Workload`, :class:`WorkloadData`) and the name registry.

Workloads are looked up by name in :data:`WORKLOADS`; :func:`register_workload` adds a
user workload and :func:`get_workload` resolves a name (or passes a :class:`Workload`
through). The built-in model zoo lives beside this module (``digits``, ``wide``,
``charlm``) and registers itself when :mod:`commgym.env.workloads` is imported.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from commgym.collectives.checks import check_int

__all__ = [
    "WORKLOADS",
    "Workload",
    "WorkloadData",
    "get_workload",
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
        check_int(f"Workload {self.name!r}: default_batch_size", batch, 1)
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
        model.eval()
        try:
            with torch.no_grad():
                if n <= _EVAL_CHUNK:
                    # one chunk (the env's per-decision evaluation): no float64 accumulators,
                    # half the small ops; for float32 (or float16) loss and accuracy the same
                    # figures as the chunked sum, whose l * n / n is then exact in float64
                    out = model(x.to(device))
                    yb = y.to(device)
                    return float(self.loss_fn(out, yb)), float(accuracy_fn(out, yb))
                loss_sum = torch.zeros((), dtype=torch.float64)
                correct_sum = torch.zeros((), dtype=torch.float64)
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


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over all positions: ``output`` ``(..., C)``, ``target`` ``(...)``."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def _fmt(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} "


def describe_workload(summary: str, params: int, flops: float, batch: int) -> str:
    """A workload's ``description``: ``summary``, parameters, MiB and FLOPs per sample/step."""
    return (
        f"{summary} {params:,} parameters ({params * 4 / 2**20:.2f} MiB fp32); "
        f"~{_fmt(flops)}FLOPs per training sample (6 x params x uses, see "
        f"Workload.flops_per_sample), ~{_fmt(flops * batch)}FLOPs per step at the default "
        f"batch of {batch} per rank."
    )
