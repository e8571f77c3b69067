"""A language model's loss alone, GPT-2 small's size: the mean sparse softmax cross-entropy of
logits [4, 128, 50304] (f32, one CPU device) and its gradient, as one traced gradient function,
composed (reduce_logsumexp, one_hot, multiply, reduce_sum: the examples' former loss) against
the fused op (nn.sparse_softmax_cross_entropy_with_logits), alternating in the same run. Prints
each call's CPU time (process time: every kernel thread counted) and the ratio of the best
times, the figure to read on a shared machine.

    PYTHONPATH=build-dev/bindings/python OPENBLAS_NUM_THREADS=1 python3 benchmarks/xent_head.py
"""
import argparse
import os
import time

import numpy as np

import dtensor

U = dtensor.UNSHARDED


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=50304)
    a = ap.parse_args()
    dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=1)
    mesh = dtensor.create_mesh([("x", 1)], device_type="CPU")
    rng = np.random.default_rng(0)
    V = a.vocab
    x = dtensor.dtensor_from_array(rng.standard_normal((a.batch, a.seq, V)).astype(np.float32),
                                   dtensor.Layout([U, U, U], mesh))
    y = dtensor.dtensor_from_array(rng.integers(0, V, (a.batch, a.seq)).astype(np.int32),
                                   dtensor.Layout([U, U], mesh))

    def composed(y, x):
        lse = dtensor.reduce_logsumexp(x, axis=-1)
        picked = dtensor.reduce_sum(dtensor.one_hot(y, V, dtype=dtensor.float32) * x, axis=-1)
        return dtensor.reduce_mean(lse - picked)

    def fused(y, x):
        return dtensor.reduce_mean(dtensor.nn.sparse_softmax_cross_entropy_with_logits(y, x))

    grads = {}
    for name, fn in (("composed", composed), ("fused", fused)):
        grads[name] = dtensor.function(fn).gradient(0, [1], y, x)
        loss = float(np.asarray(dtensor.gather(grads[name](y, x)[0])))
        print(f"{name}: loss {loss:.7f}")
    best = {k: float("inf") for k in grads}
    for r in range(a.rounds):
        for name, g in grads.items():
            c0, w0 = time.process_time(), time.perf_counter()
            dtensor.gather(g(y, x)[0])
            cpu = time.process_time() - c0
            best[name] = min(best[name], cpu)
            print(f"round {r} {name}: cpu {cpu:.3f} s, wall {time.perf_counter() - w0:.3f} s, "
                  f"load {os.getloadavg()[0]:.1f}")
    print(f"best cpu: composed {best['composed']:.3f} s, fused {best['fused']:.3f} s, "
          f"fused / composed {best['fused'] / best['composed']:.2f}")


if __name__ == "__main__":
    main()
