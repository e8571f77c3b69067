"""The tf.distribute and DTensor tutorials' programs as TensorFlow users type them
(examples/guide_dtensor_ml.py, guide_custom_training.py, guide_keras.py,
guide_multi_worker_ctl/, guide_parameter_server_training.py: `tf.` -> `dtensor.`, GPUs -> CPU
devices, downloads -> synthetic data of the same shapes) run as one client, at `mpiexec.mpich
-n 2` and, for the parameter-server tutorial, on a cluster of 6 tasks, each in a directory of
its own. The DTensor tutorial's losses are recomputed in numpy; for the others, whose data is
shuffled at random (as TensorFlow's), the checks are what TensorFlow guarantees: the losses
fall, a restored model evaluates as the one saved, synchronous workers print the same numbers,
the learning-rate schedule is followed."""
import math
import os
import re

import numpy as np
import pytest

import dtensor
from conftest import CLIENTS
from examples_run import EXAMPLES, run

pytestmark = pytest.mark.skipif(CLIENTS > 1, reason="the examples start their own clients")


def floats(pattern, text):
    return [float(v) for v in re.findall(pattern, text, re.M)]


# ---- the DTensor ML tutorial: one SGD run over four layouts, recomputed in numpy ----------------

def ml_reference():
    """The tutorial's MLP (Dense 1200 -> 48 relu, batch normalization, Dense 48 -> 2) trained
    by SGD (lr 0.01) on the sum of sparse softmax cross entropies, 60 steps (three models of
    two epochs, each restored from the previous one's checkpoint): each epoch's (loss per
    example, accuracy) as Keras's Progbar averages them (the finalizing update counted once
    more). The initial weights are the stateless normal draws of the tutorial's seeds (the
    same global tensor under any layout)."""
    def init(shape, seed):
        return dtensor.gather(dtensor.random.stateless_normal(shape, seed=seed)).astype(
            np.float64)
    rng = np.random.default_rng(3)
    x_all = rng.random((640, 1200)).astype(np.float32) * (rng.random((640, 1200)) < 0.05)
    y_all = (x_all[:, :600].sum(1) > x_all[:, 600:].sum(1)).astype(np.int64)
    w1, b1, w2, b2 = init([1200, 48], (1, 2)), np.zeros(48), init([48, 2], (3, 4)), np.zeros(2)
    epochs = []
    for _ in range(6):
        steps = []
        for i in range(0, 640, 64):
            x, y = x_all[i:i + 64].astype(np.float64), y_all[i:i + 64]
            h = np.maximum(x @ w1 + b1, 0)
            inv = 1 / np.sqrt(h.var(0) + 1e-5)
            z = (h - h.mean(0)) * inv
            logits = z @ w2 + b2
            m = logits.max(1, keepdims=True)
            lse = m[:, 0] + np.log(np.exp(logits - m).sum(1))
            p = np.exp(logits - lse[:, None])
            p[np.arange(64), y] -= 1
            gz = p @ w2.T
            gh = inv * (gz - gz.mean(0) - z * (gz * z).mean(0)) * (h > 0)
            steps.append(((lse - logits[np.arange(64), y]).sum() / 64,
                          1 - (logits.argmax(-1) != y).sum() / 64))
            w1, b1 = w1 - 0.01 * x.T @ gh, b1 - 0.01 * gh.sum(0)
            w2, b2 = w2 - 0.01 * z.T @ p, b2 - 0.01 * p.sum(0)
        epochs.append(np.mean(steps + steps[-1:], axis=0))
    return np.array(epochs)


@pytest.mark.parametrize("clients", [1, 2])
def test_dtensor_ml_tutorial(tmp_path, clients):
    outs = run(tmp_path, "guide_dtensor_ml.py", clients)
    want = ml_reference()
    for out in outs[:1]:  # the progress bar prints on client 0
        got = np.array(re.findall(r"^10/10 .* - loss: ([\d.]+) - accuracy: ([\d.]+)$", out,
                                  re.M), dtype=float)
        assert got.shape == (6, 2), out
        np.testing.assert_allclose(got, want, atol=1.5e-4)
        assert out.count("Restoring a checkpoint") == 2 and "New training" in out


# ---- the custom training tutorial -----------------------------------------------------------------

@pytest.mark.parametrize("clients", [1, 2])
def test_custom_training_tutorial(tmp_path, clients):
    env = {"DTENSOR_EXAMPLE_TRAIN": "160", "DTENSOR_EXAMPLE_TEST": "48",
           "DTENSOR_EXAMPLE_BATCH": "8", "DTENSOR_EXAMPLE_EPOCHS": "2"}
    outs = run(tmp_path, "guide_custom_training.py", clients, env=env)
    saved = None
    for out in outs:
        assert "Number of devices: 2" in out
        epochs = re.findall(r"^Epoch (\d+), Loss: DTensor\(([\d.e-]+), .*Accuracy: DTensor\("
                            r"([\d.e-]+), .*(?:Test Accuracy: DTensor\(([\d.e-]+),)?", out, re.M)
        assert len(epochs) == 6, out
        first = re.findall(r"^Epoch \d+, Loss: DTensor\(([\d.e-]+),.*Test Accuracy: DTensor\("
                           r"([\d.e-]+),", out, re.M)
        losses = [float(v) for v, _ in first]
        assert len(losses) == 2 and losses[1] < losses[0]
        # the model restored (without the strategy) from the last checkpoint, saved after
        # epoch 1, has the test accuracy printed then; every client trains its own model
        # (each its own MirroredStrategy, shuffling at random) and saves it to the same path,
        # which holds client 0's, as the file the last of TensorFlow's writers leaves holds
        # one client's model: every client restores client 0's
        saved = float(first[0][1]) if saved is None else saved
        restored = floats(r"without strategy: DTensor\(([\d.]+),", out)
        assert restored == [saved]
        for _, loss, acc, _ in epochs:
            assert math.isfinite(float(loss)) and 0 <= float(acc) <= 100
        # the other loops go on training the same model
        assert float(epochs[-1][1]) < losses[0]


# ---- the Keras tutorial ---------------------------------------------------------------------------

@pytest.mark.parametrize("clients", [1, 2])
def test_keras_tutorial(tmp_path, clients):
    env = {"DTENSOR_EXAMPLE_TRAIN": "192", "DTENSOR_EXAMPLE_TEST": "64",
           "DTENSOR_EXAMPLE_BATCH": "16", "DTENSOR_EXAMPLE_EPOCHS": "4"}
    outs = run(tmp_path, "guide_keras.py", clients, env=env)
    out = outs[0]
    # the decay schedule: 1e-3 for epochs 0-2, 1e-4 from epoch 3
    rates = floats(r"Learning rate for epoch \d+ is ([\d.e-]+)", out)
    np.testing.assert_allclose(rates, [1e-3, 1e-3, 1e-3, 1e-4], rtol=1e-6)
    losses = floats(r"^4/4 - .* - loss: ([\d.]+)", out)
    if not losses:
        losses = floats(r"^\d+/\d+ - [\d.]+s - loss: ([\d.]+)", out)
    assert len(losses) == 4 and losses[-1] < losses[0], out
    # the model restored from the last checkpoint, the saved one loaded without and with the
    # strategy: the same evaluation
    evals = re.findall(r"Eval loss: ([\d.e-]+), Eval [Aa]ccuracy: ([\d.e-]+)", out)
    assert len(evals) == 3
    np.testing.assert_allclose(np.array(evals, float), np.array(evals[:1] * 3, float),
                               rtol=1e-5)
    assert sorted(os.listdir(tmp_path / "training_checkpoints")) == \
        [f"ckpt_{e:04d}.weights.h5" for e in range(1, 5)]
    assert os.listdir(tmp_path / "logs" / "train")
    assert (tmp_path / "my_model.keras").is_file()


# ---- the multi-worker custom loop tutorial ----------------------------------------------------

def worker_configs(n):
    cluster = {"worker": [f"localhost:{12345 + i}" for i in range(n)]}
    return [{"cluster": cluster, "task": {"type": "worker", "index": i}} for i in range(n)]


@pytest.mark.parametrize("workers", [1, 2])
def test_multi_worker_custom_loop_tutorial(tmp_path, workers):
    env = {"DTENSOR_EXAMPLE_TRAIN": "640", "DTENSOR_EXAMPLE_BATCH": "16",
           "DTENSOR_EXAMPLE_STEPS": "6", "PYTHONPATH": os.pathsep.join(
               [str(EXAMPLES / "guide_multi_worker_ctl"), os.environ.get("PYTHONPATH", "")])}
    outs = run(tmp_path, "guide_multi_worker_ctl/main.py", tasks=worker_configs(workers),
               env=env)
    lines = [re.findall(r"^Epoch: (\d), accuracy: ([\d.]+), train_loss: ([\d.]+)\.$", o, re.M)
             for o in outs]
    assert all(len(lw) == 3 for lw in lines), outs
    assert all(lw == lines[0] for lw in lines)  # synchronous workers: the same numbers
    assert [e for e, _, _ in lines[0]] == ["0", "1", "2"]
    loss = [float(v) for _, _, v in lines[0]]
    assert loss[2] < loss[0]


# ---- the parameter-server training tutorial ---------------------------------------------------

def ps_configs(workers, ps):
    cluster = {"chief": ["localhost:2220"],
               "worker": [f"localhost:{2230 + i}" for i in range(workers)],
               "ps": [f"localhost:{2240 + i}" for i in range(ps)]}
    return [{"cluster": cluster, "task": {"type": t, "index": i}}
            for t, n in (("chief", 1), ("worker", workers), ("ps", ps)) for i in range(n)]


def test_parameter_server_training_tutorial(tmp_path):
    """The tutorial's cluster: a chief, 3 workers, 2 ps tasks (its checks of the embedding's
    two shards need 2 ps tasks, as TensorFlow's)."""
    outs = run(tmp_path, "guide_parameter_server_training.py", tasks=ps_configs(3, 2))
    fit = floats(r"^20/20 - [\d.]+s - loss: ([\d.]+)$", outs[0])
    assert len(fit) == 5 and fit[-1] < fit[0]
    for out in outs:  # every task runs the program and sees the same shared values
        assert "/job:ps/replica:0/task:0/device:CPU:0\n/job:ps/replica:0/task:1/device:CPU:0" \
            in out
        acc = floats(r"^Finished epoch \d, accuracy is ([\d.]+)\.$", out)
        assert len(acc) == 4 and all(0 <= a <= 1 for a in acc)
        assert acc == floats(r"^Finished epoch \d, accuracy is ([\d.]+)\.$", outs[0])
        final = floats(r"^Final loss is ([\d.e+-]+|nan|inf)$", out)
        assert final == floats(r"^Final loss is ([\d.e+-]+)$", outs[0]) and \
            math.isfinite(final[0])
        evals = floats(r"^Evaluation accuracy: ([\d.]+)$", out)
        assert len(evals) == 2 and all(0 <= a <= 1 for a in evals)
