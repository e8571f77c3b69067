"""The guides' programs as TensorFlow users type them (examples/guide_*.py: `tf.` -> `dtensor.`,
GPUs -> CPU devices) run as one client, at `mpiexec.mpich -n 2` and, for the parameter-server
talk, on clusters of 3 and 6 tasks, and give TensorFlow's numbers: the DTensor guide's values,
Keras's and the custom loop's losses recomputed here in numpy from the printed initial weights
with TensorFlow's update rule, the Strategy API's documented results, 15 on every task.

Each example runs in processes of its own, started from the singleton run (a test cannot start
mpiexec from inside one); every client's output goes to a file of its own."""
import json
import re

import numpy as np
import pytest

from conftest import CLIENTS
from examples_run import run

pytestmark = pytest.mark.skipif(CLIENTS > 1, reason="the examples start their own clients")


def checks(text):
    """The example's "check: NAME VALUE" lines as {NAME: VALUE}."""
    found = {}
    for line in text.splitlines():
        m = re.match(r"check: ([a-zA-Z_ -]+?) ([\[\-\d{D].*)$", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


# ---- the DTensor guide ------------------------------------------------------------------------

@pytest.mark.parametrize("clients", [1, 2])
def test_dtensor_guide(tmp_path, clients):
    outs = run(tmp_path, "guide_dtensor.py", clients)
    per = 6 // clients
    job = "localhost" if clients == 1 else "worker"
    for c, out in enumerate(outs):
        device = f"/job:{job}/replica:0/task:{c}/device:CPU:"
        # my_first_dtensor: [0, 1] replicated, int32 as TensorFlow converts Python ints
        assert "global shape: (2,)" in out and "dtype: int32" in out
        for k in range(per):
            assert f"Device: {device}{k} , [0 1]" in out, out
        # fully sharded 3x2 on the 3x2 mesh: device d holds element d of range(6)
        for k in range(per):
            assert f"Device: {device}{k} , [[{c * per + k}]]" in out, out
        assert out.count("got an error as expected") == 2
        assert "Sharding spec: ['unsharded', 'unsharded']" in out
        assert "Sharding spec: ['y', 'unsharded']" in out
        # the replicated matmul: [[20 14] [56 41]] on every device
        rows = re.findall(r"device:CPU:\d \[\[(\d+) (\d+)\]\n \[(\d+) (\d+)\]\]", out)
        assert rows and all(r == ("20", "14", "56", "41") for r in rows), out
        # the y-sharded product: rows 0 and 1 on alternate devices
        halves = re.findall(r"device:CPU:(\d) \[\[(\d+) (\d+)\]\]\n", out)
        assert {(int(d) + c * per) % 2: (a, b) for d, a, b in halves} == \
            {0: ("20", "14"), 1: ("56", "41")}, out
        assert "<dtensor.Variable handle 'Variable' shape=(64, 32)" in out
        assert out.strip().endswith("exception raised")


# ---- the tf.distribute guide --------------------------------------------------------------------

def keras_sgd_mse(w, b, steps, lr=0.01, l2=1e-4):
    """Dense(1) on x = 1, y = 1 batches, MSE plus l2 * w^2, Keras's SGD: each step's loss
    (before its update) and the weights after."""
    losses = []
    for _ in range(steps):
        err = w + b - 1.0
        losses.append(err * err + l2 * w * w)
        w, b = w - lr * (2 * err + 2 * l2 * w), b - lr * 2 * err
    return losses, w, b


def loop_sgd_bce(w, b, steps, lr=0.01, l2=1e-4):
    """The guide's custom loop: binary cross entropy from logits of x = 1 against y = 1,
    compute_average_loss over the global batch, the L2 term scaled by the replicas (summed
    back over them), SGD: each step's reduced loss."""
    losses = []
    for _ in range(steps):
        z = w + b
        losses.append(np.log1p(np.exp(-z)) + l2 * w * w)
        g = -1.0 / (1.0 + np.exp(z))
        w, b = w - lr * (g + 2 * l2 * w), b - lr * g
    return losses


@pytest.mark.parametrize("clients", [1, 2])
def test_distributed_training_guide(tmp_path, clients):
    for out in run(tmp_path, "guide_distributed_training.py", clients):
        got = checks(out)
        assert got["reduce"] == "1.0"
        assert "<dtensor.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>" in out
        assert got["replicas"] == "2"
        (kernel, bias) = json.loads(got["fit initial"])
        w, b = np.float64(kernel[0][0]), np.float64(bias[0])
        # fit on the dataset: 2 epochs of 10 batches; evaluate; fit on numpy arrays
        losses, w, b = keras_sgd_mse(w, b, 20)
        want = [np.mean(losses[:10]), np.mean(losses[10:])]
        np.testing.assert_allclose(json.loads(got["fit dataset"]), want, rtol=1e-5)
        err = w + b - 1.0
        np.testing.assert_allclose(float(got["evaluate"]), err * err + 1e-4 * w * w, rtol=1e-5)
        losses, w, b = keras_sgd_mse(w, b, 20)
        np.testing.assert_allclose(json.loads(got["fit numpy"]),
                                   [np.mean(losses[:10]), np.mean(losses[10:])], rtol=1e-5)
        # the custom loop: 100 steps over the distributed dataset, then 10 by iterator
        (kernel, bias) = json.loads(got["loop initial"])
        want = loop_sgd_bce(np.float64(kernel[0][0]), np.float64(bias[0]), 110)
        printed = [float(v) for v in re.findall(r"^DTensor\(([-\d.e]+), layout=''", out, re.M)]
        np.testing.assert_allclose(printed, want, rtol=1e-5)
        assert json.loads(got["TF_CONFIG"].replace("'", '"')) == {
            "worker": ["host1:port", "host2:port", "host3:port"],
            "ps": ["host4:port", "host5:port"]}


# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("clients", [1, 2])
def test_strategy_api(tmp_path, clients):
    for out in run(tmp_path, "guide_strategy_api.py", clients):
        got = checks(out)
        assert got["default run"] == "42"
        assert got["default replicas"] == "1"
        assert "MirroredVariable:{\n  0: <dtensor.Variable 'Variable:0' shape=() dtype=float32, " \
               "numpy=1.0>,\n  1: <dtensor.Variable 'Variable/replica_1:0' shape=() " \
               "dtype=float32, numpy=1.0>\n}" in out
        assert got["local results"] == "[1.0, 1.0]"
        assert got["reduce ids"].startswith("DTensor(1, ") and "int32" in got["reduce ids"]
        assert got["run doubled"] == "[4, 4]"
        assert got["all_reduce"] == "[3.0, 3.0]"
        assert got["reduce mean"].startswith("DTensor(3., ")
        assert got["multi-worker replicas"] == str(2 * clients)
        assert got["sum over the global batch"].startswith("DTensor(4., ")


# ---- the parameter-server talk -------------------------------------------------------------------

def tf_configs(cluster):
    spec = {job: [f"localhost:{2222 + 10 * j + i}" for i in range(n)]
            for j, (job, n) in enumerate(cluster)}
    return [{"cluster": spec, "task": {"type": job, "index": i}}
            for job, n in cluster for i in range(n)]


@pytest.mark.parametrize("cluster, launch", [
    ([("chief", 1), ("worker", 1), ("ps", 1)], "TF_CONFIG"),
    ([("chief", 1), ("worker", 3), ("ps", 2)], "TF_CONFIG"),
    ([("chief", 1), ("worker", 3), ("ps", 2)], "DTENSOR_CLUSTER"),
])
def test_parameter_server_talk_gives_15_on_every_task(tmp_path, cluster, launch):
    if launch == "TF_CONFIG":
        outs = run(tmp_path, "guide_parameter_server.py", tasks=tf_configs(cluster))
    else:
        spec = ",".join(f"{job}={n}" for job, n in cluster)
        outs = run(tmp_path, "guide_parameter_server.py", sum(n for _, n in cluster),
                   env={"DTENSOR_CLUSTER": spec})
    tasks = [f"{job}:{i}" for job, n in cluster for i in range(n)]
    for task, out in zip(tasks, outs):
        assert "<dtensor.Variable 'Variable:0' shape=() dtype=int32, numpy=15>" in out, out
        assert f"check: {task} reads 15 from /job:ps/replica:0/task:0/device:CPU:0" in out, out
