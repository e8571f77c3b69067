"""What the tf.distribute and DTensor tutorials' programs use beyond the guides: tf.function's
captures, tf.nn's convolution, pooling and batch statistics (with their gradients), RMSprop and
learning-rate schedules, Keras's Conv2D models, functional models, StringLookup, Embedding,
saved models, callbacks and Progbar, tf.Module checkpoints (restored late, written per
client), and the small names around them. The references are numpy (convolutions and their
gradients by loops) and TensorFlow's documented results."""
import json
import os
import struct

import numpy as np
import pytest

import dtensor
from conftest import CLIENTS, DEVICES

keras = dtensor.keras


# ---- tf.function: captures and what cannot be traced ---------------------------------------------

def test_function_captures_tensors_by_value_and_variables_by_reference(mesh_1d):
    w = dtensor.Variable(np.ones((3, 2), np.float32),
                         layout=dtensor.Layout.replicated(mesh_1d, 2))
    c = dtensor.dtensor_from_array(np.full((2,), 10., np.float32),
                                   dtensor.Layout.replicated(mesh_1d, 1))
    traced = []

    @dtensor.function
    def f(x):
        traced.append(1)
        return {"y": dtensor.matmul(x, w) + c, "w": w}
    x_host = np.arange(18, dtype=np.float32).reshape(6, 3)
    x = dtensor.dtensor_from_array(x_host, dtensor.Layout(["x", dtensor.UNSHARDED], mesh_1d))
    r = f(x)
    np.testing.assert_allclose(dtensor.gather(r["y"]), x_host @ np.ones((3, 2)) + 10)
    w.assign(np.full((3, 2), 2., np.float32))
    r = f(x)  # the same trace, the variable's new value
    np.testing.assert_allclose(dtensor.gather(r["y"]), x_host @ np.full((3, 2), 2.) + 10)
    np.testing.assert_array_equal(dtensor.gather(r["w"]), np.full((3, 2), 2.))
    assert traced == [1]
    text = f.program(x)[0]
    assert "input 1:" in text and "input 2:" in text  # the captures are inputs


def test_untraceable_function_runs_as_python(mesh_1d):
    """A function assigning a variable cannot be recorded: it runs as Python (the first call
    runs its Python twice: the trace, then the run), and program() says so."""
    v = dtensor.Variable(np.zeros((2,), np.float32), layout=dtensor.Layout.replicated(mesh_1d, 1))
    calls = []

    @dtensor.function
    def g(x):
        calls.append(1)
        v.assign_add(x)
        return x + 1
    x = dtensor.dtensor_from_array(np.ones((2,), np.float32),
                                   dtensor.Layout.replicated(mesh_1d, 1))
    for _ in range(3):
        g(x)
    np.testing.assert_array_equal(v.numpy(), [3., 3.])
    assert len(calls) == 4
    with pytest.raises(dtensor.errors.UnimplementedError, match="cannot be traced"):
        g.program(x)

    @dtensor.function
    def h():  # no arguments: runs as Python, as its result is what TensorFlow's gives
        return dtensor.constant(3) * 2
    assert h() == 6


# ---- tf.nn: convolution, pooling, moments ------------------------------------------------------

def ref_conv(x, w, stride, padding, dilation=1):
    n, h, wd, c = x.shape
    kh, kw, _, f = w.shape
    sh = sw = stride
    span_h, span_w = (kh - 1) * dilation + 1, (kw - 1) * dilation + 1
    if padding == "SAME":
        oh, ow = -(-h // sh), -(-wd // sw)
        ph, pw = max((oh - 1) * sh + span_h - h, 0), max((ow - 1) * sw + span_w - wd, 0)
        x = np.pad(x, [(0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)])
    else:
        oh, ow = (h - span_h) // sh + 1, (wd - span_w) // sw + 1
    out = np.zeros((n, oh, ow, f))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, i * sh:i * sh + span_h:dilation, j * sw:j * sw + span_w:dilation, :]
            out[:, i, j, :] = np.einsum("nhwc,hwcf->nf", patch, w)
    return out


@pytest.mark.parametrize("stride, padding, dilation", [(1, "VALID", 1), (2, "SAME", 1),
                                                        (2, "VALID", 1), (1, "SAME", 2)])
def test_conv2d_matches_numpy_on_a_batch_sharded_input(mesh_2d, stride, padding, dilation):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 7, 6, 3))  # 5 rows over 3 shards: uneven
    w = rng.normal(size=(3, 2, 3, 4))
    xd = dtensor.dtensor_from_array(x.astype(np.float32), dtensor.Layout(
        ["x", dtensor.UNSHARDED, dtensor.UNSHARDED, dtensor.UNSHARDED], mesh_2d))
    y = dtensor.nn.conv2d(xd, w.astype(np.float32), stride, padding, dilations=dilation)
    np.testing.assert_allclose(dtensor.gather(y), ref_conv(x, w, stride, padding, dilation),
                               rtol=1e-4, atol=1e-4)


def test_conv2d_gradients_match_numpy(mesh_1d):
    """d/dx and d/dw of sum(conv2d(x, w) * r): each output element's window of x times r for
    the kernel, the kernel scattered back for the input."""
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(6, 5, 5, 2)), rng.normal(size=(3, 3, 2, 3))
    r = rng.normal(size=(6, 3, 3, 3))
    gx, gw = np.zeros_like(x), np.zeros_like(w)
    for i in range(3):
        for j in range(3):
            gw += np.einsum("nhwc,nf->hwcf", x[:, i:i + 3, j:j + 3, :], r[:, i, j, :])
            gx[:, i:i + 3, j:j + 3, :] += np.einsum("hwcf,nf->nhwc", w, r[:, i, j, :])
    layout = dtensor.Layout(["x"] + [dtensor.UNSHARDED] * 3, mesh_1d)
    xd = dtensor.dtensor_from_array(x.astype(np.float32), layout)
    wd = dtensor.Variable(w.astype(np.float32), layout=dtensor.Layout.replicated(mesh_1d, 4))
    rd = dtensor.dtensor_from_array(r.astype(np.float32), layout)
    with dtensor.GradientTape() as tape:
        tape.watch(xd)
        loss = dtensor.reduce_sum(dtensor.nn.conv2d(xd, wd, 1, "VALID") * rd)
    dx, dw = tape.gradient(loss, [xd, wd])
    np.testing.assert_allclose(dtensor.gather(dw), gw, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dtensor.gather(dx), gx, rtol=1e-4, atol=1e-4)


def test_pooling_matches_numpy(mesh_1d):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(6, 5, 5, 2)).astype(np.float32)
    xd = dtensor.dtensor_from_array(x, dtensor.Layout(["x"] + [dtensor.UNSHARDED] * 3, mesh_1d))
    got = dtensor.gather(dtensor.nn.max_pool2d(xd, 2, 2, "VALID"))
    np.testing.assert_array_equal(got, x[:, :4, :4].reshape(6, 2, 2, 2, 2, 2).max(axis=(2, 4)))
    # SAME: 3 x 3 windows of 2 x 2 at stride 2, the last row and column alone; the mean
    # counts the elements inside the input only (TensorFlow's)
    padded = np.pad(x, [(0, 0), (0, 1), (0, 1), (0, 0)], constant_values=np.nan)
    blocks = padded.reshape(6, 3, 2, 3, 2, 2)
    np.testing.assert_array_equal(dtensor.gather(dtensor.nn.max_pool2d(xd, 2, 2, "SAME")),
                                  np.nanmax(blocks, axis=(2, 4)))
    np.testing.assert_allclose(dtensor.gather(dtensor.nn.avg_pool2d(xd, 2, 2, "SAME")),
                               np.nanmean(blocks, axis=(2, 4)), rtol=1e-6)
    with pytest.raises(ValueError, match="padding"):
        dtensor.nn.max_pool2d(xd, 2, 2, "FULL")


def test_moments_and_batch_normalization(mesh_1d):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(12, 5)).astype(np.float32)
    xd = dtensor.dtensor_from_array(x, dtensor.Layout(["x", dtensor.UNSHARDED], mesh_1d))
    mean, var = dtensor.nn.moments(xd, axes=[0])
    np.testing.assert_allclose(dtensor.gather(mean), x.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dtensor.gather(var), x.var(0), rtol=1e-5, atol=1e-6)
    y = dtensor.nn.batch_normalization(xd, mean, var, 0.5, 2.0, 1e-5)
    np.testing.assert_allclose(dtensor.gather(y),
                               (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5) * 2 + 0.5,
                               rtol=1e-4, atol=1e-5)


# ---- optimizers: RMSprop, the learning rate ------------------------------------------------------

def test_rmsprop_follows_keras(mesh_1d):
    w0 = np.arange(6, dtype=np.float32).reshape(3, 2) / 10
    grads = [np.full((3, 2), k + 1, np.float32) * np.array([[1, -1]], np.float32)
             for k in range(3)]
    for momentum in (0.0, 0.5):
        v = dtensor.Variable(w0, layout=dtensor.Layout.replicated(mesh_1d, 2))
        opt = keras.optimizers.RMSprop(0.1, momentum=momentum)
        for g in grads:
            opt.apply_gradients([(dtensor.dtensor_from_array(g, v.layout), v)])
        w, s, u = w0.astype(np.float64), np.zeros((3, 2)), np.zeros((3, 2))
        for g in grads:
            s = 0.9 * s + 0.1 * g * g
            d = 0.1 * g / np.sqrt(s + 1e-7)
            u = momentum * u + d
            w = w - (u if momentum else d)
        np.testing.assert_allclose(v.numpy(), w, rtol=1e-5)


def test_learning_rate_is_a_scalar_variable_and_can_change(mesh_1d):
    opt = keras.optimizers.SGD(0.5)
    assert opt.learning_rate.numpy() == np.float32(0.5) and float(opt.learning_rate) == 0.5
    v = dtensor.Variable(np.ones((2,), np.float32), layout=dtensor.Layout.replicated(mesh_1d, 1))
    g = dtensor.dtensor_from_array(np.ones((2,), np.float32), v.layout)
    opt.apply_gradients([(g, v)])
    opt.learning_rate = 0.25
    opt.learning_rate.assign(0.125)
    opt.apply_gradients([(g, v)])
    np.testing.assert_allclose(v.numpy(), [1 - 0.5 - 0.125] * 2)
    with pytest.raises(dtensor.DTensorError, match="learning rate"):
        opt.learning_rate = -1.0
    assert keras.optimizers.legacy.RMSprop is keras.optimizers.RMSprop


# ---- Keras: a Conv2D model's training step, against numpy ---------------------------------------

def numpy_cnn_step(x, y, k, kb, w, b, lr):
    """One SGD step of Conv2D(valid, relu) -> MaxPooling2D(2) -> Flatten -> Dense, sparse
    softmax cross entropy from logits averaged over the batch: the loss and new weights."""
    n, kh = len(x), k.shape[0]
    oh = x.shape[1] - kh + 1
    conv = np.zeros((n, oh, oh, k.shape[3]))
    for i in range(oh):
        for j in range(oh):
            conv[:, i, j] = np.einsum("nhwc,hwcf->nf", x[:, i:i + kh, j:j + kh], k) + kb
    act = np.maximum(conv, 0)
    ph = oh // 2
    blocks = act[:, :2 * ph, :2 * ph].reshape(n, ph, 2, ph, 2, -1)
    pooled = blocks.max(axis=(2, 4))
    flat = pooled.reshape(n, -1)
    logits = flat @ w + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    loss = -np.log(p[np.arange(n), y]).mean()
    dlog = p.copy()
    dlog[np.arange(n), y] -= 1
    dlog /= n
    gw, gb = flat.T @ dlog, dlog.sum(0)
    dpool = (dlog @ w.T).reshape(pooled.shape)
    winner = blocks == pooled[:, :, None, :, None, :]
    dact = np.zeros_like(act)
    dact[:, :2 * ph, :2 * ph] = (winner * dpool[:, :, None, :, None, :]).reshape(
        n, 2 * ph, 2 * ph, -1)
    dconv = dact * (conv > 0)
    gk, gkb = np.zeros_like(k), dconv.sum((0, 1, 2))
    for i in range(oh):
        for j in range(oh):
            gk += np.einsum("nhwc,nf->hwcf", x[:, i:i + kh, j:j + kh], dconv[:, i, j])
    return loss, k - lr * gk, kb - lr * gkb, w - lr * gw, b - lr * gb


def test_conv_model_step_in_strategy_run_matches_numpy():
    rng = np.random.default_rng(4)
    x = rng.random((8, 9, 9, 2)).astype(np.float32)
    y = rng.integers(0, 3, 8)
    strategy = dtensor.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    with strategy.scope():
        model = keras.Sequential([keras.layers.Conv2D(4, 3, activation="relu"),
                                  keras.layers.MaxPooling2D(), keras.layers.Flatten(),
                                  keras.layers.Dense(3)])
        optimizer = keras.optimizers.SGD(0.5)
        loss_object = keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=keras.losses.Reduction.NONE)
    model(x[:1])  # built
    k, kb, w, b = [np.asarray(a, np.float64) for a in model.get_weights()]
    assert k.shape == (3, 3, 2, 4) and w.shape == (36, 3)

    def train_step(inputs):
        images, labels = inputs
        with dtensor.GradientTape() as tape:
            loss = dtensor.nn.compute_average_loss(loss_object(labels, model(images,
                                                                             training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    batch = next(iter(strategy.experimental_distribute_dataset(
        dtensor.data.Dataset.from_tensor_slices((x, y)).batch(8))))
    loss = strategy.reduce("SUM", strategy.run(train_step, args=(batch,)), axis=None)
    want = numpy_cnn_step(x.astype(np.float64), y, k, kb, w, b, 0.5)
    np.testing.assert_allclose(float(loss), want[0], rtol=1e-5)
    for got, ref in zip(model.get_weights(), want[1:]):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    # the same step through fit (SPMD over the batch) gives the same next loss as numpy's
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=keras.losses.
                  SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    again = numpy_cnn_step(x.astype(np.float64), y, *want[1:], 0.5)
    np.testing.assert_allclose(history.history["loss"][0], again[0], rtol=1e-5)


def test_input_reshape_and_conv_shapes():
    model = keras.Sequential([keras.Input(shape=(6, 6)), keras.layers.Reshape((6, 6, 1)),
                              keras.layers.Conv2D(2, 3, padding="same", strides=2),
                              keras.layers.AveragePooling2D(), keras.layers.Flatten()])
    assert model.built and len(model.layers) == 4
    out = model(np.ones((4, 6, 6), np.float32))
    assert out.shape == (4, 2)


# ---- Keras: functional models, StringLookup, Embedding ------------------------------------------

def test_functional_model_with_string_lookup_and_embedding():
    vocab = ["avenger", "ironman", "batman", "hulk"]
    lookup = keras.layers.StringLookup(vocabulary=vocab, mask_token=None)
    assert lookup.get_vocabulary() == ["[UNK]"] + vocab
    raw = keras.layers.Input(shape=(3,), dtype=dtensor.string, name="feature")
    pre = keras.Model({"features": raw}, lookup(raw))
    ids = pre(np.array(["batman", "thor", "avenger"]))  # one input: given as it is
    np.testing.assert_array_equal(ids, [3, 0, 1])
    labels = keras.layers.StringLookup(vocabulary=["yes", "no"], num_oov_indices=0,
                                       mask_token=None)
    np.testing.assert_array_equal(labels(np.array([["no"], ["yes"]])), [[1], [0]])

    ids_in = keras.layers.Input(shape=(3,), dtype=dtensor.int64, name="ids")
    emb = keras.layers.Embedding(input_dim=5, output_dim=4)
    pooled = dtensor.reduce_mean(emb(ids_in), axis=1)  # an op on a KerasTensor: a node
    assert tuple(pooled.shape) == (None, 4)
    out = keras.layers.Dense(1, activation="sigmoid")(pooled)
    model = keras.Model({"features": ids_in}, out)
    assert [type(layer).__name__ for layer in model.layers] == ["Embedding", "Dense"]
    assert len(model.trainable_variables) == 3
    batch = np.array([[1, 2, 3], [0, 4, 4]])
    table, (kernel, bias) = emb.embeddings.numpy(), [v.numpy() for v in model.layers[1].variables]
    got = dtensor.gather(model({"features": batch}))
    want = 1 / (1 + np.exp(-(table[batch].mean(1) @ kernel + bias)))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    with pytest.raises(ValueError, match="missing"):
        model({"other": batch})


# ---- Keras: saving, callbacks, Progbar -----------------------------------------------------------

def test_model_save_and_load_model(tmp_path):
    path = str(tmp_path / "m.keras")
    paths = dtensor._allgather_json(path)  # one file for every client
    model = keras.Sequential([keras.layers.Conv2D(2, 3, activation="relu",
                                                  kernel_regularizer=keras.regularizers.L2(0.1),
                                                  input_shape=(5, 5, 1)),
                              keras.layers.Flatten(), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    x = np.random.default_rng(5).random((4, 5, 5, 1)).astype(np.float32)
    model.save(paths[0])
    loaded = keras.models.load_model(paths[0])
    assert [type(layer).__name__ for layer in loaded.layers] == ["Conv2D", "Flatten", "Dense"]
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)
    assert float(loaded.optimizer.learning_rate) == pytest.approx(0.01)
    np.testing.assert_array_equal(dtensor.gather(loaded(x)), dtensor.gather(model(x)))
    np.testing.assert_allclose(float(dtensor.add_n(loaded.losses)),
                               float(dtensor.add_n(model.losses)))
    with pytest.raises(ValueError, match=".keras"):
        model.save(str(tmp_path / "m.h5"))


def read_events(path):
    """(tag, step, value) of a TensorBoard event file, each record's masked CRC-32C checked (a
    bitwise CRC, apart from the writer's table)."""
    def crc32c(data):
        crc = 0xFFFFFFFF
        for b in data:
            crc ^= b
            for _ in range(8):
                crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
        crc ^= 0xFFFFFFFF
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    def fields(buf):
        i = 0
        while i < len(buf):
            key, i = varint(buf, i)
            num, wire = key >> 3, key & 7
            if wire == 0:
                val, i = varint(buf, i)
            elif wire == 1:
                val, i = buf[i:i + 8], i + 8
            elif wire == 5:
                val, i = buf[i:i + 4], i + 4
            else:
                n, i = varint(buf, i)
                val, i = buf[i:i + n], i + n
            yield num, val

    def varint(buf, i):
        out = shift = 0
        while True:
            b = buf[i]
            i += 1
            out |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return out, i
    data, out, at = open(path, "rb").read(), [], 0
    while at < len(data):
        header = data[at:at + 8]
        (n,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[at + 8:at + 12])[0] == crc32c(header)
        event = data[at + 12:at + 12 + n]
        assert struct.unpack("<I", data[at + 12 + n:at + 16 + n])[0] == crc32c(event)
        at += 16 + n
        ev = dict(fields(event))
        if 5 in ev:
            value = dict(fields(dict(fields(ev[5]))[1]))
            out.append((value[1].decode(), ev.get(2, 0), struct.unpack("<f", value[2])[0]))
    return out


def test_callbacks_learning_rate_tensorboard_backup(tmp_path):
    root = dtensor._allgather_json(str(tmp_path))[0]
    x = np.random.default_rng(6).random((8, 3)).astype(np.float32)
    y = x.sum(1, keepdims=True)
    model = keras.Sequential([keras.layers.Dense(1, input_shape=(3,))])
    model.compile(optimizer="sgd", loss="mse")
    seen = []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(float(self.model.optimizer.learning_rate))
    history = model.fit(x, y, epochs=3, batch_size=8, verbose=0, shuffle=False, callbacks=[
        keras.callbacks.LearningRateScheduler(lambda epoch: 0.1 / (epoch + 1)), Record(),
        keras.callbacks.TensorBoard(log_dir=os.path.join(root, "logs"))])
    assert seen == pytest.approx([0.1, 0.05, 0.1 / 3])
    assert history.history["learning_rate"] == pytest.approx(seen)
    if dtensor.client_id() == 0:
        (events,) = os.listdir(os.path.join(root, "logs", "train"))
        got = read_events(os.path.join(root, "logs", "train", events))
        assert [(t, s) for t, s, _ in got if t == "epoch_loss"] == [("epoch_loss", k)
                                                                    for k in range(3)]
        np.testing.assert_allclose([v for t, _, v in got if t == "epoch_loss"],
                                   history.history["loss"], rtol=1e-6)
    # BackupAndRestore: a fit stopped after epoch 1 resumes at epoch 2 from the backup
    backup = os.path.join(root, "backup")
    model2 = keras.Sequential([keras.layers.Dense(1, input_shape=(3,))])
    model2.set_weights(model.get_weights())
    model2.compile(optimizer="sgd", loss="mse")

    class Stop(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        model2.fit(x, y, epochs=4, batch_size=8, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(backup), Stop()])
    after_two = model2.get_weights()
    model3 = keras.Sequential([keras.layers.Dense(1, input_shape=(3,))])
    model3.compile(optimizer="sgd", loss="mse")
    h = model3.fit(x, y, epochs=4, batch_size=8, verbose=0,
                   callbacks=[keras.callbacks.BackupAndRestore(backup)])
    assert len(h.history["loss"]) == 2  # epochs 2 and 3
    err = float(np.mean((x @ after_two[0] + after_two[1] - y) ** 2))
    assert h.history["loss"][0] == pytest.approx(err, rel=1e-5)
    assert not os.path.exists(backup)  # deleted when fit ended


def test_progbar_averages_as_keras(capsys):
    bar = keras.utils.Progbar(target=2, stateful_metrics=["acc"])
    bar.update(0, values=[("loss", 4.0), ("acc", 0.1)])
    bar.update(1, values=[("loss", 2.0), ("acc", 0.2)])
    bar.update(2, values=[("loss", 0.0), ("acc", 0.3)], finalize=True)
    out = capsys.readouterr().out
    if dtensor.client_id() == 0:
        assert "2/2" in out and "loss: 2.0000" in out and "acc: 0.3000" in out
    else:
        assert out == ""


# ---- tf.Module and checkpoints -------------------------------------------------------------------

class Linear(dtensor.Module):
    def __init__(self, layout, seed):
        super().__init__()
        self.w = dtensor.DVariable(dtensor.call_with_layout(
            dtensor.function(dtensor.random.stateless_normal), layout, shape=[4, 2], seed=seed))
        self.parts = [dtensor.DVariable(dtensor.zeros([2], layout=layout.delete([0])))]


def test_module_variables_and_checkpoint_of_its_root(tmp_path, mesh_2d):
    root = dtensor._allgather_json(str(tmp_path))[0]
    a = Linear(dtensor.Layout(["x", "y"], mesh_2d), (1, 2))
    assert a.name == "linear" and len(a.trainable_variables) == 2
    assert a.parts[0].layout.sharding_specs == ["y"]
    ckpt = dtensor.train.Checkpoint(root=a)
    path = ckpt.save(os.path.join(root, "deep", "ckpt"))  # its directory is made
    b = Linear(dtensor.Layout([dtensor.UNSHARDED, "x"], mesh_2d), (7, 7))
    dtensor.train.Checkpoint(root=b).restore(path).assert_consumed()
    np.testing.assert_array_equal(dtensor.gather(b.w.read_value()),
                                  dtensor.gather(a.w.read_value()))


def test_checkpoint_restored_when_the_model_is_built(tmp_path):
    """TensorFlow's delayed restoration: a model without variables yet is restored when its
    first call builds it, before it computes."""
    root = dtensor._allgather_json(str(tmp_path))[0]
    model = keras.Sequential([keras.layers.Dense(2, input_shape=(3,))])
    path = dtensor.train.Checkpoint(model=model).write(os.path.join(root, "c.h5"))
    fresh = keras.Sequential([keras.layers.Dense(2)])
    dtensor.train.Checkpoint(model=fresh).restore(path)
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(dtensor.gather(fresh(x)), dtensor.gather(model(x)))


@pytest.mark.skipif(CLIENTS < 2, reason="clients naming different files")
def test_checkpoint_files_of_each_client(tmp_path, mesh_2d):
    """Each client names its own file (a multi-worker program's workers do): each gets the
    whole checkpoint."""
    mine = os.path.join(str(tmp_path), f"client{dtensor.client_id()}", "ckpt")
    v = dtensor.DVariable(np.arange(12, dtype=np.float32).reshape(6, 2),
                          layout=dtensor.Layout(["x", dtensor.UNSHARDED], mesh_2d))
    manager = dtensor.train.CheckpointManager(dtensor.train.Checkpoint(v=v),
                                              os.path.dirname(mine), max_to_keep=1)
    manager.save()
    manager.save()
    files = sorted(os.listdir(os.path.dirname(mine)))
    assert files == ["ckpt-2.h5"]
    got = dtensor.train.load_variable(os.path.join(os.path.dirname(mine), "ckpt-2.h5"),
                                      "variables/v", dtensor.Layout.replicated(mesh_2d, 2))
    np.testing.assert_array_equal(got.numpy(), np.arange(12).reshape(6, 2))


# ---- the small names around them -----------------------------------------------------------------

def test_mesh_and_layout_queries(mesh_2d):
    assert mesh_2d["y"].size == 2 and tuple(mesh_2d["x"]) == ("x", 3)
    assert mesh_2d.strides == [2, 1]
    assert mesh_2d.unravel_index()[5] == {"x": 2, "y": 1}
    assert mesh_2d.local_device_locations() == [mesh_2d.unravel_index()[i]
                                                for i in mesh_2d.local_device_ids()]
    layout = dtensor.Layout(["y", dtensor.UNSHARDED, "x"], mesh_2d)
    assert layout.shape == [2, 1, 3]
    assert layout.delete([0]).sharding_specs == [dtensor.UNSHARDED, "x"]
    assert layout.delete([-1]).sharding_specs == ["y", dtensor.UNSHARDED]


def test_nest_gfile_dtypes_random_and_datasets(tmp_path):
    s = {"b": (1, [2, 3]), "a": 4}
    assert dtensor.nest.flatten(s) == [4, 1, 2, 3]
    assert dtensor.nest.map_structure(lambda v: v * 10, s) == {"b": (10, [20, 30]), "a": 40}
    d = os.path.join(str(tmp_path), f"g{dtensor.client_id()}", "x")
    dtensor.io.gfile.makedirs(d)
    assert dtensor.io.gfile.exists(d)
    dtensor.io.gfile.rmtree(os.path.dirname(d))
    assert not dtensor.io.gfile.exists(d)
    assert dtensor.dtypes.int64 == np.int64
    dtensor.random.set_seed(3)
    a = dtensor.random.uniform((2, 3)).numpy()
    dtensor.random.set_seed(3)
    b = dtensor.random.uniform((2, 3))
    assert b.dtype == np.float32 and ((0 <= a) & (a < 1)).all()
    np.testing.assert_array_equal(a, b.numpy())
    assert len(dtensor._allgather_json(a.tolist())) == CLIENTS  # every client drew alike
    assert all(np.array_equal(a, c) for c in dtensor._allgather_json(a.tolist()))
    ds = dtensor.data.Dataset.from_tensor_slices({"w": [["a", "b"], ["c", "d"]], "n": [1, 2]})
    first = ds.take(1).get_single_element()
    assert first["w"].tolist() == ["a", "b"] and first["n"] == 1
    with pytest.raises(ValueError, match="more than one"):
        ds.get_single_element()
    calls = []
    cached = ds.map(lambda e: calls.append(1) or e).cache()
    assert len(list(cached)) == 2 and len(list(cached)) == 2 and len(calls) == 2


def test_multi_worker_cluster_resolver(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    strategy = dtensor.distribute.MultiWorkerMirroredStrategy()
    r = strategy.cluster_resolver
    if CLIENTS == 1:
        assert r.task_type is None and r.task_id == 0 and r.cluster_spec().as_dict() == {}
    else:  # the ranks' tasks: a chief, then workers
        spec = r.cluster_spec().as_dict()
        assert sum(len(v) for v in spec.values()) == CLIENTS
        chief = "chief" in spec
        want = ("chief", 0) if chief and dtensor.client_id() == 0 else \
            ("worker", dtensor.client_id() - chief)
        assert (r.task_type, r.task_id) == want
    ours = dtensor.distribute.cluster_resolver.TFConfigClusterResolver(task_type="worker",
                                                                       task_id=0)
    assert dtensor.distribute.MultiWorkerMirroredStrategy(cluster_resolver=ours) \
        .cluster_resolver is ours


def test_gradient_of_many_variables(mesh_1d):
    """GradientTape.gradient over 200 variables (GPT-2 small has 196; the extension took 64):
    d/dv_i of sum_i (i + 1) * sum(v_i^2) is 2 (i + 1) v_i."""
    rng = np.random.default_rng(4)
    values = [rng.standard_normal(6) for _ in range(200)]
    layout = dtensor.Layout(["x"], mesh_1d)
    vs = [dtensor.DVariable(dtensor.dtensor_from_array(a, layout)) for a in values]
    with dtensor.GradientTape() as tape:
        loss = dtensor.add_n([dtensor.reduce_sum(dtensor.square(v)) * float(i + 1)
                              for i, v in enumerate(vs)])
    grads = tape.gradient(loss, vs)
    for i, (g, a) in enumerate(zip(grads, values)):
        np.testing.assert_allclose(dtensor.gather(g), 2 * (i + 1) * a, rtol=1e-12)
