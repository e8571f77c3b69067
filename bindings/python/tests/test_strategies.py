"""Strategies from Python: the custom training loop under each strategy against a numpy
re-implementation of the same steps, run/reduce/dataset semantics, the parameter server."""
import numpy as np
import pytest

import dtensor
from conftest import CLIENTS

STRATEGIES = [dtensor.OneDeviceStrategy, dtensor.MirroredStrategy,
              dtensor.MultiWorkerMirroredStrategy, dtensor.CentralStorageStrategy]


def numpy_sgd_losses(w, b, x, y, lr, steps):
    """Dense(1) with mean squared error, SGD: the loss of each step, computed by hand."""
    losses = []
    for _ in range(steps):
        pred = x @ w + b
        err = pred - y
        losses.append(float(np.mean(err ** 2)))
        n = x.shape[0]
        w = w - lr * (2.0 / n) * x.T @ err
        b = b - lr * (2.0 / n) * err.sum(axis=0)
    return losses


@pytest.mark.parametrize("cls", STRATEGIES)
def test_custom_training_loop(cls):
    """The tf.distribute guide's loop: Dense(1) on ones; every strategy gives the losses of
    the same steps computed in numpy from the same initial weights."""
    strategy = cls()
    with strategy.scope():
        model = dtensor.Sequential([dtensor.Dense(1)], input_features=3, dtype=np.float64,
                                   seed=7)
    w0, b0 = model.get_weights()
    rng = np.random.default_rng(0)
    x_host = rng.standard_normal((12, 3))
    y_host = rng.standard_normal((12, 1))
    want = numpy_sgd_losses(w0, b0, x_host, y_host, lr=0.1, steps=10)
    opt = dtensor.SGD(learning_rate=0.1)
    x, y = strategy.distribute_batch(x_host), strategy.distribute_batch(y_host)
    assert x.layout == strategy.input_layout(2)
    got = [model.train_step(x, y, "mean_squared_error", opt) for _ in range(10)]
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_replicas_and_layouts():
    mirrored = dtensor.MirroredStrategy()
    assert mirrored.num_replicas_in_sync == dtensor.num_local_devices()  # this client's
    mw = dtensor.MultiWorkerMirroredStrategy()
    assert mw.num_replicas_in_sync == dtensor.num_global_devices()
    assert mw.input_layout(2).sharding_specs == ["batch", "unsharded"]
    assert mw.variable_layout(2).is_fully_replicated()
    assert dtensor.OneDeviceStrategy().num_replicas_in_sync == 1
    assert dtensor.get_strategy().num_replicas_in_sync == 1
    with mw.scope():
        assert dtensor.get_strategy() is mw


def test_gradient_function(mesh_2d):
    """d/dx sum(x * x) = 2x, in x's layout."""
    f = dtensor.function(lambda x: dtensor.reduce_sum(x * x))
    x_host = np.arange(6, dtype=np.float64).reshape(3, 2)
    x = dtensor.dtensor_from_array(x_host, dtensor.Layout(["x", "y"], mesh_2d))
    grad = f.gradient(0, [0], x)
    value, dx = grad(x)
    assert float(dtensor.gather(value)) == (x_host ** 2).sum()
    assert dx.layout == x.layout
    np.testing.assert_array_equal(dtensor.gather(dx), 2 * x_host)


def test_parameter_server_needs_ps_tasks(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("DTENSOR_CLUSTER", f"chief=1,worker={CLIENTS - 1}" if CLIENTS > 1
                       else "worker=1")
    with pytest.raises(dtensor.DTensorError) as e:
        dtensor.ParameterServerStrategy()
    assert "ps" in str(e.value)


@pytest.mark.skipif(CLIENTS != 3, reason="needs 3 clients: chief, worker, ps")
def test_parameter_server_training(monkeypatch):
    """1 chief, 1 worker, 1 ps: steps scheduled by the chief run on the worker, whose updates
    go to the ps task; the loss falls as with mirrored training."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("DTENSOR_CLUSTER", "chief=1,worker=1,ps=1")
    s = dtensor.ParameterServerStrategy()
    assert s.task_type == ["chief", "worker", "ps"][dtensor.client_id()]
    with s.scope():
        model = dtensor.Sequential([dtensor.Dense(1)], input_features=1, seed=3)
    opt = dtensor.SGD(learning_rate=0.1)
    x_host = np.ones((4, 1), np.float32)
    x = y = None
    if s.task_type == "worker":
        x, y = s.distribute_batch(x_host), s.distribute_batch(x_host)

    def step():
        return model.train_step(x, y, "mean_squared_error", opt)

    coordinator = dtensor.ClusterCoordinator(s)
    values = [coordinator.schedule(step) for _ in range(8)]
    coordinator.join()
    losses = []
    if s.task_type == "chief":
        losses = [v.fetch() for v in values]
        assert all(v.worker == 0 for v in values)
    coordinator.shutdown()
    if s.task_type == "chief":
        assert losses[-1] < losses[0] * 0.5, losses


@pytest.mark.parametrize("cls", [dtensor.OneDeviceStrategy, dtensor.CentralStorageStrategy])
def test_variables_on_device_0(cls):
    """One device and central storage keep the variables on a 1-device mesh over global device
    0: only client 0 owns it, the other clients hold no device of it and still train, predict
    and read the weights (collectively)."""
    s = cls()
    owns = 1 if dtensor.client_id() == 0 else 0
    assert s.variable_layout(2).mesh.size == 1
    assert s.variable_layout(2).mesh.num_local_devices() == owns
    assert s.variable_layout(2).mesh.local_device_ids() == ([0] if owns else [])
    if cls is dtensor.OneDeviceStrategy:
        assert s.mesh.size == 1 and s.mesh.num_local_devices() == owns
        assert s.variable_layout(2).mesh == s.mesh
    else:
        assert s.mesh.size == dtensor.num_global_devices()
        assert s.mesh.num_local_devices() == dtensor.num_local_devices()
        assert s.variable_layout(2).mesh != s.mesh
    with s.scope():
        model = dtensor.Sequential([dtensor.Dense(1)], input_features=3, dtype=np.float64,
                                   seed=5)
    w0, b0 = model.get_weights()
    x_host = np.arange(18, dtype=np.float64).reshape(6, 3) / 10  # 6 rows: one per device
    x = s.distribute_batch(x_host)
    np.testing.assert_allclose(dtensor.gather(model(x)), x_host @ w0 + b0, rtol=1e-12)
    y_host = np.ones((6, 1))
    want = numpy_sgd_losses(w0, b0, x_host, y_host, lr=0.1, steps=3)
    opt = dtensor.SGD(learning_rate=0.1)
    got = [model.train_step(x, s.distribute_batch(y_host), "mean_squared_error", opt)
           for _ in range(3)]
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_adamw_against_numpy(mesh_2d):
    """AdamW (Keras's): decay by lr * weight_decay of the variable, then Adam's step; on a
    sharded variable, three updates against numpy."""
    w0 = np.linspace(-1, 1, 12).reshape(6, 2)
    grads = [np.cos(np.arange(12.0) + k).reshape(6, 2) for k in range(3)]
    v = dtensor.DVariable(dtensor.dtensor_from_array(w0, dtensor.Layout(["x", "y"], mesh_2d)))
    opt = dtensor.keras.optimizers.AdamW(learning_rate=0.1, weight_decay=0.2)
    w, m, s = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    for t, g in enumerate(grads, start=1):
        opt.apply_gradients([(dtensor.dtensor_from_array(g, v.layout), v)])
        w -= 0.1 * 0.2 * w
        m = 0.9 * m + 0.1 * g
        s = 0.999 * s + 0.001 * g * g
        w -= 0.1 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m / (np.sqrt(s) + 1e-7)
    np.testing.assert_allclose(dtensor.gather(v.read_value()), w, rtol=1e-12)
    with pytest.raises(ValueError, match="weight_decay"):
        dtensor.AdamW(weight_decay=0)
