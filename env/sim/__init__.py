"""``commgym/Sim-v1``: a factorised simulator of ``commgym/AllReduce-v1``, each part measured.

Pensieve's lesson (a structurally right simulator, replayed over condition traces) applied
to data-parallel training: a decision's time and progress are composed from parts that are
each measured where they live (:mod:`~commgym.env.sim.model` gives the formula):

=====================  ======================================================  ==========
part                   measured by                                             module
=====================  ======================================================  ==========
per-step compute       static episodes on the ranks, unshaped (this world      calibration
                       size and thread count)
codec + payload        the kernels on the workload's bucket, per compression   codec
wire                   timed all-reduces/all-gathers per link rate: alpha-     wire
                       beta with the emulation's token-bucket burst
learning progress      each entry's held-out loss curve (unshaped; progress    progress
                       does not depend on the link), followed from any loss;
                       a fitted share of a decision lost per switch, per
                       pair of compressor families
conditions             the env config's own plan (``for_episode``): the real   env
                       env's resolution, one source of truth
=====================  ======================================================  ==========

``commgym calibrate-sim`` measures the parts on real ranks and writes a
:class:`Calibration`; ``commgym bench sim`` prints the fidelity gates against the real
env. :mod:`~commgym.env.sim.planner` holds the simulator's own oracles (every entry's
time to target; dynamic programming over the phase sequence).
"""

from commgym.env.schedule import condition_label
from commgym.env.sim.calibration import (
    CALIBRATION_VERSION,
    Calibration,
    EntryCalibration,
    workload_key,
)
from commgym.env.sim.codec import CodecMeasurement, measure_codec
from commgym.env.sim.env import SimEnv, episode_conditions
from commgym.env.sim.model import DecisionTiming, SimModel
from commgym.env.sim.planner import (
    EntryTimes,
    adaptive_times,
    best_schedule,
    best_schedule_time,
    episode_seed_of,
    headroom,
    reactive_opening,
    simulate,
    static_ranking,
)
from commgym.env.sim.progress import (
    ProgressModel,
    fit_switch_penalties,
    switch_family,
    switch_pair,
)
from commgym.env.sim.wire import LinkFit, WireModel, fit_wire, ring_uplink_bytes

__all__ = [
    "CALIBRATION_VERSION",
    "Calibration",
    "CodecMeasurement",
    "DecisionTiming",
    "EntryCalibration",
    "EntryTimes",
    "LinkFit",
    "ProgressModel",
    "SimEnv",
    "SimModel",
    "WireModel",
    "adaptive_times",
    "best_schedule",
    "best_schedule_time",
    "condition_label",
    "episode_conditions",
    "episode_seed_of",
    "fit_switch_penalties",
    "fit_wire",
    "headroom",
    "measure_codec",
    "reactive_opening",
    "ring_uplink_bytes",
    "simulate",
    "static_ranking",
    "switch_family",
    "switch_pair",
    "workload_key",
]
