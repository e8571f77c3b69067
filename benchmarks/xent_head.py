"""A language model's loss alone, GPT-2 small's size: the mean sparse softmax cross-entropy of
logits [4, 128, 50304] (f32, one CPU device) and its gradient, as one traced gradient function,
composed (reduce_logsumexp, one_hot, multiply, reduce_sum: the examples' former loss) against
the fused op (nn.sparse_softmax_cross_entropy_with_logits), alternating in the same run. Prints
each call's CPU time (process time: every kernel thread counted) and the ratio of the best
times, the figure to read on a shared machine.

``--what keras``: Keras's loss of logits [512, 50304] and its gradient through a GradientTape,
eagerly, from logits and from probabilities: the former path (a host one-hot [512, 50304] of
the labels uploaded, then CategoricalCrossentropy's log_softmax, product and sum) against
keras.losses.SparseCategoricalCrossentropy (the fused op; from probabilities on the log of the
clipped probabilities), alternating in the same run. (The former one-hot indexed np.eye(V),
a V x V identity on the host, 10 GB at V = 50304: the "before" here builds the same one-hot
rows without it, so it is faster than the code it stands for.)

    PYTHONPATH=build-dev/bindings/python OPENBLAS_NUM_THREADS=1 python3 benchmarks/xent_head.py
    PYTHONPATH=build-dev/bindings/python OPENBLAS_NUM_THREADS=1 python3 benchmarks/xent_head.py \
        --what keras
"""
import argparse
import os
import time

import numpy as np

import dtensor

U = dtensor.UNSHARDED


def alternate(calls, rounds):
    """Run each of ``calls`` (name -> function) once a round, alternating; print each run's
    CPU and wall time and return the best CPU time of each."""
    best = {k: float("inf") for k in calls}
    for r in range(rounds):
        for name, call in calls.items():
            c0, w0 = time.process_time(), time.perf_counter()
            call()
            cpu = time.process_time() - c0
            best[name] = min(best[name], cpu)
            print(f"round {r} {name}: cpu {cpu:.3f} s, wall {time.perf_counter() - w0:.3f} s, "
                  f"load {os.getloadavg()[0]:.1f}")
    return best


def keras_losses(a, mesh):
    """Keras's loss and its gradient, eager: the former one-hot path against the fused one."""
    from dtensor import keras  # noqa: PLC0415

    rng = np.random.default_rng(0)
    n, V = a.rows, a.vocab
    z = rng.standard_normal((n, V)).astype(np.float32)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    labels = rng.integers(0, V, n).astype(np.int32)
    rows = dtensor.Layout([U, U], mesh)
    x = {True: dtensor.dtensor_from_array(z, rows), False: dtensor.dtensor_from_array(p, rows)}

    def former(from_logits):
        def run():
            hot = np.zeros((n, V), np.float32)  # the former _one_hot_like, without np.eye(V)
            hot[np.arange(n), labels] = 1
            with dtensor.GradientTape() as tape:
                tape.watch(x[from_logits])
                loss = keras.losses.CategoricalCrossentropy(from_logits=from_logits)(
                    dtensor.dtensor_from_array(hot, rows), x[from_logits])
            return loss, tape.gradient(loss, x[from_logits])
        return run

    def fused(from_logits):
        def run():
            with dtensor.GradientTape() as tape:
                tape.watch(x[from_logits])
                loss = keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)(
                    labels, x[from_logits])
            return loss, tape.gradient(loss, x[from_logits])
        return run

    calls = {}
    for from_logits in (True, False):
        kind = "logits" if from_logits else "probabilities"
        calls[f"former {kind}"] = former(from_logits)
        calls[f"sparse {kind}"] = fused(from_logits)
    for name, call in calls.items():
        loss, g = call()
        print(f"{name}: loss {float(np.asarray(dtensor.gather(loss))):.7f}, |grad| "
              f"{float(np.abs(dtensor.gather(g)).sum()):.6f}")
    best = alternate({k: (lambda c=c: dtensor.gather(c()[1][0:1])) for k, c in calls.items()},
                     a.rounds)
    for kind in ("logits", "probabilities"):
        f, s = best[f"former {kind}"], best[f"sparse {kind}"]
        print(f"best cpu, {kind}: former {f:.3f} s, sparse {s:.3f} s, sparse / former "
              f"{s / f:.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--what", choices=["head", "keras"], default="head")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rows", type=int, default=512, help="--what keras: the batch")
    ap.add_argument("--vocab", type=int, default=50304)
    a = ap.parse_args()
    dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=1)
    mesh = dtensor.create_mesh([("x", 1)], device_type="CPU")
    if a.what == "keras":
        keras_losses(a, mesh)
        return
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
    best = alternate({k: (lambda g=g: dtensor.gather(g(y, x)[0])) for k, g in grads.items()},
                     a.rounds)
    print(f"best cpu: composed {best['composed']:.3f} s, fused {best['fused']:.3f} s, "
          f"fused / composed {best['fused'] / best['composed']:.2f}")


if __name__ == "__main__":
    main()
