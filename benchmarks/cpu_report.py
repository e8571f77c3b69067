"""Tables of benchmarks/cpu.sh from the CSV files of one run, as markdown on stdout.

    /usr/bin/python3 benchmarks/cpu_report.py benchmarks/results/cpu

Standard library only. Every ratio is against a baseline of the same run: matmul against
single-process OpenBLAS sgemm with 2 threads, relayouts against a 1-thread memcpy of the same
bytes, eager dispatch against one process (1 and 2 devices), Python against numpy.
"""
import csv
import glob
import os
import sys

CONFIGS = {"1x2": "1 process x 2 devices", "n2": "-n 2 x 1 device"}
CASES = {
    "contracting_allreduce": "contracting A[U,x] @ B[x,U] -> [U,U]",
    "row": "row-sharded A[x,U] @ B[U,U] -> [x,U]",
    "replicated": "replicated (every device all of C)",
}
PAIRS = {
    ("x,unsharded", "unsharded,x"): "[x,U] -> [U,x]",
    ("x,unsharded", "unsharded,unsharded"): "[x,U] -> [U,U]",
}
MIB = 1048576.0


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def mib(v):
    return f"{float(v) / MIB:.0f}" if v not in (None, "") else ""


def matmul(out, d):
    out.append("### Matmul (f32), against single-process OpenBLAS sgemm with 2 threads\n")
    out.append("Collective ms: the last timed run's collectives, waits for the other device or "
               "client included.\n")
    out.append("| config | case | n | GFLOP/s | / OpenBLAS | OpenBLAS GFLOP/s | faults per run "
               "| peak RSS MiB | RSS above start MiB | device peak above operands MiB "
               "| output per device MiB | collective ms |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for cfg in CONFIGS:
        files = sorted(glob.glob(os.path.join(d, f"matmul_{cfg}_*.csv")),
                       key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))
        for path in files:
            rs = rows(path)
            base = next((r for r in rs if r["scheme"].startswith("openblas")), None)
            for r in rs:
                if r["scheme"] not in CASES:
                    continue
                out.append(
                    f"| {CONFIGS[cfg]} | {CASES[r['scheme']]} | {r['n']} "
                    f"| {float(r['gflops']):.1f} "
                    f"| {float(r['ratio_to_openblas']):.3f} "
                    f"| {float(base['gflops']):.1f} | {float(r['minor_faults_per_run']):.0f} "
                    f"| {mib(r['peak_rss_bytes'])} | {mib(r['extra_rss_bytes'])} "
                    f"| {mib(r['device_extra_bytes'])} | {mib(r['output_bytes_per_device'])} "
                    f"| {1e3 * float(r['collective_s']):.1f} |")
    out.append("")


def relayout(out, d):
    out.append("### Relayout (f32), against a 1-thread memcpy of the same bytes\n")
    out.append("| config | transition | n | GB/s | / memcpy | memcpy GB/s | faults per run "
               "| RSS above start MiB | device peak above operands MiB |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for cfg in CONFIGS:
        path = os.path.join(d, f"relayout_{cfg}.csv")
        if not os.path.exists(path):
            continue
        rs = rows(path)
        base = next(r for r in rs if r["from"] == "memcpy")
        for r in rs:
            name = PAIRS.get((r["from"], r["to"]))
            if not name:
                continue
            out.append(
                f"| {CONFIGS[cfg]} | {name} | {r['n']} | {float(r['gbps']):.2f} "
                f"| {float(r['ratio_to_memcpy']):.2f} | {float(base['gbps']):.2f} "
                f"| {float(r['minor_faults_per_run']):.0f} | {mib(r['extra_rss_bytes'])} "
                f"| {mib(r['device_extra_bytes'])} |")
    out.append("")


def dispatch(out, d):
    def read(cfg):
        path = os.path.join(d, f"dispatch_{cfg}.csv")
        if not os.path.exists(path):
            return {}
        return {r["mesh"]: float(r["us_per_op"]) for r in rows(path) if r["op"].startswith("add")}

    one = read("1x1").get("x=1")
    two = read("1x2").get("x=2")
    out.append("### Eager add of two f32[8] tensors (microseconds per op)\n")
    out.append("| config | mesh | us per op | above 1 process x 1 device "
               "| above 1 process x 2 devices |")
    out.append("|---|---|---|---|---|")
    for cfg, name in [("1x1", "1 process x 1 device")] + list(CONFIGS.items()):
        for mesh, us in read(cfg).items():
            a = f"{us - one:+.2f}" if one is not None else ""
            b = f"{us - two:+.2f}" if two is not None else ""
            out.append(f"| {name} | {mesh} | {us:.2f} | {a} | {b} |")
    out.append("")


def python(out, d):
    found = [(cfg, os.path.join(d, f"python_{cfg}.csv")) for cfg in CONFIGS]
    found = [(cfg, p) for cfg, p in found if os.path.exists(p)]
    if not found:
        out.append("### Python: not run (no interpreter with numpy)\n")
        return
    out.append("### Contracting matmul from Python (f32), against numpy's matmul (all cores)\n")
    out.append("| config | n | dtensor GFLOP/s | numpy GFLOP/s | / numpy |")
    out.append("|---|---|---|---|---|")
    for cfg, path in found:
        for r in rows(path):
            out.append(f"| {CONFIGS[cfg]} | {r['n']} | {r['dtensor_gflops']} "
                       f"| {r['numpy_gflops']} | {r['ratio_to_numpy']} |")
    out.append("")


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/cpu"
    out = []
    matmul(out, d)
    relayout(out, d)
    dispatch(out, d)
    python(out, d)
    print("\n".join(out))


if __name__ == "__main__":
    main()
