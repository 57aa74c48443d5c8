"""Former location of :mod:`commgym.env.net`; kept so existing imports keep working."""

from commgym.env.net import (
    PROFILES,
    EmulatedNetwork,
    NetworkSchedule,
    NetworkSpec,
    choose_profile,
    cleanup_leftovers,
    delay_available,
    netem_available,
    tbf_burst_bytes,
)

__all__ = [
    "PROFILES",
    "EmulatedNetwork",
    "NetworkSchedule",
    "NetworkSpec",
    "choose_profile",
    "cleanup_leftovers",
    "delay_available",
    "netem_available",
    "tbf_burst_bytes",
]
