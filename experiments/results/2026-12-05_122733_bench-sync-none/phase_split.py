"""Where ours' step goes against DDP's, phase by phase (mid-mlp, 2 gloo ranks, loopback, 7 rounds x 30 steps).

``python -m torch.distributed.run --standalone --nproc-per-node 2 phase_split.py``: medians (ms) of DDP's forward, backward
(its all-reduce inside) and optimizer step; ours' forward, backward, ``synchronize()`` (with ``instr``, its
statistics: the gradient norm that is also the non-finite check of ``none``), optimizer + ``after_optimizer_step()``.
"""
import copy, statistics, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from commgym.collectives import CommConfig, GradientSynchronizer
from commgym.env.rank_bench import shard_batches, timed_steps
from commgym.env.workloads import get_workload

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
wl = get_workload("mid-mlp")
torch.manual_seed(0)
base = wl.build_model()
steps, warmup = 30, 5
batches = shard_batches(wl, rank, world, 64, warmup + steps, 0)
import collections
res = collections.defaultdict(list)
for rnd in range(7):
    model = copy.deepcopy(base); opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ddp = DistributedDataParallel(model, bucket_cap_mb=25)
    def ddp_step(x, y):
        a = time.perf_counter(); opt.zero_grad(); loss = wl.loss_fn(ddp(x), y); b = time.perf_counter()
        loss.backward(); c = time.perf_counter(); opt.step(); d = time.perf_counter()
        return b - a, c - b, d - c
    t, outs = timed_steps(batches, warmup, ddp_step); res["ddp"] += t
    res["d_fwd"] += [o[0] for o in outs]; res["d_bwd+ar"] += [o[1] for o in outs]; res["d_opt"] += [o[2] for o in outs]
    del ddp
    model = copy.deepcopy(base); opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sync = GradientSynchronizer(model, CommConfig("none", bucket_mb=25), error_every=0)
    def step(x, y):
        a = time.perf_counter(); opt.zero_grad(); loss = wl.loss_fn(model(x), y); b = time.perf_counter()
        loss.backward()
        s0 = time.perf_counter(); st = sync.synchronize(); s1 = time.perf_counter()
        opt.step(); sync.after_optimizer_step(); s2 = time.perf_counter()
        return st.instrumentation_s, s1 - s0, s2 - s1, b - a, s0 - b
    t, outs = timed_steps(batches, warmup, step); res["ours"] += t
    res["instr"] += [o[0] for o in outs]; res["sync"] += [o[1] for o in outs]; res["opt"] += [o[2] for o in outs]
    res["o_fwd"] += [o[3] for o in outs]; res["o_bwd"] += [o[4] for o in outs]
    sync.remove_hooks()
if rank == 0:
    med = {k: statistics.median(v) * 1e3 for k, v in res.items()}
    print(" ".join(f"{k} {v:.2f} ms" for k, v in med.items()))
dist.destroy_process_group()
