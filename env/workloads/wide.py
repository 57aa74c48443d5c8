"""Wide MLPs on digits, sized so that gradient communication dominates the step.

``wide-mlp`` (21.25 M parameters, 85 MB of fp32 gradient per step) is communication-bound on
any link; ``mid-mlp`` (1.13 M parameters, 4.5 MB, the model of ``commgym bench sync``) is
communication-bound on links of about 100 Mbit/s to 1 Gbit/s and compute-bound on loopback,
so which configuration wins depends on the link: the workload of the shaped scenarios.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from commgym.env.workloads.digits import build_mlp, load_digits_data, mlp_param_count
from commgym.env.workloads.registry import Workload, cross_entropy, describe_workload

_WIDE_MLP_WIDTHS = (64, 4096, 4096, 1024, 10)
_MID_MLP_WIDTHS = (64, 1024, 1024, 10)


def build_wide_mlp() -> nn.Module:
    """MLP 64 -> 4096 -> 4096 -> 1024 -> 10 with ReLU (21.25 M params, 85 MB fp32).

    Input float32 ``(B, 64)``, logits ``(B, 10)``.
    """
    return build_mlp(_WIDE_MLP_WIDTHS)


def _digits_mlp(
    name: str, widths: tuple[int, ...], build: Callable[[], nn.Module], lr: float, text: str
) -> Workload:
    """A wide-MLP workload on digits: SGD, 32 samples per rank, cross-entropy."""
    params = mlp_param_count(widths)
    flops, batch = 6.0 * params, 32
    return Workload(
        name=name,
        description=describe_workload(text, params, flops, batch),
        build_model=build,
        load_data=load_digits_data,
        loss_fn=cross_entropy,
        default_batch_size=batch,
        default_lr=lr,
        optimizer="sgd",
        train_flops_per_sample=flops,
    )


def wide_mlp() -> Workload:
    """``wide-mlp``: 21.25 M-parameter MLP on sklearn digits, communication-dominated."""
    return _digits_mlp(
        "wide-mlp",
        _WIDE_MLP_WIDTHS,
        build_wide_mlp,
        0.01,
        "Wide MLP 64-4096-4096-1024-10 (ReLU) on scikit-learn's bundled digits, sized so "
        "that gradient communication (~85 MB fp32 per step) dominates the step time; "
        "each rank holds ~85 MB of weights plus as much again for gradients and "
        "momentum.",
    )


def build_mid_mlp() -> nn.Module:
    """MLP 64 -> 1024 -> 1024 -> 10 with ReLU (1.13 M params, 4.5 MB fp32).

    Input float32 ``(B, 64)``, logits ``(B, 10)``.
    """
    return build_mlp(_MID_MLP_WIDTHS)


def mid_mlp() -> Workload:
    """``mid-mlp``: 1.13 M-parameter MLP on sklearn digits; SGD(momentum 0.9) lr 0.05."""
    return _digits_mlp(
        "mid-mlp",
        _MID_MLP_WIDTHS,
        build_mid_mlp,
        0.05,
        "MLP 64-1024-1024-10 (ReLU) on scikit-learn's bundled digits: 4.5 MB of fp32 "
        "gradient per step, so the all-reduce dominates the step on 100 Mbit/s - 1 Gbit/s "
        "links while compute dominates on loopback.",
    )
