"""Eager dispatch from Python against C, in the same run (issue: a Python eager op on a tiny
tensor costs at most 2x the C eager op plus 5 us).

    DTENSOR_CPU_DEVICES=1 build/venv/bin/python benchmarks/bench_python.py build/benchmarks/bench_spmd

Prints CSV: op, C us/op (bench_spmd dispatch on the same mesh), Python us/op, the budget
2 * C + 5 and whether Python is within it.

    DTENSOR_CPU_DEVICES=2 build/venv/bin/python benchmarks/bench_python.py matmul [n ...]
    DTENSOR_CPU_DEVICES=1 mpiexec.mpich -n 2 build/venv/bin/python benchmarks/bench_python.py \
        matmul [n ...]

The contracting-sharded f32 matmul from Python: A[U,x] @ B[x,U] -> replicated on a
mesh x of every device, eager, best of 5 after a warm-up, each timed between barriers on client
0; beside numpy's matmul (its own OpenBLAS, all cores) timed by client 0 while the others wait
in a barrier. Prints CSV: clients, devices, n, GFLOP/s of both, and their ratio.
"""
import csv
import io
import os
import subprocess
import sys
import time

import numpy as np

import dtensor


def python_us_per_op(fn, a, b, n=20000, reps=5):
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(a, b)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def best_seconds(fn, reps=5):
    fn()  # warm-up: programs compiled, caches filled
    best = float("inf")
    for _ in range(reps):
        dtensor.barrier()
        t0 = time.perf_counter()
        fn()
        dtensor.barrier()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul(sizes):
    dtensor.initialize_accelerator_system("CPU")
    devices = dtensor.num_global_devices("CPU")
    mesh = dtensor.create_mesh([("x", devices)])
    cols = dtensor.Layout([dtensor.UNSHARDED, "x"], mesh)
    rows = dtensor.Layout(["x", dtensor.UNSHARDED], mesh)
    out = dtensor.Layout.replicated(mesh, 2)
    me = dtensor.client_id()
    if me == 0:
        print("benchmark,clients,devices,n,dtensor_gflops,numpy_gflops,ratio_to_numpy")
    for n in sizes:
        rng = np.random.default_rng(n)
        a_full = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        b_full = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        base = 0.0
        if me == 0:
            t = min(timeit(lambda: a_full @ b_full) for _ in range(3))
            base = 2.0 * n**3 / t / 1e9
        dtensor.barrier()
        a = dtensor.dtensor_from_array(a_full, cols)
        b = dtensor.dtensor_from_array(b_full, rows)
        t = best_seconds(lambda: dtensor.call_with_layout(dtensor.matmul, out, a, b))
        if me == 0:
            gf = 2.0 * n**3 / t / 1e9
            print(f"python_matmul_contracting,{dtensor.num_clients()},{devices},{n},"
                  f"{gf:.1f},{base:.1f},{gf / base:.3f}", flush=True)
        del a, b


def timeit(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "matmul":
        matmul([int(v) for v in sys.argv[2:]] or [2048, 4096])
        return
    bench = sys.argv[1] if len(sys.argv) > 1 else "build/benchmarks/bench_spmd"
    env = dict(os.environ, DTENSOR_CPU_DEVICES="1")
    out = subprocess.run([bench, "dispatch"], env=env, check=True, capture_output=True,
                         text=True).stdout
    c_us = {row["op"].split()[0]: float(row["us_per_op"])
            for row in csv.DictReader(io.StringIO(out)) if row["mesh"] == "x=1"}
    dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=1)
    mesh = dtensor.create_mesh([("x", 1)])
    layout = dtensor.Layout.replicated(mesh, 1)
    a = dtensor.dtensor_from_array(np.ones(8, np.float32), layout)
    b = dtensor.dtensor_from_array(np.ones(8, np.float32), layout)
    print("op,c_us_per_op,python_us_per_op,budget_us,within_budget")
    for name, fn in [("add", dtensor.add), ("neg", lambda x, _: dtensor.neg(x))]:
        py = python_us_per_op(fn, a, b)
        budget = 2 * c_us[name] + 5
        print(f"{name} f32[8],{c_us[name]:.2f},{py:.2f},{budget:.2f},{py <= budget}")


if __name__ == "__main__":
    main()
