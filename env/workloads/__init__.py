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
mid-mlp       1,126,410   6.76 M            sklearn digits                        SGD 0.05
wide-mlp      21,253,130  127.5 M           sklearn digits                        SGD 0.01
============  ==========  ================  ====================================  =========

``wide-mlp`` exists so that communication dominates the step: its fp32 gradient is
about 85 MB (81.1 MiB) per step, against a few milliseconds of compute per sample.
``mid-mlp`` (4.5 MB per step) is communication-bound on 100 Mbit/s - 1 Gbit/s links and
compute-bound on loopback: the shaped scenarios' workload.

Workloads that a torchrun worker must find by name have to be registered in every
process, e.g. at import time of a module the worker imports; a registration made only in
the parent process is not visible to worker ranks.
"""

from commgym.env.workloads.charlm import (
    CHARLM_CONTEXT,
    CHARLM_SOURCE_FILES,
    CHARLM_VOCAB,
    CharTransformer,
    charlm,
    charlm_split_point,
    charlm_text,
    decode_chars,
    encode_chars,
    load_charlm_data,
)
from commgym.env.workloads.digits import (
    DigitsCNN,
    build_mlp_digits,
    cache_dir,
    cnn_digits,
    digits_arrays,
    digits_split_indices,
    load_digits_data,
    load_digits_images,
    mlp_digits,
)
from commgym.env.workloads.registry import (
    WORKLOADS,
    Workload,
    WorkloadData,
    get_workload,
    register_workload,
    top1_accuracy,
)
from commgym.env.workloads.wide import build_mid_mlp, build_wide_mlp, mid_mlp, wide_mlp

__all__ = [
    "CHARLM_CONTEXT",
    "CHARLM_SOURCE_FILES",
    "CHARLM_VOCAB",
    "WORKLOADS",
    "CharTransformer",
    "DigitsCNN",
    "Workload",
    "WorkloadData",
    "build_mid_mlp",
    "build_mlp_digits",
    "cache_dir",
    "build_wide_mlp",
    "charlm_split_point",
    "charlm_text",
    "decode_chars",
    "digits_arrays",
    "digits_split_indices",
    "encode_chars",
    "get_workload",
    "load_charlm_data",
    "load_digits_data",
    "load_digits_images",
    "register_workload",
    "top1_accuracy",
]

for _factory in (mlp_digits, cnn_digits, charlm, mid_mlp, wide_mlp):
    register_workload(_factory().name, _factory)
del _factory
