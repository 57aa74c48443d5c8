r"""A realistic training loop with a commgym policy: what a DDP user's script looks like.

A 3-block CNN with BatchNorm on scikit-learn digits, AdamW, cosine learning rate with
warm-up, gradient accumulation over micro-batches, gradient clipping after
``synchronize()``, bf16 autocast and per-rank checkpoints with bit-identical resume.
Launch (two gloo ranks on CPU)::

    torchrun --nproc-per-node 2 experiments/examples/train_real_loop.py \\
        --policy static:int8/4MB/H1 --steps 60 --checkpoint-dir ckpt

Stop it (``--stop-after 30`` simulates a kill after a checkpoint) and run the same
command again: every rank loads its own checkpoint and the run continues exactly as if
it had not stopped. Rank 0 prints the decisions and, at the end, the held-out loss and
accuracy; every rank checks that all ranks hold identical parameters.

.. warning:: a stable-baselines3 policy file is a pickle: loading one from an untrusted
   source can execute arbitrary code.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

from commgym.agents.scheduler import CommScheduler, DecisionRecord


class DigitsCNN(nn.Module):
    """Three conv + BatchNorm blocks on 1x8x8 digits, global pooling, a linear head."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()

        def block(c_in: int, c_out: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out),
                                 nn.ReLU())  # fmt: skip

        self.features = nn.Sequential(
            block(1, width), block(width, 2 * width), nn.MaxPool2d(2), block(2 * width, 2 * width)
        )
        self.head = nn.Linear(2 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, 10]`` for images ``[N, 1, 8, 8]``."""
        return self.head(self.features(x).mean((2, 3)))


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="static:int8/4MB/H1", help="policy zip or agent name")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps")
    p.add_argument("--micro-batches", type=int, default=2, help="accumulated per step")
    p.add_argument("--batch-size", type=int, default=16, help="per rank and micro-batch")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--clip-norm", type=float, default=1.0, help="max gradient L2 norm")
    p.add_argument("--decision-every", type=int, default=10, help="steps per decision")
    p.add_argument("--time-budget-s", type=float, default=60.0, help="budget for elapsed_frac")
    p.add_argument("--no-autocast", action="store_true", help="fp32 forward (default bf16)")
    p.add_argument("--checkpoint-dir", default=None, help="per-rank checkpoints (and resume)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--stop-after", type=int, default=None, help="exit after this step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="rank 0 writes the results here")
    return p.parse_args()


def batch(x: torch.Tensor, y: torch.Tensor, seed: int, rank: int, step: int, micro: int, n: int):
    """This rank's micro-batch: a function of (seed, rank, step, micro), so resume repeats it."""
    g = torch.Generator().manual_seed(((seed * 1_000_003 + rank) * 100_003 + step) * 101 + micro)
    idx = torch.randint(len(x), (n,), generator=g)
    return x[idx], y[idx]


def main() -> None:
    """One rank of the training job."""
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torchrun provides RANK, WORLD_SIZE, MASTER_ADDR...
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # not needed for correctness: construction broadcasts rank 0's

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1234))
    train_x, train_y = x[perm[:1400]][rank::world], y[perm[:1400]][rank::world]  # rank's shard
    eval_x, eval_y = x[perm[1400:]], y[perm[1400:]]

    model = DigitsCNN()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    def lr_at(step: int) -> float:  # linear warm-up, then cosine to 0
        if step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        t = (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))

    lr_sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)

    @torch.no_grad()
    def held_out() -> tuple[float, float]:
        model.eval()  # BN running statistics (broadcast from rank 0 before this forward)
        logits = model(eval_x)
        model.train()
        return float(F.cross_entropy(logits, eval_y)), float(
            (logits.argmax(1) == eval_y).float().mean()
        )

    def show(rec: DecisionRecord) -> None:
        if rank == 0:
            print(
                f"decision {rec.decision:3d} step {rec.optimizer_step:4d} "
                f"eval_loss {rec.measured['eval_loss']:.4f} {rec.previous_config} -> "
                f"{rec.config}{'  (changed)' if rec.changed else ''}",
                flush=True,
            )

    sched = CommScheduler(
        model,
        opt,
        args.policy,
        decision_every=args.decision_every,
        eval_fn=lambda: held_out()[0],
        time_budget_s=args.time_budget_s,
        callback=show,
        seed=args.seed,
    )
    start = 0
    ckpt_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    ckpt_file = ckpt_dir / f"ckpt.rank{rank}.pt" if ckpt_dir else None
    if ckpt_file is not None and ckpt_file.exists():
        # each rank loads its OWN file: residuals and local-SGD replicas are per rank.
        # Loading after CommScheduler(...) keeps its construction broadcast from
        # overwriting the per-rank state.
        ckpt = torch.load(ckpt_file, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        lr_sched.load_state_dict(ckpt["lr_scheduler"])
        sched.load_state_dict(ckpt["scheduler"])
        start = int(ckpt["step"])
    if rank == 0:
        print(f"world size {world}, start step {start}, config {sched.config}", flush=True)

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.no_autocast)
    for step in range(start, args.steps):
        opt.zero_grad(set_to_none=True)
        for m in range(args.micro_batches):
            xb, yb = batch(train_x, train_y, args.seed, rank, step, m, args.batch_size)
            # all micro-batches but the last accumulate locally; the last one communicates
            with sched.no_sync() if m < args.micro_batches - 1 else contextlib.nullcontext():
                with autocast:
                    loss = F.cross_entropy(model(xb), yb) / args.micro_batches
                loss.backward()
        sched.synchronize()  # .grad is now the synchronised (decompressed, averaged) gradient
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)  # same on all ranks
        sched.step(loss.detach() * args.micro_batches)  # optimizer step (+ policy decisions)
        lr_sched.step()
        done = step + 1
        if ckpt_file is not None and done % args.checkpoint_every == 0:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            state = {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "lr_scheduler": lr_sched.state_dict(),
                "scheduler": sched.state_dict(),
                "step": done,
            }
            tmp = ckpt_file.with_suffix(".tmp")
            torch.save(state, tmp)
            os.replace(tmp, ckpt_file)  # atomic: a kill never leaves a torn checkpoint
        if args.stop_after is not None and done >= args.stop_after:
            break
    stopped_early = args.stop_after is not None and done < args.steps
    if not stopped_early:
        sched.close()  # consensus: identical parameters on every rank

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    diff = torch.tensor([float((flat - ref).abs().max())])
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    identical = float(diff) == 0.0
    if rank == 0:
        loss_eval, acc = held_out()
        digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
        print(
            f"step {done}: held-out loss {loss_eval:.4f} accuracy {acc:.3f}; parameters "
            f"identical across {world} ranks: {identical}; sha256 {digest}",
            flush=True,
        )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "world_size": world,
                        "start_step": start,
                        "steps_done": done,
                        "params_sha256": digest,
                        "params_identical": identical,
                        "eval_loss": loss_eval,
                        "eval_accuracy": acc,
                        "configs": [r.config for r in sched.records],
                    },
                    f,
                    indent=1,
                )
    # free the scheduler while the process group is alive, meet, then tear down
    del sched
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    if not identical:
        raise SystemExit("parameters differ across ranks")


if __name__ == "__main__":
    main()
