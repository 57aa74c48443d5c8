"""Deprecated: :class:`CommScheduler` lives in :mod:`commgym.agents.scheduler`.

``commgym.agents.replay`` was its documented home until the rename; this module re-exports
the scheduler's public names for one release and warns on import (``DeprecationWarning``).
"""

from __future__ import annotations

import warnings

from commgym.agents import scheduler
from commgym.agents.scheduler import *  # noqa: F403 - the old names, re-exported

warnings.warn(
    "commgym.agents.replay is deprecated and will be removed in the next release; "
    "import CommScheduler from commgym.agents.scheduler",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = list(scheduler.__all__)
