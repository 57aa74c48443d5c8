"""Network emulation for emulated multi-node clusters: namespaces, a bridge and tc shaping.

What network an env runs on (link specs, profiles, schedules and the :class:`NetworkPlan`
parsed once from an env's ``network`` option) is :mod:`commgym.env.net.plan`; how it is
built on one host is the rest of this package.

An :class:`EmulatedNetwork` builds a star topology on one Linux host::

            root namespace
      ┌──────── bridge <prefix><id>-br (10.a.b.1/24) ────────┐
      │ <prefix><id>-v0                    <prefix><id>-v1   │   <- bridge-side veths
      │                                                      │
      │ <prefix><id>-p0                    <prefix><id>-p1   │   <- namespace-side veths
    netns <prefix><id>-r0 (10.a.b.2)    netns <prefix><id>-r1 (10.a.b.3)  ...

Every rank's veth is shaped in **both directions** (the namespace-side egress carries
rank -> switch, the bridge-side egress carries switch -> rank), like a full-duplex NIC
plugged into a non-blocking switch. A :class:`NetworkSpec` describes the *end-to-end*
path between two ranks, so each of the two hops a rank-to-rank packet crosses gets half
of it:

* rate: every hop is shaped to ``rate_bit_s`` (a rank's uplink is shared by all its
  peers, as on a real NIC);
* delay / jitter: each hop gets ``delay_s / 2`` and ``jitter_s / 2``, so the one-way
  rank-to-rank latency is ``delay_s`` and the ping RTT between ranks is ``2 * delay_s``
  (traffic between a rank and the bridge address crosses one hop only: half of that);
* loss: each hop drops with ``1 - sqrt(1 - loss_frac)`` so the end-to-end loss is
  ``loss_frac``.

Shaping backends (chosen by probing the kernel once per process):

* ``"netem"`` (kernels with ``CONFIG_NET_SCH_NETEM``): ``root handle 1: netem delay D J
  loss L limit N`` with a child ``parent 1:1 handle 10: tbf rate R burst B latency 10ms``.
  netem's own ``rate`` option is not used: tbf is the well-understood token bucket and
  it segments GSO super-packets, which keeps 1 Gbit/s+ reachable on veths.
* ``"tbf"`` (kernels without sch_netem, e.g. minimal VM kernels): ``root handle 1: tbf``
  only. Delay, jitter and loss cannot be emulated in-kernel without netem, so a spec
  asking for them raises :class:`RuntimeError` unless the network was created with
  ``strict=False`` (then they are ignored with a warning and
  :attr:`EmulatedNetwork.effective_spec` shows what is really applied).

tbf burst sizing: ``burst = max(rate_bytes / HZ, 10 * MTU)`` with HZ taken as 250 (the
common ``CONFIG_HZ``; tbf uses high-resolution timers on current kernels, so this is a
conservative lower bound): 15 KB at 10 Mbit/s, 50 KB at 100 Mbit/s, 500 KB at 1 Gbit/s.
A burst this small charges a small message its serialisation delay as a real link would
(a 64 KiB all-reduce over 4 ranks takes ~80 ms at 10 Mbit/s, not the loopback's few ms);
tbf segments GSO super-packets larger than the burst in software, which at these rates
costs little CPU. (An earlier floor of 128 KiB let messages below it pass at loopback
speed once the bucket refilled; figures measured before the change say so.)
The tbf queue holds 10 ms at the configured rate (``latency 10ms``).

Naming (the pattern :func:`cleanup_leftovers` matches; all names are <= 15 characters):
``<prefix><id>-br`` (bridge), ``<prefix><id>-v<k>`` / ``<prefix><id>-p<k>`` (veths) and
``<prefix><id>-r<k>`` (namespaces), where ``<prefix>`` is 1-3 lowercase letters/digits
starting with a letter (default ``"cg"``), ``<id>`` is 6 lowercase hex digits and ``<k>``
is the rank. Probe namespaces are ``cg<id>-probe<pid>``. Every instance writes an owner
record ``/run/commgym-netem/<prefix><id>.json`` (pid and process start time) *before*
creating anything, so leftovers of dead processes can be told from live instances.

Requirements: root (or CAP_NET_ADMIN + CAP_SYS_ADMIN), iproute2 (``ip``, ``tc``), kernel
support for network namespaces, veth, bridge and tbf. :func:`netem_available` reports
whether the emulator can run here and :func:`delay_available` whether delay/jitter/loss
can be emulated.
"""

from commgym.env.net.emulated import EmulatedNetwork
from commgym.env.net.host import (
    delay_available,
    emulation_problem,
    host_check,
    netem_available,
    tbf_burst_bytes,
)
from commgym.env.net.plan import (
    PROFILES,
    UNSHAPED_LINK_GBPS,
    NetworkPlan,
    NetworkSchedule,
    NetworkSpec,
    choose_profile,
    link_rate_gbps,
)
from commgym.env.net.records import cleanup_leftovers

__all__ = [
    "PROFILES",
    "UNSHAPED_LINK_GBPS",
    "EmulatedNetwork",
    "NetworkPlan",
    "NetworkSchedule",
    "NetworkSpec",
    "choose_profile",
    "cleanup_leftovers",
    "delay_available",
    "emulation_problem",
    "host_check",
    "link_rate_gbps",
    "netem_available",
    "tbf_burst_bytes",
]
