"""GradScaler under CommScheduler: one verdict on every rank, under every period (issue 21).

An inf on one rank while ``sync_period > 1`` used to make only that rank skip the step
and halve its scale; the scales stayed apart for good and, back at period 1, every rank
unscaled the same synchronised gradient by its own scale, so the replicas drifted at
every step. Now the found-inf flag is reduced across ranks on local-SGD steps: every rank
skips together, and scale and growth tracker are equal on every rank at every step.
"""

from __future__ import annotations

import pytest

from tests.agents.loops import Loop, check_loop, run_loop

#: The issue's scenario: period 2 for the first decision, an inf on the last rank at
#: step 1 (a local step), then period 1 for the rest of the job.
SCENARIO = Loop(
    scaler=1024.0,
    policy=("schedule", ((0, 1, 0),)),  # none / 25 MB / H1 from the first decision on
    initial=(0, 1, 1),  # none / 25 MB / H2 before it
    decision_every=2,
    steps=8,
)


@pytest.mark.parametrize("path", ["plain", "ddp"])
def test_inf_on_one_rank_under_local_sgd_skips_everywhere(dist_any, path):
    world = dist_any.world_size
    loop = Loop(**{**SCENARIO.__dict__, "world_size": world, "path": path, "bad": (1, world - 1)})
    results = dist_any.run(run_loop, loop)
    check_loop(loop, results)  # replicas, scales and skips agree at every step
    for r in results:
        trace = r["run"]["trace"]
        # the configuration after each step: H2 until the decision at the end of step 1
        assert trace[0]["config"].endswith("/H2") and not trace[1]["synced"]
        assert all(s["config"].endswith("/H1") and s["synced"] for s in trace[2:])
        assert [s["stepped"] for s in trace[:3]] == [True, False, True]
        # growth_interval=2: one good step (1024), the inf halves it, two more double it
        assert [s["scaler"][0] for s in trace[:4]] == [1024.0, 512.0, 512.0, 1024.0]
    assert len({r["run"]["trace"][-1]["params"] for r in results}) == 1
