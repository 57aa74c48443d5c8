"""commgym.collectives: the executed action path.

Compressors, error feedback, bucketing, the overlapping gradient synchronizer, local-SGD
averaging, a DDP communication-hook adapter and the compression kernels. This package
depends only on torch (never on gymnasium, stable-baselines3 or MLflow).
"""

from commgym.collectives.amp import agree_found_inf
from commgym.collectives.averaging import PeriodicAverager, average_optimizer_state
from commgym.collectives.bucketing import BucketPlan
from commgym.collectives.compressors import (
    COMPRESSORS,
    VALID_SPEC_FORMS,
    BucketLayout,
    CompressionSpec,
    Compressor,
    make_compressor,
)
from commgym.collectives.config import CommConfig
from commgym.collectives.ddp_hook import DDPHookState, ddp_comm_hook
from commgym.collectives.ddp_sync import DDPHookSynchronizer
from commgym.collectives.errors import CollectiveTimeout, CommgymError, WorkerFailed
from commgym.collectives.residual import ResidualMemory
from commgym.collectives.stats import AveragingStats, StepStats
from commgym.collectives.synchronizer import DEFAULT_TIMEOUT_S, GradientSynchronizer

__all__ = [
    "COMPRESSORS",
    "DEFAULT_TIMEOUT_S",
    "VALID_SPEC_FORMS",
    "AveragingStats",
    "BucketLayout",
    "BucketPlan",
    "CollectiveTimeout",
    "CommConfig",
    "CommgymError",
    "CompressionSpec",
    "Compressor",
    "DDPHookState",
    "DDPHookSynchronizer",
    "GradientSynchronizer",
    "PeriodicAverager",
    "ResidualMemory",
    "StepStats",
    "WorkerFailed",
    "agree_found_inf",
    "average_optimizer_state",
    "ddp_comm_hook",
    "make_compressor",
]
