"""Model-predictive control over the simulator's factorised model: re-plan at every decision.

The model-based anchor of learned scheduling (Fugu's MPC over a learned transmission-time
predictor, DeCo-SGD's and AutoByte's speed models, then an argmax): instead of learning a
policy, the agent asks the calibrated model of ``commgym/Sim-v1``
(:class:`~commgym.env.sim.SimModel`: compute, codec and wire per link rate, learning
progress per entry from the current loss, what a switch costs) how long each menu entry
would take from *here* to the target, and plays the fastest. It reads what a table indexed
by the link cannot:

* the **link**, from the probe (``link_from="probe"``, ``log10_probe_gbps``: the rate whose
  modelled probe time matches the measured one, a continuous estimate, so a rate never
  calibrated works too) or, probe-free (``link_from="timing"``), from the decision's own
  timing: a Bayes filter over the calibrated links, the measured ``step_time_s`` of the
  entry just played against each link's modelled one, the belief carried from one reading
  to the next by the same model of the link the plan uses (below: a link past its usual
  dwell is expected to change); an entry that times the links alike leaves the belief as
  it was, and the plan weighs every link the reading leaves possible;
* the **remaining loss** (``eval_loss``): progress per decision depends on where training
  is, so the best entry changes as the target comes near;
* the **switch cost**: leaving a local-SGD period for period 1 averages the optimizer state,
  and every switch loses a fitted share of a decision's progress, charged whole when the
  switch is made (:meth:`~commgym.env.sim.SimModel.switch_cost`; the calibration's
  two-decision costs per family entered, or its per-pair penalties);
* the **remaining budget** (``elapsed_frac``): an entry that cannot reach the target in it
  ranks by the loss it would reach.

Receding horizon, one decision ahead (the rollout algorithm): each entry for the next
decision, then the fastest single entry from the loss it reaches on the same link, in closed
form from the progress tables (:meth:`ModelPredictiveAgent.plan`); redone at the next
decision with the next measurement. Either reading measures the link the
*previous* decision ran on, so a switch since then is seen one decision late, and one
decision of a dense entry on a congested link can cost more than a whole phase. The agent
therefore scores every entry by its **expected** time over whether the link changes before
the next decision, ``(1 - p) T(entry | link stays) + p T(entry | another link comes)``
(Fugu's MPC likewise plans over a distribution of transmission times, not a point
estimate), with

* ``p`` the **hazard**, the share of decisions that met a new link (Laplace's rule of
  succession, ``(changes + 1) / (decisions + 2)``, so a few decisions never make the
  link certain to hold); anticipating (``anticipate=True``, the default), once the
  current link has ended before, the probability that a dwell like its completed ones is
  over by the time it has lasted instead (phases of typical lengths: a link that just came
  is safe for a while; :func:`_ended_probability`), from the dwells in the same place of
  an episode where ``learn`` saw enough of them (a schedule's first phase need not last as
  its later ones). A link's dwell is dated from the end of the last decision surely read
  on the link before it, so readings too unsure to name a link do not make it look
  younger than it is;
* the other link: the one before it in this episode, else the one that followed it most
  often before, else the calibrated link that would cost the entry most (robust).

What it has seen of the scenario's links before (``learn``: episodes played in the env it is
given, e.g. the training seeds in the simulator or a few real decisions; only the link
readings are kept, and in the simulator each episode's whole link trace, every phase that
ends within the budget, not only those before the target) adds its decisions, changes,
dwells and which link followed which to the episode's own: after episodes whose link never
changed the hazard is near 0 and the agent plays each link's best entry; where links
alternate it hedges. Before the first reading it plays the *safe* entry: the one whose worst
time to target over the calibrated links is smallest (probe-free, among the entries that
time the links at least 2x apart, so the first reading is sure; the machine's speed against
the calibration is then estimated from each sure reading on the link it names, weighted by
the share of the iteration off the wire, and scales the modelled time off the wire of later
readings).

Decision time: a few closed-form plans per link the reading leaves possible, on plain
Python floats; ``plan_s`` reports it (0.3-0.5 ms median on one core, docs/simulator.md),
it is not assumed.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from commgym.agents.base import StepAgent
from commgym.collectives.checks import check_float
from commgym.env.spaces import OBSERVATION_FIELDS, probe_gbps

__all__ = ["ModelPredictiveAgent"]

_FIELD = {f.name: i for i, f in enumerate(OBSERVATION_FIELDS)}

#: Candidate link rates of the probe's inversion, bit/s (log-spaced, 1 Mbit/s .. 100 Gbit/s).
RATE_GRID = tuple(float(r) for r in np.logspace(6, 11, 61))  # 12 per decade: 1e7, 1e10 on it

#: How the agent reads the link: the probe all-reduce, or the decision's own timing.
LINK_READINGS = ("probe", "timing")

#: Probe-free, the opening entry's modelled iterations on the calibrated links lie at
#: least this far apart where the menu has such an entry (:meth:`_safe_entry`).
OPENING_SEPARATION = 2.0

#: A timing reading this probable names the link in the history (dwells, changes) and
#: gives a speed reading; below it the history keeps the link it had.
SURE = 0.9

#: Speed readings kept per episode (their weighted median scales the modelled time off
#: the wire).
SCALE_MEMORY = 8

#: Learned dwells in one place of an episode (its n-th dwell of a link) that stand for
#: that place on their own (:meth:`ModelPredictiveAgent._dwells_like`).
PLACE_MIN = 3

#: Spread of a measured median iteration around the model's, in log (the simulator's
#: step-time error on held-out decisions is 9-12 %, the host's own drift within a run
#: ~5-10 %): the width of the timing reading's likelihood.
TIMING_SIGMA = 0.12


class ModelPredictiveAgent(StepAgent):
    """Receding-horizon planning over the calibrated simulator model (module docstring).

    Args:
        env: the commgym env it acts in (real or simulated; the menu and config must be the
            calibration's: :meth:`~commgym.env.sim.Calibration.check`).
        calibration: path of a ``commgym calibrate-sim`` record for this workload and menu.
        seed: unused (the agent is deterministic).
        max_decisions_ahead: the planning horizon in decisions: a continuation entry
            that needs more to reach the target is not considered (where none reaches
            it, an entry ranks by the loss it reaches).
        link_from: ``"probe"`` (reads ``log10_probe_gbps``; the env runs the probe and its
            time counts) or ``"timing"`` (probe-free: reads ``step_time_s`` of the entry
            just played against the calibrated links). None: ``"timing"`` where the
            calibration recorded a shaped link, else ``"probe"``.
        anticipate: expect a link to end after its typical dwell once one has ended
            (module docstring); without it the hazard alone makes it hedge where links
            alternate (on ``flaky-link`` in the simulator 8.63 s against 6.95 s with it,
            docs/simulator.md).
        timing_sigma: the standard deviation of a reading's ``log step_s`` around the
            modelled iteration of the entry on each link (:meth:`link_posterior`); default
            :data:`TIMING_SIGMA`, the per-decision spread of one day's calibration. The
            model's own error across days is larger for compressing entries (22-31 % on
            10 Gbit/s, record 2026-12-06_204907; `powersgd:2/H2` 18 % over the ranks' on
            10 Mbit/s, record 2026-12-07_003801), where the links' modelled iterations lie
            only 1.4-1.7x apart: at 0.12 one such reading moves the belief ~20x and a
            PowerSGD reading on a slow link read as fast has sent a dense entry into it
            (docs/simulator.md, the held-back variant). A larger value keeps those readings
            soft; entries whose links lie 5-200x apart still read surely.

    Raises:
        ValueError: no calibration, one that does not fit the env's config, a horizon
            below 1, or ``link_from`` not in :data:`LINK_READINGS` (``"timing"`` also
            needs a calibration with at least one shaped link).
        FileNotFoundError: the calibration file does not exist.
    """

    name = "mpc"
    #: it learns before evaluation (how long each link lasts, from ``learn``'s episodes in
    #: the simulator or on real ranks), so a leaderboard trains it by the scenario's recipe
    #: (``env_kind: sim`` and ``calibration``) like the other learners
    learned = True

    def __init__(
        self,
        env: gym.Env,
        *,
        calibration: str | None = None,
        seed: int | None = None,
        max_decisions_ahead: int = 400,
        link_from: str | None = None,
        anticipate: bool = True,
        timing_sigma: float = TIMING_SIGMA,
    ) -> None:
        if calibration is None:
            raise ValueError(
                "mpc plans over a calibrated simulator model: pass calibration=<path of a "
                "`commgym calibrate-sim` record> (baseline_kwargs: {mpc: {calibration: ...}})"
            )
        if (
            isinstance(max_decisions_ahead, bool)
            or not isinstance(max_decisions_ahead, int)
            or max_decisions_ahead < 1
        ):
            raise ValueError(
                f"max_decisions_ahead must be an integer >= 1, got {max_decisions_ahead!r}"
            )
        if link_from is not None and link_from not in LINK_READINGS:
            raise ValueError(f"link_from must be one of {list(LINK_READINGS)}, got {link_from!r}")
        timing_sigma = check_float("timing_sigma", timing_sigma, 0.0, strict=True, note=" (log)")
        super().__init__(
            env,
            seed=seed,
            calibration=str(calibration),
            max_decisions_ahead=max_decisions_ahead,
            link_from=link_from,
            anticipate=anticipate,
            timing_sigma=timing_sigma,
        )
        self.timing_sigma = timing_sigma
        from commgym.env.sim import Calibration, SimModel

        path = Path(calibration)
        if not path.is_file():
            raise FileNotFoundError(f"no calibration record at {str(path)!r}")
        cal = Calibration.load(path)
        cfg = env.unwrapped.config
        cal.check(cfg)
        self.calibration = cal
        self.model = SimModel(cal, self.menu, cfg.steps_per_decision)
        self.horizon = int(max_decisions_ahead)
        self.budget_s = float(cfg.time_budget_s)
        self.target = float(cfg.target_loss if cfg.target_loss is not None else cal.target_loss)
        n = len(self.model.entries)
        self._reaches = [self.model.reaches(j, self.target) for j in range(n)]
        self._goal_pos = [self.model.position(j, self.target) for j in range(n)]
        self.probe_bytes = int(cfg.probe_bytes)
        self.world_size = int(cfg.world_size)
        self._nvec = tuple(int(n) for n in self.menu.nvec)
        # the probe's modelled bus bandwidth per candidate rate (None: unshaped loopback)
        self._rates: list[float | None] = [None, *RATE_GRID]
        self._probe_log_gbps = [self._modelled_probe(r) for r in self._rates]
        recorded = sorted(cal.wire.links)
        if link_from is None:  # probe-free wherever the calibration can name a link
            link_from = "timing" if recorded else "probe"
        self._hyperparams["link_from"] = link_from
        self._fastest = float(recorded[-1]) if recorded else math.inf
        #: the links a reading can name and a robust plan weighs (None: unshaped)
        self._links: list[float | None] = [None, *map(float, recorded)]
        self.link_from = link_from
        if not isinstance(anticipate, bool):
            raise ValueError(f"anticipate must be true or false, got {anticipate!r}")
        self.anticipate = anticipate
        #: a probe-free reader does not run the probe (the rollout resets without it)
        self.reads_probe = link_from == "probe"
        #: the probe bytes each planned decision pays for (none without the probe)
        self._probe_paid = self.probe_bytes if self.reads_probe else 0
        if link_from == "timing":
            if not recorded:
                raise ValueError(
                    "link_from='timing' names a calibrated link from the entry's step time; "
                    f"{str(path)!r} has no shaped link (calibrate on the scenario's links)"
                )
            # shaped links only: above the burst a fast link times like loopback
            self._timing_links = [float(r) for r in recorded]
            self._timing_step = [
                [t.step_s for t in self.model.timings(r)] for r in self._timing_links
            ]
            # per iteration off the wire (compute, codec; the same on every link): the
            # part a slower or faster machine scales
            steps = self.model.k
            self._off_wire = [
                max(t.train_s - t.rounds * t.exchange_s, 0.0) / steps
                for t in self.model.timings(self._timing_links[0])
            ]
        self._telling = self._telling_entries()
        self._safe = self._safe_entry(self._links)
        #: what ``learn`` saw: link -> completed dwell lengths (s), link -> the links that
        #: followed it (counts), and decisions and link changes seen; plain values, saved
        #: with the policy
        self.prior_dwells: dict[str, list[float]] = {}
        #: link -> its how-manieth dwell in an episode ("0", "1", ...) -> dwell lengths (s)
        self.prior_dwells_by_index: dict[str, dict[str, list[float]]] = {}
        self.prior_next: dict[str, dict[str, int]] = {}
        self.prior_decisions = 0
        self.prior_changes = 0
        self._seen: dict[str, Any] | None = None
        self._trace_read = False
        #: wall seconds of the last plan (decision time, reported by tests and benches)
        self.plan_s = 0.0
        #: the last plan's expected time to target of every flat entry, s (``None``: the
        #: last decision was played without a plan, before any reading of the link); what a
        #: clone's cost-weighted imitation reads (:class:`~commgym.agents.imitation.AgentExpert`)
        self.plan_times: np.ndarray | None = None
        #: the link rate the last plan assumed, bit/s (None: unshaped)
        self.rate_bit_s: float | None = None

    # -- the model ------------------------------------------------------------------
    def _modelled_probe(self, rate: float | None) -> float:
        """log10 of the probe's bus bandwidth the model predicts at ``rate`` (0: no probe)."""
        if not self.probe_bytes:
            return 0.0
        seconds = self.model.probe_s(self.probe_bytes, rate)
        return math.log10(max(probe_gbps(self.probe_bytes, seconds, self.world_size), 1e-12))

    def rate_from_probe(self, log10_gbps: float) -> float | None:
        """The candidate rate whose modelled probe bandwidth is nearest the measured one.

        Above a few hundred Mbit/s the probe fits in the link's token-bucket burst and
        its time no longer depends on the rate: every such rate models the probe alike,
        and the fastest of them up to the fastest calibrated rate is taken (the probe says
        "at least this fast"; beyond the calibration the model only extrapolates).
        """
        gaps = [abs(p - log10_gbps) for p in self._probe_log_gbps]
        best = min(gaps)
        tied = [i for i, g in enumerate(gaps) if g <= best + 1e-3]  # 0.2 % in bandwidth
        shaped = [i for i in tied if self._rates[i] is not None]
        if not shaped:
            return None
        inside = [i for i in shaped if self._rates[i] <= self._fastest * (1 + 1e-9)]
        return self._rates[max(inside or [min(shaped)])]

    def link_posterior(
        self,
        entry: int,
        step_s: float,
        prior: list[float] | None = None,
        scale: float = 1.0,
    ) -> list[float]:
        """P(each calibrated link | the measured median iteration of ``entry``).

        A Bayes update over the calibrated links (an HMM filter's measurement step): the
        likelihood of ``log step_s`` is normal around each link's modelled
        ``log(step + (scale - 1) * off_wire)`` with :attr:`timing_sigma`; an entry that
        times the links alike leaves the prior as it was.

        Args:
            entry: the flat entry the measured decision played.
            step_s: its measured median iteration, s (``step_time_s``).
            prior: P(each link) before the reading, in ``self._timing_links`` order
                (None: uniform).
            scale: the machine's speed against the calibration's, off the wire (the
                episode's estimate, :func:`_scale`).

        Returns:
            The posterior, one probability per calibrated link (sums to 1).
        """
        x = math.log(max(step_s, 1e-9))
        off = (scale - 1.0) * self._off_wire[entry]
        n = len(self._timing_links)
        prior = prior or [1.0 / n] * n
        z = [
            -0.5 * ((math.log(max(row[entry] + off, 1e-9)) - x) / self.timing_sigma) ** 2
            for row in self._timing_step
        ]
        top = max(z)
        w = [pr * math.exp(v - top) for pr, v in zip(prior, z, strict=True)]
        total = sum(w)
        return [v / total for v in w] if total > 0 else [1.0 / n] * n

    def read_link(
        self, obs: np.ndarray, state: dict[str, Any] | None = None, start_s: float | None = None
    ) -> Any:
        """The link the decision that produced ``obs`` ran on, and how sure the reading is.

        ``link_from="probe"``: :meth:`rate_from_probe`, certain; ``"timing"``:
        :meth:`link_posterior` of the entry ``obs`` names, from the episode's belief in
        ``state`` (:func:`_observe_link`'s history; None at the start) carried on to the
        decision that started at ``start_s`` (s of training) by :meth:`_transition`, at the
        episode's speed estimate.

        Returns:
            ``(rate, posterior)``: the most probable link (``"unknown"`` without a reading;
            the link the history had where the most probable other is below :data:`SURE`)
            and ``{rate: probability}`` over the links a plan weighs.
        """
        if self.link_from == "probe":
            probe = float(obs[_FIELD["log10_probe_gbps"]])
            if probe == 0.0:
                return "unknown", {}
            rate = self.rate_from_probe(probe)
            return rate, {rate: 1.0}
        step = float(obs[_FIELD["step_time_s"]])
        if step <= 0.0:
            return "unknown", {}
        prior = None
        if state and state.get("belief"):
            h = self._transition(state, start_s)
            n = len(self._timing_links)
            prior = [(1 - h) * q + h * (1 - q) / max(n - 1, 1) for q in state["belief"]]
        post = self.link_posterior(self._entry_of(obs), step, prior, _scale(state))
        best = int(np.argmax(post))
        rate = self._timing_links[best]
        if state and post[best] < SURE and rate != state["value"]:
            # an unsure reading does not move the link's history (dwells, changes, the
            # hazard): a misread would record a change that never happened
            rate = state["value"]
        return rate, dict(zip(self._timing_links, post, strict=True))

    def _observe_reading(
        self,
        state: dict[str, Any] | None,
        obs: np.ndarray,
        rate: Any,
        posterior: dict[Any, float],
        start_s: float,
        end_s: float,
    ) -> dict[str, Any]:
        """The history after ``rate`` was read from ``obs`` (:func:`_observe_link`).

        The decision read ran from ``start_s`` to ``end_s`` (s of training). Probe-free,
        with the belief over the links and the speed a sure reading implies:
        ``1 + (measured - modelled) / off_wire`` on the link read (where the link is at least
        :data:`SURE` probable), weighted by ``(off_wire / modelled)^2``: the timing's
        relative error lands on the speed magnified by ``modelled / off_wire``, so a
        reading that is nearly all wire says little about the machine. The last
        :data:`SCALE_MEMORY`, across link changes; their weighted median is the estimate.
        """
        sure = posterior.get(rate, 1.0) >= SURE
        new = _observe_link(state, rate, start_s, end_s, sure)
        if self.link_from != "timing":
            return new
        new["belief"] = [posterior[r] for r in self._timing_links]
        k = self._entry_of(obs)
        off = self._off_wire[k]
        step = self._timing_step[self._timing_links.index(rate)][k]
        if sure and off > 0.0:
            implied = 1.0 + (float(obs[_FIELD["step_time_s"]]) - step) / off
            reading = [min(max(implied, 0.5), 3.0), (off / step) ** 2]
            new["scales"] = [*new.get("scales", []), reading][-SCALE_MEMORY:]
        return new

    def _transition(self, state: dict[str, Any], start_s: float | None) -> float:
        """P(the link changed between the last decision read and the one from ``start_s``).

        The hazard (:meth:`_hazard`), or, anticipating once the current link has completed
        dwells, at least the chance that a dwell like them ends in between:
        ``(F(b) - F(a)) / (1 - F(a))`` with ``F`` :func:`_ended_probability` and ``a``,
        ``b`` the two decisions' starts into the dwell. The filter and the plan then read
        the same model of the link: with the hazard alone a link that had outlived its
        usual dwell still needed a reading more than ~20x likelier on the other link to
        flip, and PowerSGD, whose step times on the two links were 1.1-1.3x apart on a
        slower machine, kept the slow link for six decisions into a fast phase (the
        held-back variant of flaky-link).
        """
        hazard = self._hazard(state)
        past = self._dwells_like(state)
        if not self.anticipate or not past or start_s is None or "read_s" not in state:
            return hazard
        a = max(state["read_s"] - state["since_s"], 0.0)
        b = max(start_s - state["since_s"], a)
        fa, fb = _ended_probability(past, a), _ended_probability(past, b)
        return max(hazard, (fb - fa) / max(1.0 - fa, 1e-12))

    def _hazard(self, state: dict[str, Any]) -> float:
        """P(a new link at a decision), Laplace's rule of succession.

        ``(changes + 1) / (decisions + 2)`` over this episode's and ``learn``'s readings.
        """
        decisions = state["decisions"] + self.prior_decisions
        changes = state["changes"] + self.prior_changes
        return (changes + 1) / (decisions + 2)

    def _entry_of(self, obs: np.ndarray) -> int:
        """The flat entry ``obs``'s index fields name (the one configured last)."""
        return int(np.ravel_multi_index(tuple(self.menu.action_in(obs)), self._nvec))

    def plan(self, loss: float, now_s: float, prev: int, rate: float | None) -> list[float]:
        """Every flat entry's modelled time to target from here, s, with ``rate`` in force.

        The rollout algorithm over the model (one-step lookahead on a base policy,
        Bertsekas): one decision of entry ``k`` (its switch from ``prev`` included), then
        the fastest single entry from the loss it reaches, its switch from ``k`` and the
        progress that switch loses included, in closed form from the progress tables (a
        decision advances an entry's table by one position). The base policy is static,
        so every candidate is charged what its own next switch costs, and the lookahead
        risks one decision, as the next reading comes one decision later.

        Args:
            loss: the held-out loss now, nats.
            now_s: the episode's training time now, s.
            prev: the flat entry played last (``-1``: none).
            rate: the link, bit/s (None: unshaped), for the decision and after it.

        Returns:
            Per flat entry the time to target from ``now_s``; where no entry reaches the
            target within ``max_decisions_ahead`` decisions, ``budget - now_s + loss``
            (at least the rest of the budget, ranked among misses by loss).
        """
        model, n = self.model, len(self.model.entries)
        timings = model.timings(rate)
        probe = model.probe_s(self._probe_paid, rate)
        out = []
        for k in range(n):
            switched = prev >= 0 and prev != k
            first = (model.switch_s(prev, k, rate) if switched else 0.0) + timings[k].train_s
            # a switch is charged its whole fitted cost when made (both decisions of the
            # two-decision form): planning one decision ahead, the form's split, which its
            # data pin down far less than the total, would otherwise invite switching away
            # before the second decision's cost, over and over (seen in the simulator)
            after = model.advance(k, loss, 1.0 - model.switch_cost(prev, k))
            if after <= self.target:
                out.append(first + probe)
                continue
            out.append(first + probe + self._rest(after, k, rate, now_s, timings, probe))
        return out

    def _rest(
        self,
        loss: float,
        last: int,
        rate: float | None,
        now_s: float,
        timings: list[Any],
        probe: float,
    ) -> float:
        """Time to target from ``loss`` with ``last`` in place: the fastest single entry.

        ``timings`` and ``probe`` are the link's, as :meth:`plan` looked them up; a
        switch to another entry is charged its whole cost (:meth:`SimModel.switch_cost`).
        """
        model = self.model
        best = math.inf
        for j in range(len(model.entries)):
            if not self._reaches[j]:
                continue
            need = self._goal_pos[j] - model.position(j, loss)
            # fractional: a whole number would round away what one decision's progress
            # is worth, the very difference the lookahead weighs
            decisions = max(need + model.switch_cost(last, j), 0.0)
            if decisions > self.horizon:
                continue
            t = decisions * (timings[j].train_s + probe) + model.switch_s(last, j, rate)
            best = min(best, t)
        return best if math.isfinite(best) else self.budget_s - now_s + loss

    def _safe_entry(self, rates: list[float | None]) -> int:
        """The flat entry with the smallest worst-case time to target over ``rates``.

        Probe-free, among the entries whose modelled iterations on every two calibrated
        links lie at least :data:`OPENING_SEPARATION` apart where one exists: the first
        reading then names the link whatever the machine's speed (within a factor ~1.4),
        and the speed estimate starts from a reading it can trust.
        """
        loss0 = self.model.progress.initial_loss
        worst = np.max([self.plan(loss0, 0.0, -1, r) for r in rates], axis=0)
        if self._telling:
            return min(self._telling, key=lambda k: worst[k])
        return int(np.argmin(worst))

    def _telling_entries(self) -> list[int]:
        """The flat entries whose next reading names the link whatever the machine's speed.

        Their modelled iterations on every two calibrated links lie at least
        :data:`OPENING_SEPARATION` apart (probe-free with two links or more; else none).
        """
        if self.link_from != "timing" or len(self._timing_links) < 2:
            return []
        steps = self._timing_step
        return [
            k
            for k in range(len(steps[0]))
            if min(
                abs(math.log(a[k]) - math.log(b[k]))
                for i, a in enumerate(steps)
                for b in steps[i + 1 :]
            )
            >= math.log(OPENING_SEPARATION)
        ]

    # -- StepAgent ------------------------------------------------------------------
    def _act(self, obs: np.ndarray, state: Any, deterministic: bool) -> tuple[np.ndarray, Any]:
        t0 = time.perf_counter()
        now = float(obs[_FIELD["elapsed_frac"]]) * self.budget_s
        start = state["now"] if state else None  # the decision this reading timed
        rate, posterior = self.read_link(obs, state, start) if now > 0.0 else ("unknown", {})
        if rate == "unknown":  # no measurement of the link yet
            self.plan_s = time.perf_counter() - t0
            self.plan_times = None
            return self._action(self._safe), state
        prev = self._entry_of(obs)
        # the reading timed the link of the decision that started at the last decision point
        state = self._observe_reading(state, obs, rate, posterior, start or 0.0, now)
        self.rate_bit_s = rate
        loss = float(obs[_FIELD["eval_loss"]])
        p, others = self._switch_probability(state, now)

        def expected(link: float | None, p: float, others: list[float | None]) -> np.ndarray:
            times = np.asarray(self.plan(loss, now, prev, link))
            if p > 0 and others:
                # robust over the candidates for the other link: the costliest per entry
                other = np.max([self.plan(loss, now, prev, o) for o in others], axis=0)
                times = (1 - p) * times + p * other
            return times

        # the links the reading leaves possible (probe: only the one it names), each with
        # its own chance of changing before the next decision
        weighed = {r: q for r, q in posterior.items() if q >= 0.01}
        total = sum(weighed.values())
        times = sum(
            (q / total) * (expected(r, p, others) if r == rate else expected(r, p, [rate]))
            for r, q in weighed.items()
        )
        k = int(np.argmin(times))
        self.plan_s = time.perf_counter() - t0
        self.plan_times = np.asarray(times, dtype=np.float64)
        return self._action(k), {**state, "now": now}

    def _action(self, k: int) -> np.ndarray:
        return np.array(np.unravel_index(k, self._nvec), dtype=np.int64)

    def link_outlook(self, state: dict[str, Any], now_s: float) -> tuple[Any, float, float]:
        """What the filter holds of the link at ``now_s``: what a plan weighs.

        Args:
            state: this agent's ``predict`` state after at least one reading of the link.
            now_s: training time of the next decision, s.

        Returns:
            ``(rate, belief, change)``: the link its history holds (bit/s, ``None`` for
            unshaped loopback), the probability the filter gives that link (1 reading the
            probe), and the probability that the link changes by the next decision
            (:meth:`_switch_probability`: the hazard, or the learned dwells where it
            anticipates).
        """
        rate = state["value"]
        belief = 1.0
        if state.get("belief") and rate in self._timing_links:
            belief = float(state["belief"][self._timing_links.index(rate)])
        return rate, belief, float(self._switch_probability(state, now_s)[0])

    def _switch_probability(
        self, state: dict[str, Any], now_s: float
    ) -> tuple[float, list[float | None]]:
        """P(a new link by the next decision), and the candidates for that link.

        ``p``: the hazard ``(changes + 1) / (decisions + 2)`` over this episode's and
        ``learn``'s decisions; anticipating, once the current link has completed dwells
        (this episode's and learned), the probability that a dwell drawn like them is over
        by the time it has lasted (:func:`_ended_probability`). The candidates: the link before it
        in this episode, else the one that followed it most often before, else every other
        calibrated link.
        """
        key = state["rate"]
        before = state.get("before")
        if before is not None:
            others = [before["value"]]
        elif self.prior_next.get(key):
            follow = max(self.prior_next[key].items(), key=lambda kv: kv[1])[0]
            others = [_rate_value(follow)]
        else:
            others = [r for r in self._links if _rate_key(r) != key]
        hazard = self._hazard(state)
        past = self._dwells_like(state)
        if not self.anticipate or not past:
            return hazard, others
        return _ended_probability(past, now_s - state["since_s"]), others

    def _dwells_like(self, state: dict[str, Any]) -> list[float]:
        """Completed dwells like the current link's: seen in its place before, else any.

        Its place: the how-manieth dwell of that link in the episode this is. A schedule's
        phases need not be alike (a first phase starts unshifted at 0; flaky-link's first
        fast phase lasts 3.5-4.5 s, its later ones 3-5 s), and pooling them all made the
        agent hedge early in the first one. Learned dwells in that place where ``learn``
        saw at least :data:`PLACE_MIN` of them; else every completed dwell of the link,
        this episode's and learned.
        """
        key = state["rate"]
        place = str(len(state["dwells"].get(key, [])))
        alike = self.prior_dwells_by_index.get(key, {}).get(place, [])
        if len(alike) >= PLACE_MIN:
            return list(alike)
        return [*state["dwells"].get(key, []), *self.prior_dwells.get(key, [])]

    # -- learning what the links do -------------------------------------------------
    def _episode_start(self, obs: np.ndarray) -> None:
        self._seen = None
        self._trace_read = False

    def _observe(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: float,
        next_obs: np.ndarray,
        terminated: bool,
        truncated: bool,
        info: dict[str, Any],
    ) -> None:
        start = float(obs[_FIELD["elapsed_frac"]]) * self.budget_s
        rate, posterior = self.read_link(next_obs, self._seen, start)
        if rate == "unknown":
            return
        end = float(next_obs[_FIELD["elapsed_frac"]]) * self.budget_s
        seen = self._observe_reading(self._seen, next_obs, rate, posterior, start, end)
        self.prior_decisions += 1
        trace = getattr(self.env.unwrapped, "link_phases", None)
        if trace is not None and not self._trace_read:
            # the simulator's trace, known whole from the reset: read once an episode is
            # played (``learn(0)`` learns nothing)
            self._learn_trace(trace)
            self._trace_read = True
        if self._seen is not None and seen["rate"] != self._seen["rate"]:
            self.prior_changes += 1
            if trace is None:
                done = self._seen["rate"]
                dwells = seen["dwells"][done]
                self._learn_dwell(done, len(dwells) - 1, dwells[-1])
                self._followed(done, seen["rate"])
        self._seen = seen

    def _learn_dwell(self, key: str, index: int, dwell_s: float) -> None:
        """One completed dwell of link ``key``, its ``index``-th in the episode (from 0)."""
        self.prior_dwells.setdefault(key, []).append(dwell_s)
        self.prior_dwells_by_index.setdefault(key, {}).setdefault(str(index), []).append(dwell_s)

    def _followed(self, done: str, key: str) -> None:
        nxt = self.prior_next.setdefault(done, {})
        nxt[key] = nxt.get(key, 0) + 1

    def _learn_trace(self, phases: list[tuple[float, float | None]]) -> None:
        """Dwells and successions of an episode's whole link trace (the simulator's).

        Every phase that ends within the budget, whether or not the episode got there:
        episodes end at the target, and dwells read only up to it came mostly from the
        first phase, whose start is never shifted (on the held-back variant of
        flaky-link every fast dwell learned lay at 2.7-3.8 s where later ones run
        2.2-3.8 s, and a dense entry was played 2.5 s into one).
        """
        ends = [t for t, _ in phases[1:]]
        count: dict[str, int] = {}
        for (start, rate), end, (_, after) in zip(phases, ends, phases[1:], strict=False):
            key = _rate_key(rate)
            if key != _rate_key(after):
                self._learn_dwell(key, count.get(key, 0), end - start)
                count[key] = count.get(key, 0) + 1
                self._followed(key, _rate_key(after))

    def _get_state(self) -> dict[str, Any]:
        return {
            "prior_dwells": self.prior_dwells,
            "prior_dwells_by_index": self.prior_dwells_by_index,
            "prior_next": self.prior_next,
            "prior_decisions": self.prior_decisions,
            "prior_changes": self.prior_changes,
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        self.prior_dwells = {k: list(v) for k, v in state.get("prior_dwells", {}).items()}
        self.prior_dwells_by_index = {
            k: {i: list(d) for i, d in v.items()}
            for k, v in state.get("prior_dwells_by_index", {}).items()
        }
        self.prior_next = {k: dict(v) for k, v in state.get("prior_next", {}).items()}
        self.prior_decisions = int(state.get("prior_decisions", 0))
        self.prior_changes = int(state.get("prior_changes", 0))


def _ended_probability(dwells: list[float], lasted_s: float) -> float:
    """P(a link's dwell is over after ``lasted_s``), from its completed ``dwells`` (s).

    The smoothed empirical distribution: a Gaussian kernel estimate of the dwells' CDF
    (Silverman's rule-of-thumb bandwidth, at least 10 % of the mean dwell), so a link that
    has lasted nearly as long as the shortest dwell seen is already at risk (a raw share
    is 0 there, and a dense entry's decision on a slow link can cost a whole budget),
    times ``n / (n + 1)``: one more, unseen dwell that lasts longer (the rule of
    succession), so a few dwells never make a change certain.
    """
    n = len(dwells)
    mean = sum(dwells) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in dwells) / max(n - 1, 1))
    bandwidth = max(1.06 * sd * n**-0.2, 0.1 * mean, 1e-6)
    cdf = sum(0.5 * math.erfc((d - lasted_s) / (bandwidth * math.sqrt(2))) for d in dwells) / n
    return cdf * n / (n + 1)


def _scale(state: dict[str, Any] | None) -> float:
    """The episode's speed estimate: the weighted median of its readings (1 without any).

    ``state["scales"]``: ``[implied speed, weight]`` pairs (:meth:`_observe_reading`).
    """
    kept = sorted(state.get("scales") or []) if state else []
    total = sum(w for _, w in kept)
    if total <= 0.0:
        return 1.0
    acc = 0.0
    for value, w in kept:
        acc += w
        if acc >= 0.5 * total:
            return float(value)
    return float(kept[-1][0])


def _rate_key(rate: float | None) -> str:
    """A link's key in the history (``loopback`` or the rate, bit/s, 6 digits)."""
    return "loopback" if rate is None else f"{rate:.6g}"


def _rate_value(key: str) -> float | None:
    """Inverse of the link key of :func:`_observe_link`."""
    return None if key == "loopback" else float(key)


def _observe_link(
    state: Any, rate: float | None, start_s: float, end_s: float, sure: bool = True
) -> dict[str, Any]:
    """The link history with ``rate`` read on the decision from ``start_s`` to ``end_s``.

    ``state`` (None at an episode's start): ``rate`` and ``since_s`` of the current dwell,
    ``open_s`` (the end of the last decision surely read on it: the earliest time it can
    have ended), ``before`` (the rate of the dwell before it), ``dwells`` (rate ->
    completed dwell lengths, s), and the readings (``decisions``) and link changes
    (``changes``) so far, plain values. A new link's dwell starts at the old one's
    ``open_s``: readings too unsure to name a link (:data:`SURE`) can hide the change for
    a few decisions, and dating it at the first sure reading made the new link look
    younger than it was, so a dense entry was played where its dwell was nearly over
    (the held-back variant of flaky-link). With sure readings every decision (the
    probe; the simulator as calibrated) it is the decision's own start.
    """
    key = _rate_key(rate)
    if not state:
        return {
            "rate": key, "value": rate, "since_s": start_s,
            "open_s": end_s if sure else start_s, "read_s": start_s, "before": None,
            "dwells": {}, "decisions": 1, "changes": 0,
        }  # fmt: skip
    if key == state["rate"]:
        out = {**state, "decisions": state["decisions"] + 1, "read_s": start_s}
        if sure:
            out["open_s"] = end_s
        return out
    since = min(state.get("open_s", start_s), start_s)
    dwells = {k: list(v) for k, v in state["dwells"].items()}
    dwells.setdefault(state["rate"], []).append(since - state["since_s"])
    before = {"rate": state["rate"], "value": state["value"]}
    # what is not the link's (the speed readings) carries over
    return {
        **state, "rate": key, "value": rate, "since_s": since, "open_s": end_s,
        "read_s": start_s, "before": before, "dwells": dwells, "decisions": state["decisions"] + 1,
        "changes": state["changes"] + 1,
    }  # fmt: skip
