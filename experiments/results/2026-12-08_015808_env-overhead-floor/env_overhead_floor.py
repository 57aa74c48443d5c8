"""What bounds `commgym bench env`'s overhead and the int8 kernel's ratio on this host (issue 40).

python env_overhead_floor.py [--record DIR]

1. The control plane's floor: one process sends a 151-byte command to two processes over
   multiprocessing.connection (the env's transport) and waits for their 499-byte replies, 20 ms
   apart (a decision's pause): the median round trip with `connection.wait` (as
   `Cluster.command`), with plain `recv` in rank order, and with one pickle sent as bytes.
2. The held-out evaluation's floor: `Workload.evaluate` of mlp-digits on one rank's share (128
   samples) alone, its bare forward, and the same evaluation right after 10 training steps
   (as a decision ends).
3. The int8 quantiser with error feedback on a 4.5 MiB bucket, each call timed right after a
   copy of the buffer (as `commgym bench kernels`): the shipped kernel; the same arithmetic with
   chunk c + 1's amax reduced inside chunk c's loop (the pipelined form tried on 2026-12-08); and
   one pass without the amax (not a quantiser: the floor of the memory traffic plus the
   quantising arithmetic).
"""

import multiprocessing as mp
import pickle
import statistics
import sys
import time
from multiprocessing.connection import Client, Listener, wait

import numba
import numpy as np
import torch
import torch.nn.functional as F

from commgym.collectives.kernels import cpu_kernels as ck
from commgym.experiments.records import Recording

CMD = {"cmd": "step", "config": {"compression": "none", "bucket_mb": 25.0, "sync_period": 1},
       "steps": 10}  # fmt: skip
REPLY = {"type": "step", "x": list(range(40))}


def _rank(addr, key):
    c = Client(addr, authkey=key)
    while (m := c.recv()) is not None:
        c.send(REPLY)


def control_plane(rounds=300):
    key = b"k" * 16
    listener = Listener(("127.0.0.1", 0), authkey=key)
    procs = [mp.Process(target=_rank, args=(listener.address, key)) for _ in range(2)]
    for p in procs:
        p.start()
    conns = [listener.accept() for _ in procs]
    out = {}
    for _ in range(3):
        for mode in ("wait", "recv in rank order", "one pickle + wait"):
            ts = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                if mode == "one pickle + wait":
                    b = pickle.dumps(CMD)
                    for c in conns:
                        c.send_bytes(b)
                else:
                    for c in conns:
                        c.send(CMD)
                if mode == "recv in rank order":
                    for c in conns:
                        c.recv()
                else:
                    pending = list(conns)
                    while pending:
                        for c in wait(pending, timeout=0.5):
                            c.recv()
                            pending.remove(c)
                ts.append(time.perf_counter() - t0)
                time.sleep(0.02)
            out.setdefault(mode, []).append(statistics.median(ts) * 1e3)
    for c in conns:
        c.send(None)
    for p in procs:
        p.join()
    print("1. control plane, 2 ranks: median round trip, ms (three rounds)")
    for mode, v in out.items():
        print(f"   {mode:22s} " + "  ".join(f"{x:.3f}" for x in v))


def evaluation(reps=500):
    from commgym.env.workloads import get_workload

    torch.set_num_threads(1)
    wl = get_workload("mlp-digits")
    torch.manual_seed(0)
    model = wl.build_model()
    data = wl.load_data()
    ex, ey = data.eval_x[0:256:2], data.eval_y[0:256:2]

    def timed(fn, n=reps):
        fn()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e6

    def evaluate():
        with torch.inference_mode():
            return wl.evaluate(model, ex, ey)

    def forward():
        with torch.inference_mode():
            model(ex)

    alone, fwd = timed(evaluate), timed(forward)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    tx, ty = data.train_x, data.train_y
    after = []
    for _ in range(60):
        for _ in range(10):
            idx = torch.randint(0, len(tx), (64,))
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(tx[idx]), ty[idx]).backward()
            opt.step()
        t0 = time.perf_counter()
        evaluate()
        after.append(time.perf_counter() - t0)
    print("2. held-out evaluation of mlp-digits on one rank's share (128 samples), median us")
    print(f"   evaluate alone {alone:.0f}, its forward {fwd:.0f}, "
          f"evaluate after 10 training steps {statistics.median(after[5:]) * 1e6:.0f}")  # fmt: skip


_J = {"nogil": True, "cache": False, "fastmath": False, "boundscheck": False}


@numba.njit(**_J)
def _amax_bits(xc, rc):
    b = np.int32(0)
    for j in range(xc.shape[0]):
        b = np.int32(max(np.int32(ck._f32_bits(xc[j] + rc[j]) & ck._ABS_MASK), b))
    return b


@numba.njit(**_J)
def pipelined(x, r, codes, scales, chunk):
    # the shipped kernel's unguarded int8 loop with chunk c + 1's amax reduced inside it
    # (every chunk of this benchmark's data is in that loop's range)
    n = x.shape[0]
    qmax_f = np.float32(127.0)
    nch = (n + chunk - 1) // chunk
    nb = _amax_bits(x[: min(n, chunk)], r[: min(n, chunk)])
    for c in range(nch):
        lo = c * chunk
        hi = min(n, lo + chunk)
        m = hi - lo
        mn = min(n, hi + chunk) - hi
        amax = ck._bits_f32(nb)
        scale = amax / qmax_f
        scales[c] = scale
        inv = (np.float32(1.0) / amax) * qmax_f
        xc, rc, cc = x[lo:hi], r[lo:hi], codes[lo:hi]
        if mn == m:
            xn, rn = x[hi : hi + m], r[hi : hi + m]
            nb = np.int32(0)
            for j in range(m):
                vj = xc[j] + rc[j]
                y = np.floor(vj * inv + np.float32(0.5))
                rc[j] = vj - y * scale
                cc[j] = np.uint8(y + qmax_f)
                nb = np.int32(max(np.int32(ck._f32_bits(xn[j] + rn[j]) & ck._ABS_MASK), nb))
            continue
        for j in range(m):
            vj = xc[j] + rc[j]
            y = np.floor(vj * inv + np.float32(0.5))
            rc[j] = vj - y * scale
            cc[j] = np.uint8(y + qmax_f)
        if mn > 0:
            nb = _amax_bits(x[hi : hi + mn], r[hi : hi + mn])


@numba.njit(**_J)
def one_pass(x, r, codes, inv, scale):
    for j in range(x.shape[0]):
        vj = x[j] + r[j]
        y = np.floor(vj * inv + np.float32(0.5))
        r[j] = vj - y * scale
        codes[j] = np.uint8(y + np.float32(127))


def kernels(rounds=10, reps=10):
    torch.set_num_threads(1)
    n = int(4.5 * 2**20) // 4
    src, dst = torch.randn(n), torch.empty(n)
    x, r = torch.randn(n), torch.zeros(n)
    codes, scales = ck.quantize_ef(x, r, 8)
    xa, ra, ca, sa = x.numpy(), r.numpy(), codes.numpy(), scales.numpy()
    # the pipelined form gives the shipped kernel's bits
    r1, r2 = torch.randn(n) * 1e-3, None
    r2 = r1.clone()
    c1, s1 = ck.quantize_ef(x, r1, 8)
    c2, s2 = torch.empty_like(c1), torch.empty_like(s1)
    pipelined(xa, r2.numpy(), c2.numpy(), s2.numpy(), 512)
    assert torch.equal(c1, c2) and torch.equal(s1, s2) and torch.equal(r1, r2)
    cases = {
        "shipped kernel": lambda: ck.quantize_ef(x, r, 8, out_codes=codes, out_scales=scales),
        "pipelined amax": lambda: pipelined(xa, ra, ca, sa, 512),
        "one pass, no amax": lambda: one_pass(xa, ra, ca, np.float32(10.0), np.float32(0.1)),
    }

    def copy():
        dst.copy_(src)

    got = {k: [] for k in cases}
    for _ in range(rounds):
        for k, fn in cases.items():
            fn()
            copy()
            ratios = []
            for _ in range(reps):
                t0 = time.perf_counter()
                copy()
                t1 = time.perf_counter()
                fn()
                t2 = time.perf_counter()
                ratios.append((t2 - t1) / (t1 - t0))
            got[k].append(statistics.median(ratios))
    print("3. int8 + error feedback, 4.5 MiB, time / the copy before it (median of 10 calls), "
          f"{rounds} rounds")  # fmt: skip
    for k, v in got.items():
        print(f"   {k:18s} median {statistics.median(v):.2f}x, rounds {min(v):.2f}-{max(v):.2f}x")


def main():
    control_plane()
    evaluation()
    kernels()


if __name__ == "__main__":
    if "--record" in sys.argv:
        root = sys.argv[sys.argv.index("--record") + 1]
        with Recording(root, ["python", "env_overhead_floor.py", *sys.argv[1:]]):
            main()
    else:
        main()
