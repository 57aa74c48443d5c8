"""The commands of README.md and docs/ and how the default suite runs each of them: ONE table.

:func:`readme_commands` reads every command line README.md and the pages of docs/ show
(:data:`PAGES`, in that order): each line of their
``bash`` code blocks (``\\`` continuations joined, ``&&`` chains split, comments dropped)
and each inline code span in its prose that starts with a program (``commgym ...``,
``torchrun ...``, ``python -m ...``, ``pip ...``, ``VAR=... torchrun ...``).
:func:`help_commands` reads the ``commgym ...`` spans of every command's ``--help``.
:data:`COMMANDS` says, for each of them as written, how CI runs it:

* :class:`Run`: the command as written plus size flags appended (a later flag wins, so
  ``--seeds 5`` becomes ``--seeds 1``): the same command and code path, small. A span's
  ``a|b|c`` alternatives are run one by one, its ``[...]`` optional parts once without and
  once with all of them (:func:`expand`).
* :class:`RunBy`: a command with placeholders (``<cluster.authkey_hex>``) that a named
  test fills in and runs, reading the template from the README through this module.
* :class:`Mention`: a command's name in prose (a heading, "the recipe of `commgym
  train`"), whose runnable form is another key of the table.
* :class:`NotInCI`: cannot run in the default suite; the reason says why. A recorded run's
  command (its figures live in an experiments/results/ record, reproduced by its run.json)
  names the tests that run its code path small.

``tests/experiments/test_readme_commands.py`` fails when the README shows a command this
table lacks (or the table keeps one the README dropped), and runs every :class:`Run` row in
README order, commands that feed each other in one working folder, as a newcomer would:
``commgym train`` leaves the ``commgym-out/policy.zip`` that ``commgym evaluate --policy
commgym-out/policy.zip`` reads.
Adding a command to the README is adding one line here.

The Python snippets of the README are in :data:`SNIPPETS` (keyed by a line each contains),
run the same way or by their script twin.
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
#: The pages whose commands the suite runs: the README, then the manual's pages.
PAGES = (README, *sorted((REPO / "docs").glob("*.md")))


@dataclass(frozen=True)
class Run:
    """Run the command as written, ``flags`` appended.

    A form with ``--network`` (or any form of a ``shaped`` command) emulates a network:
    it needs root, namespaces and tc. Without them a form with ``--network SPEC`` runs
    without it, on unshaped loopback links (the same command otherwise); a ``shaped``
    command, whose links are what it is about, is skipped with the reason.

    Attributes:
        flags: size flags appended to the command (a later flag wins); ``{port}`` is
            filled with a free port, ``{repo}`` with the checkout's root.
        shaped: the command emulates a network even without ``--network`` (a shaped
            scenario, ``bench netem``).
        server: it serves until stopped (``commgym ui``): the test waits for its ready
            line, checks what it serves, then stops it with SIGTERM.
        after: keys whose commands must have run first (their outputs are its inputs).
        expect: text the command's output must contain.
        needs: a Python module the command needs beyond the test install (``ray``, the
            ``commgym[ray]`` extra): where it is missing the command is skipped with the
            reason (CI installs it, .ci/run).
    """

    flags: str = ""
    shaped: bool = False
    server: bool = False
    after: tuple[str, ...] = ()
    expect: tuple[str, ...] = ()
    needs: str = ""

    def needs_network(self, form: str) -> bool:
        """Whether ``form`` (one of :func:`expand`'s) emulates a network."""
        return self.shaped or "--network" in form.split()


@dataclass(frozen=True)
class RunBy:
    """Run by ``test`` (``path::name``), which fills the placeholders of the README's text."""

    test: str


@dataclass(frozen=True)
class Mention:
    """A command named in prose; ``of`` is the key of its runnable form."""

    of: str


@dataclass(frozen=True)
class NotInCI:
    """Not run by the default suite, for ``reason``."""

    reason: str


#: Options that say what a command is (scenario, agents, model, network, ...): size flags may
#: not set one that the command as written sets (a later flag would win and swap it).
IDENTITY = (
    "--config", "--scenarios", "--agent", "--agents", "--policy", "--policy-dir", "--baselines",
    "--workload", "--world-size", "--network", "--model", "--compressors", "--profiles",
    "--data", "--bench", "--holdout", "--out", "--fit", "--surrogate",
)  # fmt: skip

#: Size flags of one short real episode (decisions end at the budget or the cap).
EPISODE = "--time-budget-s 0.5 --max-decisions 3"
#: Size flags of the surrogate recipe: few recorded decisions, one PPO rollout on it.
RECIPE = "--surrogate-decisions 16 --timesteps 256"
#: The smoke scenario of the leaderboard commands, and one seed.
BOARD = "--scenarios {repo}/tests/experiments/smoke-board.yaml --seeds 1"
#: The README's single-host Ray cluster (started, used by evaluate, stopped).
RAY_HEAD = (
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head --node-ip-address 127.0.0.1 "
    "--num-cpus 4 --include-dashboard false"
)
MULTI_HOST = (
    "a cluster of several hosts; the same path runs on two Ray nodes of this machine in "
    "tests/experiments/test_executor.py::test_a_sweep_lands_on_both_nodes_of_a_two_node_cluster"
)
RAY_CLUSTER = (
    "a Ray head started with `ray start` must be stopped with `ray stop`, which stops every Ray "
    "instance on the host (other jobs' too); the same path, --ray-address of a running "
    "cluster on loopback, runs in tests/experiments/test_executor.py::"
    "test_ray_address_joins_a_running_cluster_on_loopback (these three lines ran by hand "
    "on 2026-12-01: 12 episodes on 1 Ray node, then ray stop)"
)
SLURM = "a SLURM allocation of several hosts (Ray's own recipe); " + MULTI_HOST
#: The headroom scenarios, small: one seed, one decision of one step per episode (a 4-step
#: decision of the dense all-reduce takes ~20 s on their 10 Mbit/s link), two tuning decisions.
HEADROOM = (
    "--seeds 1 --steps-per-decision 1 --time-budget-s 0.5 --max-decisions 1 --tuning-decisions 2"
)

#: Why the replication recipe's commands are not run as written.
REPLICATION = (
    "a headline measurement (two 8-seed invocations of flaky-link with rollout-table, about "
    "an hour each on this machine); its paths run small in the flaky-link row, "
    "tests/experiments/test_leaderboard.py and tests/experiments/test_pooling.py"
)

#: Why the per-condition recipe (docs/headroom.md) is not run as written.
PER_CONDITION = (
    "a recorded run (experiments/results/2026-12-02_busy-link-per-condition): two shaped "
    "oracle-static searches of busy-link's whole menu under 4 cross-traffic flows; its paths "
    "run small in tests/experiments/test_cli_options.py::"
    "test_leaderboard_cross_traffic_holds_one_condition_of_a_scenario (the held condition), "
    "tests/env/test_cross_traffic.py (cross traffic on real ranks), the flaky-link row "
    "(oracle-static's search on a shaped link and its static-entries CSV) and "
    "tests/experiments/test_headroom.py::test_command_prints_the_table_and_the_bound "
    "(headroom-bound on two static-entries CSVs)"
)
#: One scenario's per-condition rankings, which ``commgym headroom-bound`` reads.
PER_CONDITION_QUIET = (
    "commgym leaderboard --scenarios busy-link --agents oracle-static --seeds 2 "
    "--cross-traffic off --output-dir quiet"
)
PER_CONDITION_BUSY = (
    "commgym leaderboard --scenarios busy-link --agents oracle-static --seeds 2 "
    "--cross-traffic 4flows --output-dir busy"
)

#: A benchmark recorded (docs/quickstart.md), the record that ``commgym results index`` reads.
RECORD = "commgym bench kernels --repeats 15 --record experiments/results/"

#: The surrogate section's recording commands, whose files the later ones read.
COLLECT = "commgym collect --decisions 400 --fit commgym-out/surrogate.joblib"
HOLDOUT = "commgym collect --decisions 200 --seed 7 --no-bench --out commgym-out/holdout.csv"

#: Every command the README (or a --help text) shows, as written, and how CI runs it.
COMMANDS: dict[str, Run | RunBy | Mention | NotInCI] = {
    "pip install torch==2.13.0 -e .": NotInCI(
        "installs into the environment running the tests; .ci/run installs the same package "
        "(with the test extras) before the suite"
    ),
    "commgym train": Run(
        f"{RECIPE} --episodes 1 {EPISODE}",
        expect=("policy saved to commgym-out/policy.zip", "ppo (learned)", "sim-to-real gap"),
    ),
    "commgym ui": Run("--port {port}", server=True, after=("commgym train",)),
    'pip install torch==2.13.0 -e ".[dev,kernels]"': NotInCI(
        "installs into the environment running the tests: .ci/run runs it before the suite"
    ),
    "python -m pytest": NotInCI("the default suite itself (.ci/run runs exactly this)"),
    "commgym leaderboard": Run(BOARD, expect=("oracle-static (oracle)", "ppo (learned)")),
    "commgym leaderboard --scenarios slow-link --agents ppo,autotune,static:ddp-default "
    "--seeds 5": NotInCI(
        "a recorded run (experiments/results/2026-12-01_leaderboard-four-scenarios); its paths "
        "run small in tests/experiments/test_scenarios.py::test_scenario_runs_two_decisions"
        "[slow-link] (the scenario's links on real ranks), tests/experiments/test_leaderboard.py "
        "(ppo by the surrogate recipe, autotune and static players on one board) and the "
        "flaky-link row (a leaderboard on a shaped scenario)"
    ),
    "commgym leaderboard --scenarios flaky-link --agents rollout-table,oracle-static,"
    "oracle-adaptive,autotune:progress --seeds 5": Run(
        # the headroom path once, small: rollout-table trained on the shaped link (its own
        # training seeds), both oracles' searches, the headroom lines and the per-condition
        # table; the recorded runs of this and the other headroom scenarios are reproduced by
        # their run.json (experiments/results/), not here
        HEADROOM,
        shaped=True,
        expect=("rollout-table: trained in", "oracle-adaptive searched", "Adaptation:"),
    ),
    # the replication recipe (docs/headroom.md): a recorded headline's two invocations and
    # their pooling; the leaderboard path runs small in the flaky-link row above, --eval-seed
    # in test_config/test_leaderboard, and `commgym pool` in tests/experiments/test_pooling.py
    "commgym leaderboard --scenarios flaky-link --agents rollout-table,oracle-static,"
    "oracle-adaptive,best-static --seeds 8 --output-dir run-a": NotInCI(REPLICATION),
    "commgym leaderboard --scenarios flaky-link --agents rollout-table,oracle-static,"
    "oracle-adaptive,best-static --seeds 8 --eval-seed 1008 --output-dir run-b": NotInCI(
        REPLICATION
    ),
    "commgym pool --runs run-a,run-b": NotInCI(REPLICATION),
    PER_CONDITION_QUIET: NotInCI(PER_CONDITION),
    PER_CONDITION_BUSY: NotInCI(PER_CONDITION),
    "commgym headroom-bound --conditions quiet=quiet/busy-link/static-entries-busy-link.csv,"
    "busy=busy/busy-link/static-entries-busy-link.csv": NotInCI(PER_CONDITION),
    "commgym leaderboard --scenarios flaky-link --agents ppo@flaky-link-clock,"
    "mpc@flaky-link-board,rollout-table,oracle-static,oracle-adaptive,best-static "
    "--seeds 8": NotInCI(
        "a flaky-link board of about an hour of 4 shaped ranks plus the clock recipe's "
        "simulator calibration (5-10 minutes of real ranks), and it reads a user's "
        "flaky-link-board.yaml; the NAME@RECIPE form runs small in tests/experiments/"
        "test_leaderboard.py::test_policy_dir_loads_the_saved_policy_instead_of_training (a "
        "recipe-trained ppo beside a loaded one), its refusals in "
        "test_bad_input_fails_before_anything_runs and "
        "test_agent_labels_refuse_what_cannot_be_a_row"
    ),
    "commgym leaderboard --agents ppo --seeds 1 --output-dir policies": Run(BOARD),
    "commgym leaderboard --policy-dir policies --output-dir board": Run(
        BOARD,
        after=("commgym leaderboard --agents ppo --seeds 1 --output-dir policies",),
        expect=("ppo: loaded",),
    ),
    COLLECT: Run("--decisions 24"),
    HOLDOUT: Run("--decisions 12"),
    "commgym fit-surrogate --data commgym-out/transitions.csv --bench "
    "commgym-out/transitions.bench.json --holdout commgym-out/holdout.csv --out "
    "commgym-out/surrogate.joblib": Run(
        after=(COLLECT, HOLDOUT),
        expect=("held-out step time: MAPE", "noise floor"),
    ),
    "commgym train --config surrogate": Run(
        f"--timesteps 256 --episodes 1 {EPISODE}",
        after=(COLLECT,),
        expect=("sim-to-real gap",),
    ),
    "commgym bench surrogate --surrogate commgym-out/surrogate.joblib": Run(
        "--steps 500",
        after=(COLLECT,),
        expect=("env steps/s",),
    ),
    "commgym train --config flaky-link --env sim": NotInCI(
        "calibrates the simulator on real ranks first (about 7 minutes on this machine); the "
        "same path, a tiny calibration then `commgym train --env sim --calibration`, runs in "
        "tests/experiments/test_train_sim.py"
    ),
    "commgym train --config flaky-link-ppo": NotInCI(
        "1,000,000 simulated decisions (about half an hour with SB3's per-step overhead) then "
        "the real evaluation; the path (--env sim, a recipe's agent_kwargs) runs in "
        "tests/experiments/test_train_sim.py, the file loads in tests/experiments/"
        "test_config.py::test_every_agent_resolves_in_every_shipped_scenario"
    ),
    "commgym train --config flaky-link-bc": NotInCI(
        "the calibration's real ranks, a minute of cloning and 50,000 simulated PPO decisions, "
        "then the real evaluation; the warm start's path (sim_warm_start through learn_agent) "
        "runs in tests/experiments/test_train_sim.py::"
        "test_sim_warm_start_clones_the_reactive_oracle_before_rl, the cloning itself in "
        "tests/agents/test_imitation.py"
    ),
    "commgym train --config flaky-link-clock": NotInCI(
        "the calibration's real ranks (or --calibration), 13 s of cloning mpc in the simulator, "
        "then 24 real episodes of 4 ranks on an emulated network (root, about 9 minutes); the "
        "path (sim_warm_start with expert mpc, link_clock) runs in tests/experiments/"
        "test_train_sim.py::test_sim_warm_start_clones_mpc_into_a_policy_with_a_link_clock, "
        "the clock in tests/agents/test_features.py"
    ),
    "commgym train --config link-lottery-bc": NotInCI(
        "the calibration's real ranks, a minute of cloning and 50,000 simulated PPO decisions, "
        "then 32 real episodes (about 13 minutes: each 10 Mbit/s decision's held-out evaluation "
        "crosses the slow link); the blind opening runs in tests/agents/test_imitation.py::"
        "test_where_each_episode_draws_its_link_the_reactive_player_opens_blind, obs_fields in "
        "tests/agents/test_sb3_history.py, the warm start's path in tests/experiments/"
        "test_train_sim.py"
    ),
    "commgym train --config link-lottery-probe": NotInCI(
        "link-lottery-bc's run (minutes of real ranks) with one probe per job; the probe at "
        "reset runs in tests/env/test_conditions.py::"
        "test_a_probe_at_reset_runs_once_and_starts_the_episodes_clock (real ranks), "
        "tests/env/test_sim.py::test_a_probe_at_reset_as_the_real_env and in replay "
        "tests/agents/test_scheduler.py::"
        "test_a_policy_trained_with_one_probe_at_reset_gets_it_at_construction"
    ),
    "commgym calibrate-sim --config flaky-link": NotInCI(
        "4 real ranks for about 4 minutes; the same calibrate_sim on a tiny setting is the "
        "session fixture tiny_calibration (tests/conftest.py), the command's record option is "
        "checked by tests/experiments/test_records.py"
    ),
    "commgym calibrate-sim --refit-switches OLD.json --out NEW.json": RunBy(
        "tests/env/test_sim_calibration.py::"
        "test_refit_switches_refits_from_the_kept_episodes_without_ranks"
    ),
    "commgym bench sim --scenario link-lottery": NotInCI(
        "its real reference runs take about 32 minutes of 4 ranks; the command on cached real "
        "runs: tests/env/test_sim_gates.py::"
        "test_bench_sim_command_on_cached_runs_records_its_gates"
    ),
    "commgym": Mention("commgym train --help"),
    "commgym headroom-bound": NotInCI(
        "the command's name in prose; its one form in the docs is the per-condition recipe: "
        + PER_CONDITION
    ),
    "commgym replay": Mention(
        "commgym replay --policy commgym-out/policy.zip --workload mlp-digits --world-size 2 "
        "[--network 100mbit] [--target-loss 0.2]"
    ),
    "commgym evaluate --policy commgym-out/policy.zip --baselines random,static:ddp-default,"
    "static:none/25MB/H4,static:fp16/25MB/H4,static:topk:0.01/25MB/H4 --episodes 5": Run(
        "--episodes 1 --time-budget-s 0.5", after=("commgym train",)
    ),
    # learning on real ranks (--config real): the bayesopt row below runs that scenario, and
    # tests/experiments/test_agents_train.py trains ppo (every agent) on real ranks
    "commgym train --config real": Mention(
        "commgym train --config real --agent bayesopt --workload cnn-digits --world-size 4 "
        "--timesteps 500"
    ),
    "commgym train --config real --agent bayesopt --workload cnn-digits --world-size 4 "
    "--timesteps 500": Run(
        f"--timesteps 8 --episodes 1 {EPISODE}",
        expect=("bayesopt (learned)", "cnn-digits, 4 ranks"),
    ),
    "commgym train --help": Run(expect=("--agent", "--network")),
    "commgym evaluate --policy commgym-out/policy.zip --baselines static:ddp-default,"
    "static:fp16-dense,bayesopt --episodes 5 [--network 100mbit]": Run(
        "--episodes 1 --time-budget-s 0.5 --tuning-decisions 2",
        after=("commgym train",),
    ),
    "commgym evaluate --policy commgym-out/policy.zip": Mention(
        "commgym evaluate --policy commgym-out/policy.zip --baselines static:ddp-default,"
        "static:fp16-dense,bayesopt --episodes 5 [--network 100mbit]"
    ),
    "commgym evaluate --baselines": Mention(
        "commgym evaluate --policy commgym-out/policy.zip --baselines static:ddp-default,"
        "static:fp16-dense,bayesopt --episodes 5 [--network 100mbit]"
    ),
    "torchrun --nproc-per-node 2 experiments/examples/train_real_loop.py --policy "
    "commgym-out/policy.zip --checkpoint-dir ckpt": Run(
        "--steps 20",
        after=("commgym train",),
        expect=("parameters identical across 2 ranks: True",),
    ),
    "commgym replay --policy commgym-out/policy.zip --workload mlp-digits --world-size 2 "
    "[--network 100mbit] [--target-loss 0.2]": Run(
        "--steps 6 --time-budget-s 1", after=("commgym train",)
    ),
    "commgym bench sync": Mention(
        "commgym bench sync --compressors fp16,bf16,int8,randomk:0.01,topk:0.01,powersgd:4"
    ),
    "commgym bench sync --compressors fp16,bf16,int8,randomk:0.01,topk:0.01,powersgd:4": Run(
        "--steps 3 --warmup 0 --rounds 1", expect=("torch DDP",)
    ),
    "commgym bench sync --network 1gbit --model wide-mlp --compressors int8,topk:0.01,powersgd:4 "
    "--steps 10 --warmup 2 --rounds 2": Run("--steps 3 --warmup 0 --rounds 1"),
    "commgym bench sync --compressors none --steps 100": Run("--steps 3 --warmup 0 --rounds 1"),
    "commgym bench env": Mention("commgym bench env --decisions 40"),
    "commgym bench env --decisions 40": Run("--decisions 4", expect=("overhead",)),
    "commgym bench env --workload mid-mlp --world-size 4 --steps-per-decision 4 --decisions 24 "
    "--network 100mbit": NotInCI(
        "a recorded run (experiments/results/2026-12-06_181209_bench-env, 4 ranks of mid-mlp on "
        "a shaped link, ~50 s); its path runs small in tests/experiments/test_bench_env.py::"
        "test_bench_env_on_an_emulated_link (2 ranks on 1 Gbit/s)"
    ),
    "commgym bench netem": Run(
        "--profiles wan-100m --world-sizes 2 --sizes-mb 1 --repeats 1", shaped=True
    ),
    "commgym bench netem --profiles 10mbit,100mbit,1gbit --world-sizes 4 --sizes-mb "
    "0.0625,1,16 --repeats 3": Run("--sizes-mb 0.0625 --repeats 1", shaped=True),
    "commgym collect": Mention(COLLECT),
    "commgym fit-surrogate": Mention(
        "commgym fit-surrogate --data commgym-out/transitions.csv --bench "
        "commgym-out/transitions.bench.json --holdout commgym-out/holdout.csv --out "
        "commgym-out/surrogate.joblib"
    ),
    "commgym bench surrogate": Mention(
        "commgym bench surrogate --surrogate commgym-out/surrogate.joblib"
    ),
    "commgym bench collectives": Run("--sizes-kb 4,64 --repeats 1"),
    "python -m pytest -m expensive tests/agents/test_fuzz_training_loops.py": NotInCI(
        "the fuzzer's long budget (COMMGYM_FUZZ_EXAMPLES fresh loops per property, tens of "
        "minutes); the default suite runs its fixed examples"
    ),
    "python -m pytest -m expensive tests/env/test_surrogate.py": NotInCI(
        "the expensive tests: timing targets that need an otherwise idle machine and minutes; "
        "the default suite deselects them by design"
    ),
    "commgym bench surrogate-holdout --data T.csv --bench T.bench.json --config mixed-links "
    "--holdout-rate 0.5 --holdout-every 4 --holdout-configs 0.2": NotInCI(
        "needs ~200 real decisions of mixed-links (4 ranks on three shaped link rates, minutes, "
        "root); the same fit and hold-out report run in tests/env/test_surrogate_network.py "
        "(synthetic rates; real ones in its expensive test)"
    ),
    "commgym bench kernels": Mention("commgym bench kernels --repeats 15"),
    "commgym bench kernels --repeats 15": Run("--repeats 1 --sizes-mb 1"),
    # -- Beyond one machine (the commgym[ray] extra; .ci/run installs it) --------------
    'pip install torch==2.13.0 -e ".[ray]"': NotInCI(
        "an install line: .ci/run installs the ray extra before the test command"
    ),
    "commgym leaderboard --scenarios default --agents static:ddp-default,static:fp16-dense "
    "--seeds 2 --executor ray": NotInCI(
        "the same command on a smaller scenario (a leaderboard with --executor ray, joining a "
        "two-node Ray cluster on loopback with --ray-address) runs in "
        "tests/experiments/test_executor.py::"
        "test_leaderboard_on_ray_gives_the_local_rows_and_runs, which also compares its rows "
        "with the local executor's; a second Ray instance here would repeat that path"
    ),
    RAY_HEAD: NotInCI(RAY_CLUSTER),
    "commgym evaluate --policy commgym-out/policy.zip --executor ray --ray-address auto": NotInCI(
        RAY_CLUSTER
    ),
    "ray stop": NotInCI(RAY_CLUSTER),
    "ray start --head --port 6379": NotInCI(MULTI_HOST),
    "ray start --address HEAD_IP:6379": NotInCI(MULTI_HOST),
    "commgym leaderboard --executor ray --ray-address auto --policy-dir policies": NotInCI(
        MULTI_HOST
    ),
    'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST")); head=${nodes[0]}': NotInCI(SLURM),
    'head_ip=$(srun --nodes=1 --ntasks=1 -w "$head" hostname --ip-address)': NotInCI(SLURM),
    'srun --nodes=1 --ntasks=1 -w "$head" ray start --head --node-ip-address="$head_ip" '
    "--port=6379 --block &": NotInCI(SLURM),
    "sleep 10": NotInCI(SLURM),
    'for node in "${nodes[@]:1}"; do': NotInCI(SLURM),
    'srun --nodes=1 --ntasks=1 -w "$node" ray start --address="$head_ip:6379" --block &': NotInCI(
        SLURM
    ),
    "done": NotInCI(SLURM),
    'commgym leaderboard --executor ray --ray-address "$head_ip:6379"': NotInCI(SLURM),
    "commgym bench executor": Mention(
        "commgym bench executor --config default --episodes 8 --actors 1,2"
    ),
    "commgym bench executor --config default --episodes 8 --actors 1,2": Run(
        "--episodes 2 --actors 1", needs="ray"
    ),
    "pytest -m gpu": NotInCI("needs an NVIDIA GPU; CI machines have none (the gpu tests skip)"),
    "torchrun --standalone": Mention("commgym train"),
    "torchrun --standalone --nproc-per-node W": Mention("commgym train"),
    "commgym netem cleanup": Run(expect=("leftover",)),
    # -- recording runs (docs/quickstart.md): records go to the lane's folder, not the checkout
    RECORD: Run("--repeats 1 --sizes-mb 1 --record records", expect=("recorded: records/",)),
    "commgym results index": Run("--dir records", after=(RECORD,), expect=("1 records",)),
    "python -m pytest -m expensive": NotInCI(
        "the expensive tests by design: idle-machine timing targets, long fuzzing budgets and "
        "the long variants of default tests (their module docstrings name them)"
    ),
    "COMMGYM_AUTHKEY=<cluster.authkey_hex> torchrun --nnodes N --nproc-per-node P --rdzv-backend "
    "c10d --rdzv-endpoint HOST:PORT -m commgym.env.worker --control <env "
    "host>:<cluster.control_address port>": RunBy(
        "tests/env/test_launch_config.py::test_ranks_started_by_the_user_get_the_config"
    ),
}

#: The README's Python snippets, by a line each contains: how CI runs it.
SNIPPETS: dict[str, str] = {
    "env = gymnasium.make(": "run as written (2 ranks, one decision)",
    "sched = CommScheduler(": (
        "twin: experiments/examples/train_real_loop.py (README command above; "
        "tests/experiments/test_example_real_loop.py)"
    ),
    "sync = GradientSynchronizer(": "run on 2 gloo ranks with a model, optimizer and loader",
    "state, hook = ddp_comm_hook(": "run on 2 gloo ranks with a DDP model",
    "from ray.cluster_utils import Cluster": (
        "twin: tests/experiments/test_executor.py::"
        "test_a_sweep_lands_on_both_nodes_of_a_two_node_cluster (the same two Ray nodes on "
        "loopback and a sweep whose episodes land on both)"
    ),
}

#: Programs a command line may start with (after ``VAR=value`` assignments).
PROGRAMS = ("commgym", "torchrun", "python", "pytest", "pip", "mlflow")
_COMMAND = re.compile(r"^(?:[A-Z][A-Z0-9_]*=\S+\s+)*(?:" + "|".join(PROGRAMS) + r")(?:\s|$)")


def _code_spans(markdown: str) -> list[str]:
    """Inline code spans of ``markdown``'s prose (fenced blocks removed), whitespace folded."""
    prose = re.sub(r"^```.*?^```[ \t]*$", "", markdown, flags=re.S | re.M)
    spans = []
    for paragraph in re.split(r"\n[ \t]*\n", prose):  # a span never crosses a paragraph
        spans += [" ".join(m.split()) for m in re.findall(r"`([^`]+)`", paragraph)]
    return spans


def _block_commands(markdown: str) -> list[str]:
    """Command lines of the ``bash``/``sh`` blocks: continuations joined, comments dropped."""
    out = []
    for lang, body in re.findall(r"^```(\w*)[ \t]*\n(.*?)^```", markdown, flags=re.S | re.M):
        if lang not in ("bash", "sh", "shell", "console"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            code = re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()  # comments dropped
            out += [" ".join(part.split()) for part in code.split("&&") if part.strip()]
    return out


def readme_commands(markdown: str | None = None) -> list[str]:
    """Every command README.md and docs/ show (or ``markdown``), as written, first seen first."""
    texts = [page.read_text() for page in PAGES] if markdown is None else [markdown]
    found = []
    for text in texts:
        found += _block_commands(text) + [s for s in _code_spans(text) if _COMMAND.match(s)]
    return list(dict.fromkeys(found))


def help_commands() -> list[str]:
    """The ``commgym ...`` spans of every ``commgym`` command's ``--help``."""
    import click
    from typer.main import get_command
    from typer.testing import CliRunner

    from commgym.experiments.cli import app

    def paths(cmd: click.Command, prefix: list[str]) -> list[list[str]]:
        subs = getattr(cmd, "commands", {})
        return [prefix] + [p for name, sub in subs.items() for p in paths(sub, [*prefix, name])]

    found = []
    for path in paths(get_command(app), []):
        res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "2000", "TERM": "dumb"})
        found += [s for s in _code_spans(res.output) if _COMMAND.match(s)]
    return list(dict.fromkeys(found))


def python_snippets(markdown: str | None = None) -> list[str]:
    """The ``python`` code blocks of README.md and docs/ (or of ``markdown``)."""
    texts = [page.read_text() for page in PAGES] if markdown is None else [markdown]
    block = r"^```python[ \t]*\n(.*?)^```"
    return [c for t in texts for c in re.findall(block, t, flags=re.S | re.M)]


def expand(command: str) -> list[str]:
    """The runnable forms of a command as written.

    A word ``a|b|c`` gives one command per alternative; ``[...]`` optional parts give the
    command without them and with all of them.
    """
    optional = re.findall(r"\[([^\]]+)\]", command)
    bare = " ".join(re.sub(r"\[[^\]]+\]", " ", command).split())
    forms = [bare] + ([" ".join(command.replace("[", "").replace("]", "").split())]
                      if optional else [])  # fmt: skip
    out = []
    for form in forms:
        words = [w.split("|") if "|" in w else [w] for w in form.split()]
        out += [" ".join(choice) for choice in itertools.product(*words)]
    return out


def argv(command: str, flags: str = "") -> list[str]:
    """``command`` plus ``flags`` as an argument list (shell quoting as a shell reads it)."""
    return shlex.split(command) + shlex.split(flags)


def template(key_part: str) -> str:
    """The one command of README.md and docs/ containing ``key_part`` (tests that fill
    placeholders read it)."""
    matches = [c for c in readme_commands() if key_part in c]
    if len(matches) != 1:
        raise LookupError(f"{len(matches)} README commands contain {key_part!r}: {matches}")
    return matches[0]


def fill(command: str, values: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """A template command with its placeholders replaced: ``(environment, argv)``.

    Args:
        command: the README's text (:func:`template`).
        values: placeholder -> value; a placeholder is replaced where it stands as a whole
            word or a ``<...>`` part.

    Returns:
        The ``VAR=value`` assignments before the program, and the argument list (the
        program as written: callers map ``torchrun`` to their interpreter's).

    Raises:
        ValueError: a ``<...>`` placeholder is left unfilled.
    """
    for name, value in values.items():
        pattern = re.escape(name) if name.startswith("<") else rf"(?<!\S){re.escape(name)}(?!\S)"
        command = re.sub(pattern, value, command)
    if re.search(r"<[^>]*>", command):
        raise ValueError(f"unfilled placeholder in {command!r}")
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"[A-Z][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def snippet(key: str) -> str:
    """The python block of README.md or docs/ containing ``key`` (a :data:`SNIPPETS` key)."""
    (code,) = [c for c in python_snippets() if key in c]
    return code
