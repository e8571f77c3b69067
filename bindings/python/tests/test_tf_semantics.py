"""What TensorFlow programs rely on beyond the ops: == with Python numbers, tf.Variable in every
strategy's scope, Python values converted as TensorFlow converts them (int32, float32), datasets
of Python values, map functions calling ops, Keras's input casting and regularizers, the
default strategy and TensorFlow's older names, the error classes, devices' names. numpy and
TensorFlow's documented results are the references."""
import json

import numpy as np
import pytest

import dtensor
from conftest import CLIENTS, DEVICES

PER_CLIENT = DEVICES // CLIENTS
keras = dtensor.keras


# ---- == and != compare values ------------------------------------------------------------------

def test_equality_compares_values(mesh_1d):
    a = np.array([3, 15, 7, 15, 0, 1], np.int32)
    t = dtensor.dtensor_from_array(a, dtensor.Layout(["x"], mesh_1d))
    np.testing.assert_array_equal(dtensor.gather(t == 15), a == 15)
    np.testing.assert_array_equal(dtensor.gather(t != 15), a != 15)
    np.testing.assert_array_equal(dtensor.gather(15 == t), a == 15)
    s = dtensor.reduce_sum(t)
    assert s == 41 and not s != 41  # a scalar result works in if and assert
    assert bool(s == 41) and not bool(s == 40)
    with pytest.raises(ValueError, match="ambiguous"):
        bool(t == 15)
    assert (t == None) is False and t != "text"  # noqa: E711 (other objects compare unequal)
    assert t in [t] and {t: 1}[t] == 1  # identity still finds it (hash by identity)
    v = dtensor.DVariable(np.int32(15), layout=dtensor.Layout.replicated(mesh_1d, 0))
    assert v == 15 and v.read_value() == 15 and not v != 15


# ---- tf.Variable in every strategy's scope -----------------------------------------------------

@pytest.mark.parametrize("make", [dtensor.MirroredStrategy, dtensor.MultiWorkerMirroredStrategy,
                                  dtensor.CentralStorageStrategy, dtensor.OneDeviceStrategy,
                                  dtensor.get_strategy])
def test_variable_of_a_python_float_in_each_scope(make):
    strategy = make()
    with strategy.scope():
        x = dtensor.Variable(1.)
    assert x.dtype == np.float32 and x.shape == ()
    if strategy is dtensor.get_strategy():  # the default strategy: a plain variable
        assert x.layout.mesh.size == 1
        assert repr(x) == "<dtensor.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>"
        assert strategy.experimental_local_results(x) == (x,)
        return
    assert x.layout == strategy.variable_layout(0)
    local = strategy.experimental_local_results(x)
    assert [float(t) for t in local] == [1.0] * len(local)
    if isinstance(strategy, (dtensor.MirroredStrategy, dtensor.MultiWorkerMirroredStrategy)):
        assert len(local) == strategy._local_replicas
        assert repr(x).startswith("MirroredVariable:{\n  0: <dtensor.Variable 'Variable:0' "
                                  "shape=() dtype=float32, numpy=1.0>")
    if x.layout.mesh.num_local_devices():
        assert x.device.endswith(f"/device:CPU:{x.layout.mesh.local_device_ids()[0] % PER_CLIENT}")


def test_variable_outside_any_scope_is_a_plain_variable():
    v = dtensor.Variable(1)  # a Python int: int32, as TensorFlow
    assert v.dtype == np.int32 and v.layout.mesh.size == 1
    job = "localhost" if CLIENTS == 1 else "worker"
    assert v.device == f"/job:{job}/replica:0/task:{dtensor.client_id()}/device:CPU:0"
    v.assign_add(41)
    assert v.numpy() == 42 and v.numpy().dtype == np.int32


# ---- Python values as TensorFlow converts them -------------------------------------------------

def test_conversions_follow_tensorflow():
    assert dtensor.constant(1).dtype == np.int32
    assert dtensor.constant(2**40).dtype == np.int64  # does not fit in int32
    assert dtensor.constant(1.5).dtype == np.float32
    assert dtensor.constant([1, 2.5]).dtype == np.float32
    assert dtensor.constant(True).dtype == np.bool_
    assert dtensor.constant(np.float64(1.5)).dtype == np.float64  # numpy keeps its dtype
    assert dtensor.constant(np.arange(3)).dtype == np.int64
    c = dtensor.constant(7, shape=(2, 3))
    np.testing.assert_array_equal(c.numpy(), np.full((2, 3), 7, np.int32))
    r = dtensor.range(6)
    assert r.dtype == np.int32 and r.numpy().tolist() == list(range(6))
    assert dtensor.range(0.0, 1.0, 0.25).dtype == np.float32
    assert dtensor.reshape(dtensor.range(6), (3, 2)).shape == dtensor.TensorShape([3, 2])
    assert dtensor.fill([2], 3).dtype == np.int32 and dtensor.fill([2], 3.0).dtype == np.float32
    assert dtensor.TensorShape([64, 32]).as_list() == [64, 32]
    assert str(dtensor.TensorShape([2])) == "(2,)"


def test_copy_to_mesh_of_python_values_and_regular_tensors(mesh_2d):
    """The DTensor guide's helper: copy_to_mesh of a list or of a regular tensor, relayout."""
    layout = dtensor.Layout(["x", "y"], mesh_2d)
    rep = dtensor.Layout.replicated(mesh_2d, 2)
    for value in ([[0, 1], [2, 3], [4, 5]], dtensor.reshape(dtensor.range(6), (3, 2))):
        t = dtensor.relayout(dtensor.copy_to_mesh(value, layout=rep), layout=layout)
        assert t.dtype == np.int32 and t.layout == layout
        np.testing.assert_array_equal(dtensor.gather(t), np.arange(6).reshape(3, 2))
    # a regular tensor next to a DTensor goes to its mesh, replicated (TensorFlow broadcasts it)
    t = dtensor.dtensor_from_array(np.ones((3, 2), np.int32), layout)
    np.testing.assert_array_equal(dtensor.gather(t + dtensor.constant([[1, 2]])),
                                  np.ones((3, 2)) + [[1, 2]])


def test_pack_takes_every_devices_components_as_one_client_would(mesh_1d):
    """The guide's pack of six components on a six-device mesh runs at any client count."""
    layout = dtensor.Layout([dtensor.UNSHARDED], mesh_1d)
    t = dtensor.pack([[0, 1]] * DEVICES, layout=layout)
    assert t.dtype == np.int32 and t.numpy().tolist() == [0, 1]
    comps = dtensor.unpack(t)
    job = "localhost" if CLIENTS == 1 else "worker"
    assert [c.device for c in comps] == [
        f"/job:{job}/replica:0/task:{dtensor.client_id()}/device:CPU:{k}"
        for k in range(PER_CLIENT)]
    assert comps[0].numpy().tolist() == [0, 1]


# ---- datasets of Python values -------------------------------------------------------------------

def test_datasets_convert_python_values():
    ds = dtensor.data.Dataset.from_tensor_slices([1, 2, 3, 4, 5])
    elements = list(ds)
    assert [int(e) for e in elements] == [1, 2, 3, 4, 5] and elements[0].dtype == np.int32
    x, y = next(iter(dtensor.data.Dataset.from_tensors(([1.], [1.])).repeat(100).batch(10)))
    assert x.shape == (10, 1) and y.shape == (10, 1) and x.dtype == np.float32
    assert next(iter(dtensor.data.Dataset.range(3))).dtype == np.int64  # tf.data's int64


def test_dataset_map_calls_ops():
    ds = dtensor.data.Dataset.from_tensor_slices(
        (np.arange(6, dtype=np.uint8).reshape(3, 2), [0, 1, 0]))
    ds = ds.map(lambda image, label: (dtensor.cast(image, dtensor.float32) / 255.0,
                                      dtensor.one_hot(label, 2)))
    images, labels = zip(*ds)
    np.testing.assert_allclose(np.stack(images), np.arange(6).reshape(3, 2) / 255.0, rtol=1e-6)
    assert images[0].dtype == np.float32
    np.testing.assert_array_equal(np.stack(labels), np.eye(2)[[0, 1, 0]])


# ---- Keras -------------------------------------------------------------------------------------

def test_fit_casts_float64_arrays_for_a_float32_model():
    """fit and evaluate on float64 numpy arrays give the losses of the same arrays in float32."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3))
    y = x @ np.array([[1.0], [-2.0], [0.5]])
    results = []
    for xs, ys in ((x, y), (x.astype(np.float32), y.astype(np.float32))):
        keras.Layer._count = 0
        strategy = dtensor.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = keras.Sequential([keras.layers.Dense(1, input_shape=(3,))])
            model.compile(loss="mse", optimizer="sgd")
        history = model.fit(xs, ys, epochs=2, batch_size=8, shuffle=False, verbose=0)
        results.append(history.history["loss"] + [model.evaluate(xs, ys, verbose=0)])
    assert results[0] == results[1]


def test_regularization_losses_and_training_argument():
    """Dense(kernel_regularizer=L2(l)): model.losses holds l * sum(kernel^2) of the current
    kernel; model(x, training=True) is model(x)."""
    strategy = dtensor.MirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(
            2, input_shape=(3,), kernel_regularizer=keras.regularizers.L2(0.5),
            bias_regularizer=keras.regularizers.L1(0.25))])
    kernel, bias = model.get_weights()
    losses = model.losses
    assert len(losses) == 2
    np.testing.assert_allclose(float(losses[0]), 0.5 * (kernel ** 2).sum(), rtol=1e-6)
    np.testing.assert_allclose(float(losses[1]), 0.25 * np.abs(bias).sum(), rtol=1e-6)
    x = np.ones((4, 3), np.float32)
    np.testing.assert_array_equal(dtensor.gather(model(x, training=True)),
                                  dtensor.gather(model(x)))
    np.testing.assert_allclose(float(dtensor.add_n(losses)),
                               0.5 * (kernel ** 2).sum() + 0.25 * np.abs(bias).sum(), rtol=1e-6)


@pytest.mark.parametrize("make", [dtensor.MirroredStrategy, dtensor.CentralStorageStrategy,
                                  dtensor.MultiWorkerMirroredStrategy, dtensor.get_strategy])
def test_fit_adds_the_regularization_losses(make):
    """The guide's model (Dense(1), kernel_regularizer=L2) fit on ones: every strategy gives
    Keras's losses, recomputed here (MSE + l2 w^2, SGD 0.01, each batch's loss before its
    update, an epoch's loss their mean)."""
    keras.Layer._count = 0
    with make().scope():
        model = keras.Sequential([keras.layers.Dense(
            1, input_shape=(1,), kernel_regularizer=keras.regularizers.L2(0.1))])
        model.compile(loss="mse", optimizer="sgd")
    (kernel, bias) = model.get_weights()
    w, b = float(kernel[0, 0]), float(bias[0])
    want = []
    for _ in range(2):
        losses = []
        for _ in range(3):  # 12 rows, batches of 4
            err = w + b - 1.0
            losses.append(err * err + 0.1 * w * w)
            w, b = w - 0.01 * (2 * err + 0.2 * w), b - 0.01 * 2 * err
        want.append(np.mean(losses))
    history = model.fit(np.ones((12, 1)), np.ones((12, 1)), epochs=2, batch_size=4, verbose=0)
    np.testing.assert_allclose(history.history["loss"], want, rtol=1e-5)


def test_compute_average_loss_defaults_to_the_global_batch():
    """Inside strategy.run the per-replica batch times the replicas in sync; outside, the
    batch itself (TensorFlow's default); scale_regularization_loss divides by the replicas."""
    strategy = dtensor.MirroredStrategy()
    n = strategy.num_replicas_in_sync
    batch = next(iter(strategy.experimental_distribute_dataset(
        dtensor.data.Dataset.from_tensors(np.ones((2 * n,), np.float32)).repeat(1))))
    per = strategy.run(lambda b: dtensor.nn.compute_average_loss(b), args=(batch,))
    total = strategy.reduce("SUM", per, axis=None)
    assert float(total) == pytest.approx(1.0)  # sum of 2n ones / (2 n)
    reg = strategy.run(lambda: dtensor.nn.scale_regularization_loss(dtensor.constant(3.0)))
    assert float(strategy.reduce("SUM", reg, axis=None)) == pytest.approx(3.0)
    assert float(dtensor.nn.compute_average_loss(np.ones(5, np.float32))) == pytest.approx(1.0)
    w = dtensor.nn.compute_average_loss(np.ones(4, np.float32), sample_weight=0.5,
                                        global_batch_size=8)
    assert float(w) == pytest.approx(0.25)


def test_softmax_cross_entropy_with_logits():
    logits = np.array([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]], np.float32)
    labels = np.array([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]], np.float32)
    z = logits - logits.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    got = dtensor.nn.softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    np.testing.assert_allclose(got.numpy(), -(labels * logp).sum(1), rtol=1e-6)
    got = dtensor.nn.sparse_softmax_cross_entropy_with_logits(labels=[1, 2], logits=logits)
    np.testing.assert_allclose(got.numpy(), -logp[[0, 1], [1, 2]], rtol=1e-6)


# ---- strategies: the default one, older names, hints, the cluster ----------------------------

def test_default_strategy_is_a_pass_through():
    default = dtensor.get_strategy()
    assert default.run(lambda: 42) == 42
    assert default.reduce("SUM", 1., axis=None) == 1.0
    assert dtensor.distribute.get_replica_context().num_replicas_in_sync == 1
    assert not dtensor.in_cross_replica_context() and not dtensor.distribute.has_strategy()


def test_older_names_and_nccl_as_a_hint():
    s = dtensor.MirroredStrategy(cross_device_ops=dtensor.NcclAllReduce())  # CPU: the ring
    per = s.experimental_run_v2(lambda: dtensor.constant(2.0))
    assert float(s.reduce(dtensor.ReduceOp.SUM, per, axis=None)) == 2.0 * s.num_replicas_in_sync
    mw = dtensor.distribute.experimental.MultiWorkerMirroredStrategy(
        communication=dtensor.distribute.experimental.CollectiveCommunication.NCCL)
    assert mw.num_replicas_in_sync == DEVICES
    assert dtensor.distribute.experimental.CollectiveCommunication is \
        dtensor.CommunicationImplementation
    assert s.experimental_distribute_datasets_from_function.__func__ is \
        dtensor.Strategy.distribute_datasets_from_function


def test_cluster_spec(monkeypatch):
    config = {"cluster": {"worker": ["host1:port", "host2:port", "host3:port"],
                          "ps": ["host4:port", "host5:port"]},
              "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    resolver = dtensor.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    assert spec.as_dict() == config["cluster"] and spec == config["cluster"]
    assert spec.num_tasks("worker") == 3 and spec.task_address("ps", 1) == "host5:port"
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert sorted(spec.jobs) == ["ps", "worker"]


# ---- what TensorFlow users print and catch -----------------------------------------------------

def test_error_classes_are_the_librarys(mesh_2d):
    t = dtensor.dtensor_from_array(np.ones((3, 2)), dtensor.Layout(["x", "y"], mesh_2d))
    with pytest.raises(dtensor.errors.UnimplementedError):
        t.numpy()
    with pytest.raises(dtensor.DTensorError):
        t.numpy()
    with pytest.raises(dtensor.errors.InvalidArgumentError) as e:
        dtensor.matmul(t, t)  # [3,2] @ [3,2]
    assert isinstance(e.value, dtensor.DTensorError) and isinstance(e.value, ValueError)
    assert e.value.status == "DT_ERR_SHAPE" and e.value.message == str(e.value)
    for cls in (dtensor.errors.OpError, dtensor.errors.NotFoundError,
                dtensor.errors.OutOfRangeError, dtensor.errors.FailedPreconditionError):
        assert issubclass(cls, dtensor.DTensorError)
    with pytest.raises(IndexError):  # Python's protocol too
        t[7]
    with pytest.raises(dtensor.errors.InvalidArgumentError):
        t[7]


def test_config_devices_and_handle(mesh_1d):
    assert [d.name for d in dtensor.config.list_physical_devices("CPU")] == \
        ["/physical_device:CPU:0"]
    logical = dtensor.config.list_logical_devices("CPU")
    assert len(logical) == PER_CLIENT and all(d.device_type == "CPU" for d in logical)
    cpu = dtensor.config.list_physical_devices("CPU")[0]
    # the runtime runs: the same count is accepted, another refused as TensorFlow refuses it
    dtensor.config.set_logical_device_configuration(
        cpu, [dtensor.config.LogicalDeviceConfiguration()] * PER_CLIENT)
    with pytest.raises(RuntimeError, match="cannot be modified after being initialized"):
        dtensor.config.set_logical_device_configuration(
            cpu, [dtensor.config.LogicalDeviceConfiguration()] * (PER_CLIENT + 1))
    v = dtensor.DVariable(np.zeros((2, 2), np.float32),
                          layout=dtensor.Layout.replicated(mesh_1d, 2))
    assert "handle 'Variable' shape=(2, 2)" in repr(v.handle)
    assert dtensor.fetch_layout(v) == v.layout
    assert dtensor.__version__ == "0.1.0"
