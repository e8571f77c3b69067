"""tf.distribute's contract from Python: run once per replica with per-replica values,
reduce, all_reduce and merge_call, distributed datasets with uneven batches, GradientTape,
apply_gradients, the guide's custom training loop and Keras fit under every strategy, all
against numpy references. Six devices in all (conftest), at 1, 2 and 3 clients."""
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import dtensor
from conftest import CLIENTS
from examples_run import clean_env
from dtensor import keras

ROOT = Path(__file__).resolve().parents[3]


def rows(n, cols=3, offset=0.0):
    return (np.arange(n * cols, dtype=np.float32).reshape(n, cols) + offset) / 10


def test_run_calls_fn_once_per_replica_with_its_rows():
    s = dtensor.MultiWorkerMirroredStrategy()
    r = s.num_replicas_in_sync
    assert r == 6
    x = rows(8)  # 8 rows over 6 replicas: 2, 2, 1, 1, 1, 1 (TensorFlow's split)
    batch = next(iter(s.experimental_distribute_dataset([x])))
    assert isinstance(batch, dtensor.PerReplica)
    assert len(batch.values) == dtensor.num_local_devices()
    calls, threads = [], set()

    def fn(t):
        ctx = dtensor.get_replica_context()
        calls.append(ctx.replica_id_in_sync_group)
        threads.add(threading.get_ident())
        assert t.layout.mesh.size == 1
        return t * 2.0

    out = s.run(fn, args=(batch,))
    mine = [k for k in range(r) if s._first_replica <= k < s._first_replica + s._local_replicas]
    assert calls == mine
    sizes = [2, 2, 1, 1, 1, 1]
    starts = np.cumsum([0] + sizes)
    for k, v in zip(mine, out.values):
        np.testing.assert_array_equal(v.numpy(), 2 * x[starts[k]:starts[k + 1]])
    assert [v.shape[0] for v in s.experimental_local_results(out)] == [sizes[k] for k in mine]
    # TensorFlow's contexts: the default replica context outside any scope, cross-replica
    # context in a strategy's scope outside run
    assert not dtensor.in_cross_replica_context()
    with s.scope():
        assert dtensor.in_cross_replica_context()


def test_reduce_per_replica_values_scalars_and_axis():
    s = dtensor.MultiWorkerMirroredStrategy()
    x = rows(9)  # uneven: 2, 2, 2, 1, 1, 1
    batch = next(iter(s.experimental_distribute_dataset([x])))
    sums = s.run(lambda t: dtensor.reduce_sum(t), args=(batch,))
    total = s.reduce(dtensor.ReduceOp.SUM, sums, axis=None)
    assert total.layout.is_fully_replicated()
    np.testing.assert_allclose(float(total), x.sum(), rtol=1e-6)
    np.testing.assert_allclose(float(s.reduce("MEAN", sums, axis=None)), x.sum() / 6, rtol=1e-6)
    # axis=0: along the batch, MEAN over the 9 rows (not the 6 replicas)
    np.testing.assert_allclose(s.reduce("SUM", batch, axis=0).numpy(), x.sum(0), rtol=1e-6)
    np.testing.assert_allclose(s.reduce("MEAN", batch, axis=0).numpy(), x.mean(0), rtol=1e-6)
    # a value that is the same on every replica: MEAN gives it back, SUM is refused (as TF)
    assert s.reduce("MEAN", 3.0, axis=None) == 3.0
    with pytest.raises(ValueError, match="non-distributed"):
        s.reduce("SUM", 3.0, axis=None)
    with pytest.raises(ValueError, match="reduce_op"):
        s.reduce("MAX", sums, axis=None)
    # per-replica values of different shapes cannot be summed elementwise: every client raises
    with pytest.raises((ValueError, dtensor.DTensorError), match="shape"):
        s.reduce("SUM", batch, axis=None)


def test_all_reduce_and_merge_call_inside_run():
    s = dtensor.MultiWorkerMirroredStrategy()
    ids = s.experimental_distribute_values_from_function(
        lambda ctx: np.float32(ctx.replica_id_in_sync_group))

    def fn(v):
        ctx = dtensor.get_replica_context()
        total = ctx.all_reduce("SUM", v)
        merged = ctx.merge_call(lambda strategy, value: strategy.reduce("MEAN", value, None),
                                args=(v,))
        return total, merged

    total, merged = s.run(fn, args=(ids,))
    for t in total.values:
        assert float(t) == sum(range(6))
    for m in merged.values:
        assert float(m) == pytest.approx(sum(range(6)) / 6)


def test_replicas_reaching_different_sync_points_raise():
    s = dtensor.MirroredStrategy()
    if s._local_replicas < 2:
        pytest.skip("needs two local replicas")

    def fn():
        ctx = dtensor.get_replica_context()
        if ctx.replica_id_in_sync_group == 0:
            return ctx.all_reduce("SUM", dtensor.ones([1], layout=dtensor.Layout.replicated(
                s._replica_mesh(0), 1)))
        return None

    with pytest.raises(RuntimeError, match="different synchronisation points"):
        s.run(fn)


def test_gradient_tape_against_numpy(mesh_2d):
    x_host = rows(6, 4)
    w_host = np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    x = dtensor.dtensor_from_array(x_host, dtensor.Layout(["x", "unsharded"], mesh_2d))
    w = dtensor.DVariable(w_host, layout=dtensor.Layout.replicated(mesh_2d, 2))
    with dtensor.GradientTape(persistent=True) as tape:
        y = dtensor.matmul(x, w)
        loss = dtensor.reduce_sum(y * y)
        other = dtensor.reduce_sum(x)
    gw, gx = tape.gradient(loss, [w, x])
    assert gx is None  # x was not watched
    np.testing.assert_allclose(dtensor.gather(gw), 2 * x_host.T @ (x_host @ w_host), rtol=1e-5)
    assert gw.layout == w.layout
    assert tape.gradient(other, w) is None
    zero = tape.gradient(other, w, unconnected_gradients="zero")
    np.testing.assert_array_equal(dtensor.gather(zero), np.zeros_like(w_host))
    with dtensor.GradientTape() as t2:
        t2.watch(x)
        z = dtensor.reduce_sum(dtensor.exp(x) * 2.0)
    np.testing.assert_allclose(dtensor.gather(t2.gradient(z, x)), 2 * np.exp(x_host), rtol=1e-5)
    with pytest.raises(RuntimeError, match="non-persistent"):
        t2.gradient(z, x)


def test_gradient_tape_output_gradients_and_stop_recording(mesh_2d):
    a = rows(3, 2)
    x = dtensor.dtensor_from_array(a, dtensor.Layout(["x", "y"], mesh_2d))
    weights = dtensor.dtensor_from_array(np.full_like(a, 3.0), x.layout)
    with dtensor.GradientTape() as tape:
        tape.watch(x)
        y = x * x
        with tape.stop_recording():
            c = x * 5.0  # not recorded: a constant below
        y = y + c
    g = tape.gradient(y, x, output_gradients=weights)
    np.testing.assert_allclose(dtensor.gather(g), 3.0 * 2 * a, rtol=1e-6)


def numpy_classifier_losses(w1, b1, w2, b2, x, y, lr, batch, epochs):
    """The guide's loop in numpy: relu MLP, softmax cross entropy summed over each batch and
    divided by the global batch size, SGD."""
    out = []
    for _ in range(epochs):
        total, n = 0.0, 0
        for s in range(0, len(x), batch):
            xb, yb = x[s:s + batch], y[s:s + batch]
            h = np.maximum(xb @ w1 + b1, 0)
            z = h @ w2 + b2
            z = z - z.max(1, keepdims=True)
            p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
            total += -np.log(p[np.arange(len(yb)), yb]).sum() / batch
            n += 1
            dz = p.copy()
            dz[np.arange(len(yb)), yb] -= 1
            dz /= batch
            dw2, db2 = h.T @ dz, dz.sum(0)
            dh = dz @ w2.T * (h > 0)
            dw1, db1 = xb.T @ dh, dh.sum(0)
            w1, b1, w2, b2 = w1 - lr * dw1, b1 - lr * db1, w2 - lr * dw2, b2 - lr * db2
        out.append(total / n)
    return out


def custom_loop(strategy, x, y, global_batch, epochs):
    keras.Layer._count = 0  # the same initial weights on every call
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(5, activation="relu", input_shape=(4,)),
                                  keras.layers.Dense(3)])
        optimizer = dtensor.SGD(learning_rate=0.3)
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                 reduction="none")
    weights = model.get_weights()

    def train_step(inputs):
        features, labels = inputs
        with dtensor.GradientTape() as tape:
            logits = model(features)
            loss = dtensor.compute_average_loss(loss_object(labels, logits),
                                                global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    data = dtensor.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    losses = []
    for _ in range(epochs):
        total, n = 0.0, 0
        for batch in strategy.experimental_distribute_dataset(data):
            per_replica = strategy.run(train_step, args=(batch,))
            total += float(strategy.reduce("SUM", per_replica, axis=None))
            n += 1
        losses.append(total / n)
    return weights, losses


@pytest.mark.parametrize("cls", [dtensor.MultiWorkerMirroredStrategy, dtensor.MirroredStrategy,
                                 dtensor.OneDeviceStrategy, dtensor.Strategy])
def test_guide_custom_loop_matches_numpy(cls):
    """Global batch 7 over 6 replicas (2,1,1,1,1,1) and a last batch of 3 (replicas empty)."""
    s = cls()
    if s._run_refusal:
        with pytest.raises(dtensor.DTensorError, match="strategy.run"):
            custom_loop(s, rows(10, 4), np.zeros(10, np.int32), 7, 1)
        return
    rng = np.random.default_rng(1)
    x = rng.normal(size=(17, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=17).astype(np.int32)
    (w1, b1, w2, b2), got = custom_loop(s, x, y, 7, 3)
    want = numpy_classifier_losses(w1, b1, w2, b2, x, y, 0.3, 7, 3)
    np.testing.assert_allclose(got, want, rtol=2e-5)


def test_distribute_datasets_from_function():
    s = dtensor.MultiWorkerMirroredStrategy()
    seen = []

    def dataset_fn(ctx):
        seen.append((ctx.num_input_pipelines, ctx.input_pipeline_id))
        per_replica = ctx.get_per_replica_batch_size(12)
        x = np.arange(40, dtype=np.float32).reshape(20, 2)
        return dtensor.data.Dataset.from_tensor_slices(x).shard(
            ctx.num_input_pipelines, ctx.input_pipeline_id).batch(per_replica)

    dist = s.distribute_datasets_from_function(dataset_fn)
    assert seen == [(CLIENTS, dtensor.client_id())]
    steps = list(dist)
    for step in steps:
        assert len(step.values) == s._local_replicas
        assert all(v.shape[0] <= 2 for v in step.values)
    with pytest.raises(ValueError, match="divisible"):
        dtensor.InputContext(1, 0, 6).get_per_replica_batch_size(8)


def test_apply_gradients_in_cross_replica_context(mesh_1d):
    v = dtensor.DVariable(np.ones(3, np.float32), layout=dtensor.Layout.replicated(mesh_1d, 1))
    opt = dtensor.SGD(0.5)
    with dtensor.GradientTape() as tape:
        loss = dtensor.reduce_sum(v * v)
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    np.testing.assert_allclose(v.numpy(), np.zeros(3))  # 1 - 0.5 * 2
    assert opt.iterations == 1


def test_mirrored_variable_assign_inside_run_raises():
    s = dtensor.MirroredStrategy()
    with s.scope():
        v = dtensor.DVariable(np.zeros(2, np.float32), layout=s.variable_layout(1))
    with pytest.raises(dtensor.DTensorError, match="apply_gradients"):
        s.run(lambda: v.assign_add(np.ones(2, np.float32)))


def keras_fit(strategy, x, y, epochs=2):
    keras.Layer._count = 0  # the same layer names and initial weights under each strategy
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(6, activation="tanh", input_shape=(4,)),
                                  keras.layers.Dense(3)])
        model.compile(optimizer=dtensor.Adam(0.05),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    history = model.fit(x, y, batch_size=7, epochs=epochs, shuffle=True, verbose=0)
    return model, history.history


def test_keras_fit_same_numbers_under_every_strategy(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(20, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)
    results = {}
    for cls in [dtensor.Strategy, dtensor.OneDeviceStrategy, dtensor.MirroredStrategy,
                dtensor.MultiWorkerMirroredStrategy, dtensor.CentralStorageStrategy]:
        model, hist = keras_fit(cls(), x, y)
        results[cls.__name__] = hist
        assert hist["loss"][-1] < hist["loss"][0]
        assert set(hist) == {"loss", "accuracy"}
    first = next(iter(results.values()))
    for name, hist in results.items():
        np.testing.assert_allclose(hist["loss"], first["loss"], rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(hist["accuracy"], first["accuracy"], err_msg=name)
    # evaluate and predict against the model's own weights in numpy
    w1, b1, w2, b2 = model.get_weights()
    logits = np.tanh(x @ w1 + b1) @ w2 + b2
    np.testing.assert_allclose(model.predict(x, batch_size=8), logits, rtol=1e-5, atol=1e-6)
    z = logits - logits.max(1, keepdims=True)
    ce = -(z[np.arange(20), y] - np.log(np.exp(z).sum(1)))
    loss, acc = model.evaluate(x, y, batch_size=20, verbose=0)
    assert loss == pytest.approx(ce.mean(), rel=1e-5)
    assert acc == pytest.approx((logits.argmax(1) == y).mean())
    # save_weights / load_weights round trip
    path = str(tmp_path / "w.npz") if CLIENTS == 1 else "/tmp/dtensor-test-weights.npz"
    model.save_weights(path)
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    model.load_weights(path)
    for a, b in zip(model.get_weights(), [w1, b1, w2, b2]):
        np.testing.assert_array_equal(a, b)


def test_keras_summary_and_callbacks(tmp_path):
    keras.Layer._count = 0
    model = keras.Sequential([keras.layers.Dense(4, input_shape=(3,)), keras.layers.Dense(1)])
    lines = []
    model.summary(print_fn=lines.append)
    assert lines[-3] == "Total params: 21"  # 3*4 + 4 + 4*1 + 1
    ends = []
    model.compile("sgd", "mse")
    log = tmp_path / "log.csv"
    model.fit(rows(6), np.ones((6, 1), np.float32), epochs=2, verbose=0, callbacks=[
        keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: ends.append(e)),
        keras.callbacks.CSVLogger(str(log))])
    assert ends == [0, 1]
    if dtensor.client_id() == 0:
        assert log.read_text().splitlines()[0] == "epoch,loss"
    with pytest.raises(RuntimeError, match="compile"):
        keras.Sequential([keras.layers.Dense(1)]).fit(rows(2), np.ones((2, 1)), verbose=0)


def test_dataset_semantics():
    ds = dtensor.data.Dataset.from_tensor_slices((np.arange(10), np.arange(10) * 2))
    batches = list(ds.batch(4))
    assert [len(b[0]) for b in batches] == [4, 4, 2]
    assert len(ds.batch(4, drop_remainder=True)) == 2
    shuffled = [int(v) for v, _ in ds.shuffle(10, seed=3)]
    assert sorted(shuffled) == list(range(10)) and shuffled != list(range(10))
    again = [int(v) for v, _ in ds.shuffle(10, seed=3, reshuffle_each_iteration=False)]
    assert again == [int(v) for v, _ in ds.shuffle(10, seed=3, reshuffle_each_iteration=False)]
    assert [int(v) for v in dtensor.data.Dataset.range(5).repeat(2).skip(3).take(4)] == \
        [3, 4, 0, 1]
    assert [int(v) for v in dtensor.data.Dataset.range(7).shard(3, 1)] == [1, 4]
    with pytest.raises(ValueError, match="leading extents"):
        dtensor.data.Dataset.from_tensor_slices((np.arange(3), np.arange(4)))


@pytest.mark.skipif(CLIENTS != 1, reason="the example starts its own clients")
def test_custom_training_loop_example_at_6_devices():
    """The guide's loop at 1 x 6, -n 2 x 3, -n 3 x 2 and -n 6 x 1 devices (uneven batches, empty
    replicas): the same epochs' losses and accuracies under every strategy and client count."""
    env = clean_env()
    outs = {}
    for n in (1, 2, 3, 6):
        launch = ["mpiexec.mpich", "-n", str(n)] if n > 1 else []
        for strategy in ["multi_worker_mirrored", "mirrored"] + (["one_device"] if n == 1
                                                                   else []):
            env["STRATEGY"] = strategy
            example = str(ROOT / "examples/custom_training_loop.py")
            r = subprocess.run(launch + [sys.executable, example], env=env, check=True,
                               capture_output=True, text=True, timeout=300)
            outs[(n, strategy)] = tuple(line for line in r.stdout.splitlines()
                                        if line.startswith(("Epoch", "Restored")))
    assert len(set(outs.values())) == 1, outs
    lines = next(iter(outs.values()))
    assert len(lines) == 4 and lines[-1].startswith("Restored ckpt-2.h5")
    assert lines[-1].endswith("the same predictions as the trained model")


def run_example(name, launch, extra_env=None):
    env = clean_env(**(extra_env or {}))
    r = subprocess.run(launch + [sys.executable, str(ROOT / "examples" / name)], env=env,
                       check=True, capture_output=True, text=True, timeout=300)
    return r.stdout


@pytest.mark.skipif(CLIENTS != 1, reason="the examples start their own clients")
def test_keras_fit_example_same_losses_under_every_strategy():
    for launch in ([], ["mpiexec.mpich", "-n", "2"]):
        out = run_example("keras_fit.py", launch)
        losses = {line.split("loss ", 1)[1].split(",")[0] for line in out.splitlines()
                  if "replicas): loss" in line}
        first = [float(v) for v in next(iter(losses)).split()]
        assert len(first) == 3 and first[-1] < first[0]
        for other in losses:
            np.testing.assert_allclose([float(v) for v in other.split()], first, rtol=1e-5)


@pytest.mark.skipif(CLIENTS != 1, reason="the example starts its own clients")
def test_multi_worker_example_with_tf_config():
    outs = [run_example("multi_worker.py", ["mpiexec.mpich", "-n", str(n)]) for n in (1, 3)]
    assert outs[0] == outs[1] and outs[0].count("epoch") == 4


def test_multi_worker_tf_config_is_checked(monkeypatch):
    rank = dtensor.client_id()
    task = {"type": "worker", "index": (rank + 1) % CLIENTS}
    wrong = {"cluster": {"worker": ["h:1"] * CLIENTS}, "task": task}
    monkeypatch.setenv("TF_CONFIG", json.dumps(wrong))
    if CLIENTS > 1:  # every client names another's task: every client raises
        with pytest.raises(dtensor.DTensorError):
            dtensor.MultiWorkerMirroredStrategy()
    if CLIENTS > 1:  # a cluster with a ps task: refused on every client, naming it
        task = {"type": "worker", "index": rank} if rank < CLIENTS - 1 else \
            {"type": "ps", "index": 0}
        with_ps = {"cluster": {"worker": ["h:1"] * (CLIENTS - 1), "ps": ["h:2"]}, "task": task}
        monkeypatch.setenv("TF_CONFIG", json.dumps(with_ps))
        with pytest.raises(dtensor.DTensorError, match="1 ps tasks"):
            dtensor.MultiWorkerMirroredStrategy()
    ok = {"cluster": {"worker": ["h:1"] * CLIENTS}, "task": {"type": "worker", "index": rank}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(ok))
    assert dtensor.MultiWorkerMirroredStrategy().cluster_resolver.task_id == rank


def test_placement_arguments():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(11, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=11).astype(np.int32)
    ref = None
    n = dtensor.num_local_devices()
    strategies = [
        dtensor.OneDeviceStrategy("/cpu:0"),
        dtensor.OneDeviceStrategy(f"/job:worker/replica:0/task:{CLIENTS - 1}/device:CPU:{n - 1}"),
        dtensor.MirroredStrategy(devices=[f"/cpu:{i}" for i in range(1, n)] if n > 1 else None,
                                 cross_device_ops=dtensor.HierarchicalCopyAllReduce()),
        dtensor.MirroredStrategy(cross_device_ops=dtensor.ReductionToOneDevice()),
        dtensor.MultiWorkerMirroredStrategy(communication_options=dtensor.CommunicationOptions(
            implementation=dtensor.CommunicationImplementation.RING)),
    ]
    assert strategies[1].mesh._device_ids == (dtensor.num_global_devices() - 1,)
    if n > 1:
        assert strategies[2].num_replicas_in_sync == n - 1
    for s in strategies:
        if s._run_refusal:
            continue
        _, got = custom_loop(s, x, y, 5, 2)
        ref = got if ref is None else ref
        np.testing.assert_allclose(got, ref, rtol=2e-5)
    # NCCL is a hint, as TensorFlow takes it: CPU devices exchange by the ring instead
    s = dtensor.MirroredStrategy(cross_device_ops=dtensor.NcclAllReduce())
    with pytest.raises(dtensor.DTensorError, match="nccl needs CUDA"):
        dtensor.set_collective_algorithm(s.mesh, "nccl")
    with pytest.raises(ValueError, match="consecutive"):
        dtensor.MirroredStrategy(devices=["/cpu:0", "/gpu:0"])
    with pytest.raises(ValueError, match="implementation"):
        dtensor.CommunicationOptions(implementation="carrier pigeon")
