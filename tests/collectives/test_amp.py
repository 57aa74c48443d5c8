"""agree_found_inf: a GradScaler's verdict reduced across ranks on local-SGD steps (gloo)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from commgym.collectives import CommConfig, GradientSynchronizer
from commgym.collectives.amp import agree_found_inf
from tests.collectives.test_synchronizer import _batch, mlp


def rank_agree(rank, world):
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sync = GradientSynchronizer(model, CommConfig("none", sync_period=2), optimizer=opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
    out = []
    for step in range(4):
        opt.zero_grad(set_to_none=True)
        x, y = _batch(rank, step)
        if step == 1 and rank == 0:
            x[0, :] = float("inf")
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        sync.synchronize()
        found = agree_found_inf(scaler, opt)  # unscales first (stage READY)
        scaler.step(opt)
        scaler.update()
        sync.after_optimizer_step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        rows = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(rows, flat)
        out.append((found, scaler.get_scale(), all(torch.equal(r, rows[0]) for r in rows)))
    disabled = torch.amp.GradScaler("cpu", enabled=False)
    out.append(agree_found_inf(disabled, opt))  # no collective, nothing found
    return out


def test_agree_found_inf_with_the_plain_synchronizer(dist_any):
    for out in dist_any.run(rank_agree):
        assert [o[0] for o in out[:4]] == [False, True, False, False]
        assert [o[1] for o in out[:4]] == [64.0, 32.0, 32.0, 32.0]
        # averaged after steps 2 and 4 (period 2): identical there
        assert out[1][2] and out[3][2]
        assert out[4] is False


def test_agree_found_inf_refuses_other_scalers():
    with pytest.raises(TypeError, match="GradScaler"):
        agree_found_inf(object(), torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1))
