"""Eager dispatch from Python against C, in the same run (issue: a Python eager op on a tiny
tensor costs at most 2x the C eager op plus 5 us).

    DTENSOR_CPU_DEVICES=1 build/venv/bin/python benchmarks/bench_python.py build/benchmarks/bench_spmd

Prints CSV: op, C us/op (bench_spmd dispatch on the same mesh), Python us/op, the budget
2 * C + 5 and whether Python is within it.
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


def main():
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
