"""``wide-mlp``: a 21.25 M-parameter MLP on digits, sized so communication dominates."""

from __future__ import annotations

from torch import nn

from commgym.env.workloads.digits import _mlp, _mlp_params, load_digits_data
from commgym.env.workloads.registry import Workload, _cross_entropy, _describe

_WIDE_MLP_WIDTHS = (64, 4096, 4096, 1024, 10)


def build_wide_mlp() -> nn.Module:
    """MLP 64 -> 4096 -> 4096 -> 1024 -> 10 with ReLU (21.25 M params, 85 MB fp32).

    Input float32 ``(B, 64)``, logits ``(B, 10)``.
    """
    return _mlp(_WIDE_MLP_WIDTHS)


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
