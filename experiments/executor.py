"""Deprecated: the executors moved to :mod:`commgym.experiments.executors`.

This module re-exports their public names for one release and warns on import
(``DeprecationWarning``); import from ``commgym.experiments.executors`` instead.
"""

from __future__ import annotations

import warnings

from commgym.experiments import executors
from commgym.experiments.executors import *  # noqa: F403 - the old names, re-exported

warnings.warn(
    "commgym.experiments.executor is deprecated and will be removed in the next release; "
    "import from commgym.experiments.executors",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = list(executors.__all__)
