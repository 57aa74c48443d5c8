"""Exceptions raised by commgym (one module for the whole project).

Three tiers of errors are used throughout commgym: ``ValueError``/``TypeError``
with the offending value for bad input, ``warnings.warn`` for legal but suspicious
settings, and the exceptions below for failures of the running system.
"""

from __future__ import annotations

__all__ = ["CollectiveTimeout", "CommgymError", "WorkerFailed"]


class CommgymError(RuntimeError):
    """Base class of commgym's runtime failures."""


class CollectiveTimeout(CommgymError):
    """A collective or a control-plane command did not finish within ``timeout_s``."""


class WorkerFailed(CommgymError):
    """A worker rank died, hung or reported an exception."""
