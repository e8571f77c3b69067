"""benchmarks/gpt2_report.py's loss-curve verdict (target: every configuration within 1e-4
relative of every other over every step) on made-up gpt2.csv files with known answers: the
difference between two rows neither of which is the first, a loss that is not finite, a row
that lacks steps and a configuration that failed each miss the target, and are named."""
import json
import pathlib
import subprocess
import sys

import pytest

from conftest import CLIENTS

pytestmark = pytest.mark.skipif(CLIENTS > 1, reason="a script of one process")

REPORT = pathlib.Path(__file__).resolve().parents[3] / "benchmarks" / "gpt2_report.py"


def report(tmp_path, rows, failed=()):
    """gpt2.json of the report on rows (config, side, losses) and failed (config, side)."""
    with open(tmp_path / "gpt2.csv", "w") as f:
        for config, side, losses in rows:
            memory = "1000,2000,0.5" if side == "dtensor" else ",,"
            f.write(f"{config},{side},2,2,100.0,50.0,{memory}," +
                    ",".join(str(v) for v in losses) + "\n")
    if failed:
        (tmp_path / "failed.csv").write_text("".join(f"{c},{s}\n" for c, s in failed))
    r = subprocess.run([sys.executable, str(REPORT), str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads((tmp_path / "gpt2.json").read_text()), r.stdout


def test_curves_of_each_other(tmp_path):
    """Rows 2 and 3 are each within 8e-5 of row 1 but 1.5e-4 from each other, at step 1."""
    got, text = report(tmp_path, [("1proc", "dtensor", [5.0, 1.0]),
                                  ("1proc", "torch-eager", [5.0, 1.00008]),
                                  ("n2-data", "dtensor", [5.0001, 0.99993])])
    assert got["largest_loss_difference"] == pytest.approx((1.00008 - 0.99993) / 0.99993)
    assert got["loss_difference_at"] == ["1proc torch-eager", "n2-data dtensor", 1]
    assert not got["loss_target_met"] and "target 1e-4: NO" in text


def test_curves_within_the_target(tmp_path):
    got, text = report(tmp_path, [("1proc", "dtensor", [5.0, 1.0]),
                                  ("1proc", "torch-eager", [5.0, 1.00002]),
                                  ("n2-data", "dtensor", [5.0002, 0.99999])])
    assert got["largest_loss_difference"] == pytest.approx(0.0002 / 5.0)
    assert got["loss_target_met"] and "target 1e-4: yes" in text


@pytest.mark.parametrize("bad,problem", [
    ([5.0, float("nan")], "n2-data dtensor: loss nan at step 1"),
    ([5.0, float("inf")], "n2-data dtensor: loss inf at step 1"),
    ([5.0], "n2-data dtensor has 1 of 2 steps"),
])
def test_a_bad_curve_misses_the_target(tmp_path, bad, problem):
    got, text = report(tmp_path, [("1proc", "dtensor", [5.0, 1.0]),
                                  ("n2-data", "dtensor", bad)])
    assert got["largest_loss_difference"] == 0.0
    assert got["loss_problems"] == [problem] and problem in text
    assert not got["loss_target_met"]


def test_a_failed_configuration_is_named(tmp_path):
    got, text = report(tmp_path, [("n2-fsdp", "dtensor", [5.0, 1.0]),
                                  ("n2-data", "torch-ddp", [5.0, 1.0])],
                       failed=[("n2-fsdp", "torch-fsdp"), ("n2-data", "dtensor")])
    assert got["failed"] == [["n2-fsdp", "torch-fsdp"], ["n2-data", "dtensor"]]
    assert not got["loss_target_met"] and got["largest_loss_difference"] == 0.0
    assert "| n2-fsdp | 100.0 | torch-fsdp | failed |" in text
    assert "| n2-fsdp | 100.0 | |" not in text  # one line for it
    assert "| n2-data | failed | torch-ddp | 100.0 |" in text
    assert "failed (no row; see their logs): n2-fsdp torch-fsdp, n2-data dtensor" in text
