#!/usr/bin/env python3
"""Turn the CSV of benchmarks/run.sh into results.json, projection.csv and PNG plots.

    python benchmarks/report.py benchmarks/results

Reads matmul_*.csv and scalapack_*.csv (bench_schemes / bench_scalapack), relayout_*.csv,
collectives.csv (bench_collectives sweep) and calibration.json. Efficiency = our GFLOP/s over
the baseline's in the same run. The projection applies the alpha-beta-gamma model calibrated
on this machine (alpha per message, beta per byte a device sends, gamma per multiply-add of
one device) to every scheme at P = 8..4096 devices and large n, under one assumption that
makes schemes comparable: every operand starts evenly sharded over the P devices, so a scheme
that needs an operand replicated pays the all-gather. Plots need matplotlib; without it only
CSV and JSON are written.
"""
import csv
import glob
import json
import math
import os
import sys

SCHEME_ORDER = ["replicated", "row", "row_gather_b", "column", "contracting_allreduce",
                "contracting_reducescatter", "auto", "2d", "2d_contracting", "auto_2d"]


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def read_csv(path):
    with open(path, newline="") as f:
        return [{k: (num(v) if num(v) is not None else v) for k, v in r.items()}
                for r in csv.DictReader(f)]


def beta_of(cal, ops):
    """Seconds per byte for a row's collectives (the first kind named), all-gather's else."""
    b = cal["beta_s_per_byte"]
    for kind in ("all_reduce", "reduce_scatter", "all_gather"):
        if kind in str(ops):
            return b.get(kind, b["all_gather"])
    return b["all_gather"]


def matmul_tables(out, cal):
    tables = []
    for path in sorted(glob.glob(os.path.join(out, "matmul_*.csv"))):
        tag = os.path.basename(path)[len("matmul_"):-len(".csv")]
        rows = read_csv(path)
        base = next(r for r in rows if str(r["scheme"]).startswith("openblas"))
        sl = os.path.join(out, "scalapack_%s.csv" % tag)
        scal = read_csv(sl)[0] if os.path.exists(sl) else None
        for r in rows:
            r["efficiency_vs_openblas"] = r["gflops"] / base["gflops"]
            if scal:
                r["ratio_to_scalapack"] = r["gflops"] / scal["gflops"]
            if cal and not str(r["scheme"]).startswith("openblas"):
                g = cal["gamma_s_per_madd"][r["dtype"]]
                r["calibrated_s"] = (g * r["madds_per_device"] + cal["alpha_s"] * r["messages"] +
                                     beta_of(cal, r["collectives"]) * r["bytes_sent_per_device"])
            tb = r.get("textbook_bytes_per_device")
            r["ledger_equals_model"] = r["bytes_sent_per_device"] == r["model_bytes_per_device"]
            r["ledger_equals_textbook"] = (None if tb is None or (isinstance(tb, float) and
                                                                  math.isnan(tb))
                                           else abs(r["bytes_sent_per_device"] - tb) < 0.5)
        if scal:
            scal["efficiency_vs_openblas"] = scal["gflops"] / base["gflops"]
        ours = [r for r in rows if not str(r["scheme"]).startswith("openblas")]
        best = max(ours, key=lambda r: r["gflops"])
        tables.append({"tag": tag, "rows": rows, "baseline": base, "scalapack": scal,
                       "best": {"scheme": best["scheme"], "gflops": best["gflops"],
                                "efficiency_vs_openblas": best["efficiency_vs_openblas"],
                                "ratio_to_scalapack": best.get("ratio_to_scalapack")}})
    return tables


# ---- projection ------------------------------------------------------------------------------

def grid(p):
    px = 2 ** (int(math.log2(p)) // 2)
    return px, p // px


def project_one(scheme, p, n, es, cal, dtype):
    """Time, bytes sent and memory per device of C = A B (all n x n), operands starting evenly
    sharded. Message counts and volumes are the ring / textbook ones the ledger reports."""
    a, g = cal["alpha_s"], cal["gamma_s_per_madd"][dtype]
    bag = cal["beta_s_per_byte"]["all_gather"]
    bar = cal["beta_s_per_byte"]["all_reduce"]
    brs = cal["beta_s_per_byte"].get("reduce_scatter", bar)
    nn = float(n) * n
    f = (p - 1) / p
    if scheme == "replicated":  # gather A and B, every device computes all of C
        msgs, byts, t_comm = 2 * (p - 1), 2 * f * nn * es, None
        madds, mem = float(n) ** 3, 3 * nn * es
        t_comm = a * msgs + bag * byts
    elif scheme == "row_gather_b":  # rows of A and C; B all-gathered (column: the same by symmetry)
        msgs, byts = p - 1, f * nn * es
        madds, mem = float(n) ** 3 / p, (nn + 2 * nn / p) * es
        t_comm = a * msgs + bag * byts
    elif scheme == "contracting_allreduce":  # C ends replicated
        msgs, byts = 2 * (p - 1), 2 * f * nn * es
        madds, mem = float(n) ** 3 / p, (2 * nn / p + nn) * es
        t_comm = a * msgs + bar * byts
    elif scheme == "contracting_reducescatter":
        msgs, byts = p - 1, f * nn * es
        madds, mem = float(n) ** 3 / p, (2 * nn / p + nn) * es
        t_comm = a * msgs + brs * byts
    elif scheme == "2d":  # sqrt(P) x sqrt(P) blocks, A gathered over y, B over x (SUMMA volume)
        px, py = grid(p)
        msgs = (px - 1) + (py - 1)
        byts = ((py - 1) + (px - 1)) * nn / p * es
        madds, mem = float(n) ** 3 / p, (nn / px + nn / py + nn / p) * es
        t_comm = a * msgs + bag * byts
    else:
        raise ValueError(scheme)
    t = g * madds + t_comm
    return {"scheme": scheme, "devices": p, "n": n, "dtype": dtype, "seconds": t,
            "comm_seconds": t_comm, "bytes_sent_per_device": byts, "messages": msgs,
            "madds_per_device": madds, "memory_bytes_per_device": mem,
            "parallel_efficiency": g * float(n) ** 3 / p / t}


PROJ_SCHEMES = ["replicated", "row_gather_b", "contracting_allreduce",
                "contracting_reducescatter", "2d"]


def projection(cal, dtype):
    es = 8 if dtype == "f64" else 4
    rows, winners = [], []
    for n in (16384, 65536, 262144):
        for k in range(3, 13):
            p = 2 ** k
            pts = [project_one(s, p, n, es, cal, dtype) for s in PROJ_SCHEMES]
            best = min(pts, key=lambda r: r["seconds"])
            for r in pts:
                r["winner"] = r["scheme"] == best["scheme"]
            rows += pts
            winners.append({"devices": p, "n": n, "winner": best["scheme"],
                            "seconds": best["seconds"],
                            "parallel_efficiency": best["parallel_efficiency"]})
    return rows, winners


# ---- plots -----------------------------------------------------------------------------------

def plots(out, tables, proj, relayouts, coll):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib missing, no plots", file=sys.stderr)
        return []
    made = []
    if tables:
        fig, axes = plt.subplots(1, len(tables), figsize=(6.5 * len(tables), 4.2), squeeze=False)
        for ax, t in zip(axes[0], tables):
            ours = [r for r in t["rows"] if not str(r["scheme"]).startswith("openblas")]
            ours.sort(key=lambda r: SCHEME_ORDER.index(r["scheme"])
                      if r["scheme"] in SCHEME_ORDER else 99)
            names = [r["scheme"] for r in ours]
            eff = [r["efficiency_vs_openblas"] for r in ours]
            bars = ax.bar(range(len(ours)), eff, color="#4c72b0")
            for b, r in zip(bars, ours):
                ax.text(b.get_x() + b.get_width() / 2, b.get_height() + 0.01,
                        "%.0f" % r["gflops"], ha="center", va="bottom", fontsize=7)
            ax.axhline(1.0, color="k", lw=0.8, ls="--", label="OpenBLAS, 1 process, %d threads"
                       % int(str(t["baseline"]["scheme"]).split("_")[1]))
            if t["scalapack"]:
                ax.axhline(t["scalapack"]["efficiency_vs_openblas"], color="#c44e52", lw=1,
                           label="ScaLAPACK %s" % t["scalapack"]["scheme"].split("_")[1])
            ax.set_xticks(range(len(ours)))
            ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
            r0 = ours[0]
            ax.set_title("matmul %s n=%d, %s, %d clients, %d devices" % (
                r0["dtype"], r0["n"], r0["mesh"], r0["clients"], r0["devices"]), fontsize=9)
            ax.set_ylabel("efficiency = GFLOP/s / OpenBLAS GFLOP/s")
            ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "efficiency.png"), dpi=90)
        plt.close(fig)
        made.append("efficiency.png")
    if proj:
        ns = sorted({r["n"] for r in proj})
        fig, axes = plt.subplots(1, len(ns), figsize=(5 * len(ns), 4), squeeze=False, sharey=True)
        for ax, n in zip(axes[0], ns):
            for s in PROJ_SCHEMES:
                pts = [r for r in proj if r["n"] == n and r["scheme"] == s]
                ps = [r["devices"] for r in pts]
                ax.plot(ps, [r["parallel_efficiency"] for r in pts], marker=".", label=s)
                w = [r for r in pts if r["winner"]]
                ax.scatter([r["devices"] for r in w], [r["parallel_efficiency"] for r in w],
                           s=70, facecolors="none", edgecolors="k")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title("projection, n=%d %s (circle: winner)" % (n, proj[0]["dtype"]),
                         fontsize=9)
            ax.set_xlabel("devices P")
        axes[0][0].set_ylabel("predicted efficiency = gamma n^3/P / time")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "projection.png"), dpi=90)
        plt.close(fig)
        made.append("projection.png")
    if relayouts:
        fig, ax = plt.subplots(figsize=(5.5, 4.5))
        for tag, rows in relayouts.items():
            xs = [r["min_received_bytes_per_device"] for r in rows]
            ys = [r["bytes_received_per_device"] for r in rows]
            ax.scatter([max(x, 1) for x in xs], [max(y, 1) for y in ys], s=14, label=tag)
        lim = max(max(r["bytes_received_per_device"] for rows in relayouts.values()
                      for r in rows), 2)
        ax.plot([1, lim], [1, lim], "k--", lw=0.8, label="moved = minimum")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("minimum bytes received per device (1 = none)")
        ax.set_ylabel("ledger bytes received per device (1 = none)")
        ax.set_title("relayout: every transition", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "relayout.png"), dpi=90)
        plt.close(fig)
        made.append("relayout.png")
    if coll:
        kinds = sorted({r["kind"] for r in coll})
        fig, axes = plt.subplots(1, len(kinds), figsize=(4 * len(kinds), 3.6), squeeze=False)
        for ax, k in zip(axes[0], kinds):
            for impl in ("dtensor", "mpi", "mpi_nb"):
                pts = [r for r in coll if r["kind"] == k and r["impl"] == impl]
                ax.plot([r["bytes"] for r in pts], [r["busbw_GBps"] for r in pts], marker=".",
                        label=impl)
            ax.set_xscale("log", base=2)
            ax.set_title("%s, %d ranks" % (k, int(coll[0]["ranks"])), fontsize=9)
            ax.set_xlabel("bytes")
        axes[0][0].set_ylabel("bus bandwidth GB/s")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "collectives.png"), dpi=90)
        plt.close(fig)
        made.append("collectives.png")
    return made


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results"
    cal_path = os.path.join(out, "calibration.json")
    cal = json.load(open(cal_path)) if os.path.exists(cal_path) else None
    tables = matmul_tables(out, cal)
    relayouts = {os.path.basename(p)[len("relayout_"):-4]: read_csv(p)
                 for p in sorted(glob.glob(os.path.join(out, "relayout_*.csv")))}
    for rows in relayouts.values():
        for r in rows:
            lo = r["min_received_bytes_per_device"]
            r["ledger_equals_model"] = r["bytes_sent_per_device"] == r["model_bytes_per_device"]
            r["over_minimum"] = r["bytes_received_per_device"] / lo if lo else None
    coll_path = os.path.join(out, "collectives.csv")
    coll = [r for r in read_csv(coll_path) if r["bench"] == "sweep"] if os.path.exists(
        coll_path) else []
    proj, winners = ([], [])
    if cal:
        dtype = tables[0]["rows"][0]["dtype"] if tables else "f64"
        proj, winners = projection(cal, dtype)
        with open(os.path.join(out, "projection.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(proj[0].keys()))
            w.writeheader()
            w.writerows(proj)
    made = plots(out, tables, proj, relayouts, coll)
    result = {"calibration": cal, "matmul": tables, "relayout": relayouts, "collectives": coll,
              "projection": proj, "projection_winners": winners, "plots": made}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    for t in tables:
        b = t["best"]
        line = "%s: best %s %.1f GFLOP/s = %.3f of OpenBLAS" % (
            t["tag"], b["scheme"], b["gflops"], b["efficiency_vs_openblas"])
        if b.get("ratio_to_scalapack"):
            line += ", %.2fx ScaLAPACK" % b["ratio_to_scalapack"]
        print(line)
        bad = [r["scheme"] for r in t["rows"] if r.get("ledger_equals_textbook") is False or
               not r["ledger_equals_model"]]
        print("  ledger bytes == model == textbook for every scheme" if not bad else
              "  ledger differs from model/textbook: %s" % ", ".join(bad))
    for tag, rows in relayouts.items():
        over = [r for r in rows if r["over_minimum"] and r["over_minimum"] > 1.001]
        print("relayout %s: %d transitions, ledger == model in all: %s, %d move more than the "
              "minimum" % (tag, len(rows), all(r["ledger_equals_model"] for r in rows),
                           len(over)))
    if winners:
        print("projection winners: " + ", ".join(
            "P=%d n=%d %s" % (w["devices"], w["n"], w["winner"]) for w in winners
            if w["devices"] in (8, 64, 512, 4096)))
    print("wrote results.json%s%s" % (", projection.csv" if proj else "",
                                      "".join(", " + m for m in made)))


if __name__ == "__main__":
    main()
