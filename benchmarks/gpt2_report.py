"""The tables of benchmarks/gpt2.sh from its gpt2.csv: gpt2.json, gpt2.md (also printed) and
gpt2.png (tokens per second per configuration; when matplotlib is importable).

Rows of gpt2.csv: config, side, devices, processes, tokens_per_second, peak_rss_mib (largest
process), state_bytes and step_peak_bytes (dtensor's allocator, busiest device), hidden_share
(dtensor: the share of client 0's communication time in the timed steps hidden behind its
compute, from the ledger), then the loss of every step. failed.csv, when there, names the
configurations (config, side) that failed. Each dtensor configuration is read against its
PyTorch counterpart of the same run; the loss curves against each other: the largest relative
difference between any two rows at any step (target 1e-4), missed when a configuration failed,
a row lacks steps the longest has, or a loss is not finite.

    python gpt2_report.py benchmarks/results/gpt2
"""
import csv
import json
import math
import os
import sys

COUNTERPARTS = {  # dtensor configuration -> the PyTorch row it is read against
    ("1proc", "dtensor"): [("1proc", "torch-eager"), ("1proc", "torch-compile")],
    ("n2-data", "dtensor"): [("n2-data", "torch-ddp")],
    ("n2-fsdp", "dtensor"): [("n2-fsdp", "torch-fsdp")],
    ("n2-tensor", "dtensor"): [("n2-tensor", "torch-tp")],
}


def name(r):
    return f"{r['config']} {r['side']}"


def loss_agreement(rows):
    """(the largest relative difference |a - b| / |b| between the losses of two rows at one
    step, the rows and step it is at or None, what is wrong with the curves: a row with fewer
    steps than the longest, a loss that is not finite)."""
    steps = max((len(r["losses"]) for r in rows), default=0)
    problems = []
    for r in rows:
        if len(r["losses"]) < steps:
            problems.append(f"{name(r)} has {len(r['losses'])} of {steps} steps")
        bad = [i for i, v in enumerate(r["losses"]) if not math.isfinite(v)]
        if bad:
            problems.append(f"{name(r)}: loss {r['losses'][bad[0]]} at step {bad[0]}")
    worst, where = 0.0, None
    for step in range(steps):
        have = [(r, r["losses"][step]) for r in rows
                if step < len(r["losses"]) and math.isfinite(r["losses"][step])]
        for ra, a in have:
            for rb, b in have:
                d = abs(a - b) / abs(b) if b else (0.0 if a == b else math.inf)
                if d > worst:
                    worst, where = d, (name(ra), name(rb), step)
    return worst, where, problems


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/gpt2"
    failed = []
    if os.path.exists(os.path.join(out, "failed.csv")):
        with open(os.path.join(out, "failed.csv")) as f:
            failed = [tuple(r[:2]) for r in csv.reader(f) if r]
    rows = []
    with open(os.path.join(out, "gpt2.csv")) as f:
        for r in csv.reader(f):
            rows.append({"config": r[0], "side": r[1], "devices": int(r[2]),
                         "processes": int(r[3]), "tokens_per_second": float(r[4]),
                         "peak_rss_mib": float(r[5]),
                         "state_bytes": int(r[6]) if r[6] else None,
                         "step_peak_bytes": int(r[7]) if r[7] else None,
                         "hidden_share": float(r[8]) if r[8] else None,
                         "losses": [float(x) for x in r[9:]]})
    by = {(r["config"], r["side"]): r for r in rows}
    lines = ["| configuration | dtensor tokens/s | PyTorch | PyTorch tokens/s | ratio | "
             "peak RSS MiB dtensor / PyTorch | communication hidden |",
             "|---|---|---|---|---|---|---|"]
    ratios = []
    for r in rows:
        if r["side"] != "dtensor":
            continue
        pairs = [by[k] for k in COUNTERPARTS.get((r["config"], "dtensor"), []) if k in by]
        hidden = "" if r["hidden_share"] is None else f"{100 * r['hidden_share']:.0f}%"
        gone = [k for k in COUNTERPARTS.get((r["config"], "dtensor"), []) if k in failed]
        for k in gone:
            lines.append(f"| {r['config']} | {r['tokens_per_second']:.1f} | {k[1]} | "
                         f"failed | | {r['peak_rss_mib']:.0f} | {hidden} |")
        if not pairs and not gone:
            lines.append(f"| {r['config']} | {r['tokens_per_second']:.1f} | | | | "
                         f"{r['peak_rss_mib']:.0f} | {hidden} |")
        for t in pairs:
            ratio = r["tokens_per_second"] / t["tokens_per_second"]
            ratios.append({"config": r["config"], "against": t["side"], "ratio": ratio})
            lines.append(f"| {r['config']} | {r['tokens_per_second']:.1f} | {t['side']} | "
                         f"{t['tokens_per_second']:.1f} | {ratio:.2f} | "
                         f"{r['peak_rss_mib']:.0f} / {t['peak_rss_mib']:.0f} | {hidden} |")
    for config, side in failed:  # a failed dtensor configuration beside its counterparts
        for k in COUNTERPARTS.get((config, side), []):
            if k in by:
                lines.append(f"| {config} | failed | {k[1]} | {by[k]['tokens_per_second']:.1f} "
                             f"| | {by[k]['peak_rss_mib']:.0f} | |")
    best = {}
    for side in ("dtensor", "torch"):
        cand = [r for r in rows if r["side"].startswith(side)]
        if cand:
            b = max(cand, key=lambda r: r["tokens_per_second"])
            best[side] = {"config": b["config"], "side": b["side"],
                          "tokens_per_second": b["tokens_per_second"]}
    if len(best) == 2:
        lines.append(f"\nbest dtensor {best['dtensor']['config']} "
                     f"{best['dtensor']['tokens_per_second']:.1f} tokens/s, best PyTorch "
                     f"{best['torch']['config']} {best['torch']['side']} "
                     f"{best['torch']['tokens_per_second']:.1f}: "
                     f"{best['dtensor']['tokens_per_second'] / best['torch']['tokens_per_second']:.2f}")
    if failed:
        lines.append("\nfailed (no row; see their logs): " +
                     ", ".join(f"{c} {side}" for c, side in failed))
    worst, where, problems = loss_agreement(rows)
    met = len(rows) > 1 and worst <= 1e-4 and not problems and not failed
    at = f", {where[0]} against {where[1]} at step {where[2]}" if where else ""
    lines.append(f"\nloss curves: the largest relative difference between any two of the "
                 f"{len(rows)} rows at any step: {worst:.2e}{at} (target 1e-4: "
                 f"{'yes' if met else 'NO'})" +
                 "".join(f"; {p}" for p in problems) +
                 (f"; {len(failed)} configuration(s) failed" if failed else ""))
    fs, dp = by.get(("n2-fsdp", "dtensor")), by.get(("n2-data", "dtensor"))
    if fs and dp and fs["state_bytes"] and dp["state_bytes"]:
        share = fs["state_bytes"] / (dp["state_bytes"] / 2)
        lines.append(f"fully sharded at -n 2: parameters, gradients and optimizer state per "
                     f"client {share:.3f} of data parallel's / 2 (target within 10%)")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, "gpt2.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out, "gpt2.json"), "w") as f:
        json.dump({"rows": rows, "ratios": ratios, "best": best, "failed": failed,
                   "largest_loss_difference": worst, "loss_difference_at": where,
                   "loss_problems": problems, "loss_target_met": met}, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [f"{r['config']}\n{r['side']}" for r in rows]
    colors = ["tab:blue" if r["side"] == "dtensor" else "tab:orange" for r in rows]
    ax.bar(range(len(rows)), [r["tokens_per_second"] for r in rows], color=colors)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("tokens / s")
    ax.set_title("GPT-2 training, dtensor (blue) and PyTorch (orange), same run")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "gpt2.png"), dpi=120)


if __name__ == "__main__":
    main()
