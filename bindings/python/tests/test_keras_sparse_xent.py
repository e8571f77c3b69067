"""keras.losses.SparseCategoricalCrossentropy and sparse_categorical_crossentropy through the
fused sparse cross-entropy op, against float64 numpy of Keras 3's formulas (TensorFlow
backend): from logits, log_softmax at the label; from probabilities, the log of the
probabilities clipped to [1e-7, 1 - 1e-7] taken as logits; ignore_class examples add 0 and
"sum_over_batch_size" divides by the count of the others; sample weights of rank one apart
meet by Keras's squeeze-or-expand rule. Every reduction, sample weights, [N] and [N, 1] labels
of int32, int64 and float dtypes, rows and classes sharded (50 classes: uneven on 4 devices) on
meshes of 1, 2 and 4 devices, gradients through GradientTape, 16-bit logits computed in
float32, Keras's documented values, compile/evaluate with the loss by name, and the traced
program: one fused op, no one-hot, no gather of the logits."""
import numpy as np
import pytest

import dtensor
from dtensor import keras
from keras_meshes import layouts, mesh_of

U = dtensor.UNSHARDED
EPS = 1e-7
REDUCTIONS = ["sum_over_batch_size", "sum", "none"]


# ---- references (float64 numpy) ----------------------------------------------------------------

def ref_logits(y_pred, from_logits):
    z = np.asarray(y_pred, np.float64)
    return z if from_logits else np.log(np.clip(z, EPS, 1 - EPS))


def ref_losses(labels, y_pred, from_logits, ignore_class=None):
    """Per-example losses and the valid mask."""
    z = ref_logits(y_pred, from_logits)
    m = z.max(-1, keepdims=True)
    logp = z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))
    lab = np.asarray(labels).reshape(z.shape[:-1]).astype(np.int64)
    valid = np.ones(lab.shape, bool) if ignore_class is None else lab != ignore_class
    picked = np.take_along_axis(logp, np.where(valid, lab, 0)[..., None], -1)[..., 0]
    return np.where(valid, -picked, 0.0), valid


def ref_same_rank(losses, w):
    if losses.ndim == w.ndim + 1 and losses.shape[-1] == 1:
        return (losses, w[..., None]) if w.ndim == 1 else (losses[..., 0], w)
    if w.ndim == losses.ndim + 1 and w.shape[-1] == 1:
        return (losses[..., None], w) if losses.ndim == 1 else (losses, w[..., 0])
    return losses, w


def ref_reduce(losses, valid, reduction, sample_weight=None, masked=False):
    if sample_weight is not None:
        losses, w = ref_same_rank(losses, np.asarray(sample_weight, np.float64))
        losses = losses * w
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / (max(valid.sum(), 1) if masked else losses.size)


def ref_grad(labels, y_pred, from_logits, ignore_class, row_scale):
    """d sum(loss_i * row_scale_i) / d y_pred."""
    z = ref_logits(y_pred, from_logits)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    lab = np.asarray(labels).reshape(z.shape[:-1]).astype(np.int64)
    valid = np.ones(lab.shape, bool) if ignore_class is None else lab != ignore_class
    hot = np.eye(z.shape[-1])[np.where(valid, lab, 0)]
    g = (p - hot) * (np.asarray(row_scale, np.float64) * valid)[..., None]
    if not from_logits:  # through log and the clip (inside it: the probabilities are)
        c = np.asarray(y_pred, np.float64)
        g = g / c * ((c > EPS) & (c < 1 - EPS))
    return g


# ---- operands ------------------------------------------------------------------------------------

def operands(shape, seed, from_logits, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = 2 * rng.standard_normal(shape)
    if not from_logits:  # probabilities inside the clip, rows summing to 1
        x = np.exp(x)
        x = np.maximum(x / x.sum(-1, keepdims=True), 1e-4)
    labels = rng.integers(0, shape[-1], shape[:-1])
    return labels, x.astype(dtype)


def loss_and_grad(loss_fn, labels, x):
    """The loss and d reduce_sum(loss) / d x through a GradientTape, gathered."""
    with dtensor.GradientTape() as tape:
        tape.watch(x)
        loss = loss_fn(labels, x)
        total = dtensor.reduce_sum(loss) if loss.ndim else loss
    return dtensor.gather(loss), dtensor.gather(tape.gradient(total, x))


def close(got, want, tol, what):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol,
                               err_msg=what)


# ---- the formulas on every layout --------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("from_logits", [True, False])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_every_layout_and_reduction(runtime, n, from_logits, reduction):
    """12 rows of 50 classes, rows and classes sharded alone and together; int32 labels on
    the host (laid out as the rows), loss and gradient."""
    labels, y = operands((12, 50), n, from_logits)
    mesh = mesh_of(n)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits,
                                                      reduction=reduction)
    want_loss, valid = ref_losses(labels, y, from_logits)
    want = ref_reduce(want_loss, valid, reduction)
    scale = 1 / 12 if reduction == "sum_over_batch_size" else 1.0
    want_g = ref_grad(labels, y, from_logits, None, np.full(12, scale))
    for specs in layouts(n):
        x = dtensor.dtensor_from_array(y, dtensor.Layout(list(specs), mesh))
        got, g = loss_and_grad(loss, labels.astype(np.int32), x)
        close(got, want, 2e-5, f"loss {specs}")
        close(g, want_g, 2e-5, f"gradient {specs}")
        assert g.dtype == np.float32


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weights", ["rows", "rows_1", "scalar"])
def test_sample_weight(mesh_2d, reduction, weights):
    labels, y = operands((9, 20), 3, True)
    w = np.random.default_rng(4).uniform(0.1, 2, 9).astype(np.float32)
    sw = {"rows": w, "rows_1": w[:, None], "scalar": np.float32(0.5)}[weights]
    x = dtensor.dtensor_from_array(y, dtensor.Layout(["x", "y"], mesh_2d))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
    want_loss, valid = ref_losses(labels, y, True)
    want = ref_reduce(want_loss, valid, reduction, sw)
    for given in (sw, dtensor.dtensor_from_array(sw, dtensor.Layout([U] * np.ndim(sw),
                                                                    mesh_2d))):
        with dtensor.GradientTape() as tape:
            tape.watch(x)
            got = loss(labels, x, sample_weight=given)
            total = dtensor.reduce_sum(got)
        g = tape.gradient(total, x)
        assert tuple(got.shape) == np.shape(want)
        close(dtensor.gather(got), want, 2e-5, "loss")
        row = np.broadcast_to(np.asarray(sw, np.float64).reshape(-1), (9,))
        scale = row / 9 if reduction == "sum_over_batch_size" else row
        close(dtensor.gather(g), ref_grad(labels, y, True, None, scale), 2e-5, "gradient")


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("from_logits", [True, False])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_ignore_class(runtime, n, from_logits, reduction):
    """Labels equal to ignore_class (-1 here, outside the classes, and a class id) add 0, get
    no gradient, and sum_over_batch_size divides by the count of the others."""
    labels, y = operands((12, 50), 10 + n, from_logits)
    mesh = mesh_of(n)
    for ignore in (-1, 7):
        lab = labels.copy()
        lab[[1, 4, 5, 11]] = ignore
        w = np.linspace(0.5, 1.5, 12).astype(np.float32)
        loss = keras.losses.SparseCategoricalCrossentropy(
            from_logits=from_logits, ignore_class=ignore, reduction=reduction)
        want_loss, valid = ref_losses(lab, y, from_logits, ignore)
        want = ref_reduce(want_loss, valid, reduction, w, masked=True)
        scale = w / valid.sum() if reduction == "sum_over_batch_size" else w
        want_g = ref_grad(lab, y, from_logits, ignore, scale)
        for specs in layouts(n):
            x = dtensor.dtensor_from_array(y, dtensor.Layout(list(specs), mesh))
            got, g = loss_and_grad(lambda a, b: loss(a, b, sample_weight=w), lab, x)
            close(got, want, 2e-5, f"loss {ignore} {specs}")
            close(g, want_g, 2e-5, f"gradient {ignore} {specs}")


def test_everything_ignored_gives_zero(mesh_2d):
    labels = np.full(6, -1)
    x = dtensor.dtensor_from_array(np.ones((6, 4), np.float32), dtensor.Layout(["x", "y"],
                                                                                mesh_2d))
    got = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1)(labels, x)
    assert dtensor.gather(got) == 0


# ---- labels --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8, np.uint8, np.float32])
@pytest.mark.parametrize("shape", ["n", "n_1"])
def test_label_dtypes_and_shapes(mesh_2d, dtype, shape):
    """Labels [N] or [N, 1], int32, int64, smaller integers or float (cast to integers as
    Keras casts them), as host arrays and as DTensors sharded or not over the rows; with
    ignore_class too."""
    labels, y = operands((12, 30), 5, True)
    x = dtensor.dtensor_from_array(y, dtensor.Layout(["x", "y"], mesh_2d))
    want = ref_losses(labels, y, True)[0]
    lab = labels.astype(dtype)
    if shape == "n_1":
        lab = lab[:, None]
    for given in (lab, lab.tolist(),
                  dtensor.dtensor_from_array(lab, dtensor.Layout([U] * lab.ndim, mesh_2d)),
                  dtensor.dtensor_from_array(lab, dtensor.Layout(["x"] + [U] * (lab.ndim - 1),
                                                                 mesh_2d))):
        got = keras.losses.sparse_categorical_crossentropy(given, x, from_logits=True)
        assert tuple(got.shape) == (12,)
        close(dtensor.gather(got), want, 2e-5, f"{type(given).__name__}")
        got = keras.losses.sparse_categorical_crossentropy(given, x, from_logits=True,
                                                           ignore_class=int(labels[0]))
        close(dtensor.gather(got), np.where(labels == labels[0], 0, want), 2e-5,
              f"{type(given).__name__}, ignore_class")


def test_sequence_labels(mesh_2d):
    """Logits [B, T, C] and labels [B, T]: sum_over_batch_size divides by B * T, as Keras."""
    labels, y = operands((3, 4, 37), 6, True)
    x = dtensor.dtensor_from_array(y, dtensor.Layout(["x", U, "y"], mesh_2d))
    got, g = loss_and_grad(keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                           labels, x)
    want_loss, _ = ref_losses(labels, y, True)
    close(got, want_loss.mean(), 2e-5, "loss")
    close(g, ref_grad(labels, y, True, None, np.full((3, 4), 1 / 12)), 2e-5, "gradient")


@pytest.mark.parametrize("dtype,tol", [(dtensor.bfloat16, 1e-5), (np.float16, 1e-5)])
def test_16_bit_logits_compute_in_float32(mesh_2d, dtype, tol):
    """As Keras 3 (a loss's dtype is float32 by default): the loss is float32, computed from
    the 16-bit values widened; the gradient comes back in the logits' dtype."""
    labels, y = operands((6, 40), 8, True)
    x16 = y.astype(dtype)
    x = dtensor.dtensor_from_array(x16, dtensor.Layout(["x", "y"], mesh_2d))
    got, g = loss_and_grad(keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                           labels, x)
    assert got.dtype == np.float32 and g.dtype == dtype
    close(got, ref_losses(labels, x16.astype(np.float64), True)[0].mean(), tol, "loss")
    close(g, ref_grad(labels, x16.astype(np.float64), True, None, np.full(6, 1 / 6)), 1e-2,
          "gradient")
    # a given dtype is the computation's
    got64 = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")(
        labels, x)
    assert got64.dtype == np.float64


# ---- Keras's documented values, softmax outputs, compile --------------------------------------

def test_keras_documented_values(mesh_2d):
    """The values of Keras's documentation (keras.io, tf.keras.losses pages; printed to 4
    digits, hence rtol 5e-4)."""
    y_pred = dtensor.dtensor_from_array(np.array([[0.05, 0.95, 0], [0.1, 0.8, 0.1]], np.float32),
                                        dtensor.Layout([U, "y"], mesh_2d))
    np.testing.assert_allclose(dtensor.gather(
        keras.losses.sparse_categorical_crossentropy([1, 2], y_pred)), [0.0513, 2.303],
        rtol=5e-4)
    cases = [({}, None, 1.177), ({}, [0.3, 0.7], 0.814), ({"reduction": "sum"}, None, 2.354)]
    for kwargs, sw, want in cases:
        got = keras.losses.SparseCategoricalCrossentropy(**kwargs)([1, 2], y_pred,
                                                                   sample_weight=sw)
        np.testing.assert_allclose(dtensor.gather(got), want, rtol=5e-4)
    y_true = [[[0, 2], [-1, -1]], [[0, 2], [-1, -1]]]
    y_pred = np.array([[[[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], [[0.2, 0.5, 0.3], [0.0, 1.0, 0.0]]],
                       [[[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]], [[0.2, 0.5, 0.3], [0.0, 1.0, 0.0]]]],
                      np.float32)
    y_pred = dtensor.dtensor_from_array(y_pred, dtensor.Layout(["x", U, U, "y"], mesh_2d))
    got = keras.losses.sparse_categorical_crossentropy(y_true, y_pred, ignore_class=-1)
    np.testing.assert_allclose(dtensor.gather(got), [[[2.3841855e-07, 2.3841855e-07], [0, 0]],
                                                     [[2.3841855e-07, 6.9314730e-01], [0, 0]]],
                               rtol=1e-6, atol=1e-12)


def test_softmax_output_reads_its_logits(mesh_2d):
    """Keras's softmax activation keeps its logits and the probability form of the loss reads
    them (TensorFlow's Keras backend does): a label whose probability underflows the clip
    still costs its full -log_softmax, and the gradient is softmax - onehot."""
    labels = np.array([0, 1, 2, 3, 0, 1])
    y = np.zeros((6, 4), np.float32)
    y[np.arange(6), (labels + 1) % 4] = 40.0  # the label's probability ~ e^-40
    x = dtensor.dtensor_from_array(y, dtensor.Layout(["x", "y"], mesh_2d))
    probs_loss = keras.losses.SparseCategoricalCrossentropy()
    got, g = loss_and_grad(lambda a, b: probs_loss(a, keras.softmax(b)), labels, x)
    close(got, ref_losses(labels, y, True)[0].mean(), 1e-5, "loss")
    assert got > 39  # the clipped probabilities would give -log(1e-7) = 16.1
    close(g, ref_grad(labels, y, True, None, np.full(6, 1 / 6)), 1e-6, "gradient")


def test_compile_by_name_and_evaluate(runtime):
    """compile(loss="sparse_categorical_crossentropy") on a softmax model: evaluate's loss
    against numpy of the model's own weights (the logits' log_softmax)."""
    rng = np.random.default_rng(9)
    x = rng.normal(size=(8, 5)).astype(np.float32)
    y = rng.integers(0, 3, 8).astype(np.int32)
    model = keras.Sequential([keras.layers.Dense(3, activation="softmax", input_shape=(5,))])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    w, b = model.get_weights()
    want = ref_losses(y, x.astype(np.float64) @ w + b, True)[0].mean()
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=8, verbose=0), want, rtol=1e-5)
    # a function loss by its Keras name
    f = keras.losses.sparse_categorical_crossentropy
    got = f(y, model(x), from_logits=False)
    close(dtensor.gather(got), ref_losses(y, x.astype(np.float64) @ w + b, True)[0], 1e-5,
          "function")


# ---- the program: one fused op, no one-hot -------------------------------------------------------

@pytest.mark.parametrize("from_logits", [True, False])
def test_traced_program_has_no_one_hot(mesh_2d, from_logits):
    """The loss and its gradient traced: the fused op, no one_hot, no [N, C] gather of the
    classes sharded over y; the gradient matches numpy."""
    labels, y = operands((6, 4, 30), 12, from_logits)
    x = dtensor.dtensor_from_array(y, dtensor.Layout(["x", U, "y"], mesh_2d))
    lab = dtensor.dtensor_from_array(labels.astype(np.int32), dtensor.Layout(["x", U], mesh_2d))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits, ignore_class=3)
    f = dtensor.function(lambda lab, x: loss(lab, x))
    outs = f.gradient(0, [1], lab, x)(lab, x)
    want_loss, valid = ref_losses(labels, y, from_logits, 3)
    close(dtensor.gather(outs[0]), want_loss.sum() / valid.sum(), 2e-5, "loss")
    close(dtensor.gather(outs[1]),
          ref_grad(labels, y, from_logits, 3, np.full((6, 4), 1 / valid.sum())), 2e-5,
          "gradient")
    text = f.program(lab, x)[0]
    assert "xent" in text and "one_hot" not in text, text
    assert "all_gather" not in text, text


# ---- errors --------------------------------------------------------------------------------------

def test_errors(mesh_2d):
    x = dtensor.dtensor_from_array(np.ones((4, 6), np.float32), dtensor.Layout(["x", "y"],
                                                                                mesh_2d))
    with pytest.raises(ValueError, match=r"only axis=-1 is supported.*axis=0"):
        keras.losses.SparseCategoricalCrossentropy(axis=0)([0, 1, 2, 3], x)
    with pytest.raises(ValueError, match=r"labels of shape \[4, 2\] do not match y_pred of "
                                         r"shape \[4, 6\]"):
        keras.losses.sparse_categorical_crossentropy(np.zeros((4, 2), np.int32), x)
    assert keras.losses.SparseCategoricalCrossentropy(axis=1)([0, 1, 2, 3], x).shape == ()
    with pytest.raises(ValueError, match=r"label 6 is outside the 6 classes \[0, 5\]"):
        keras.losses.SparseCategoricalCrossentropy()([0, 6, 2, 3], x)
    with pytest.raises(ValueError, match=r"label -2 is outside"):
        keras.losses.SparseCategoricalCrossentropy(ignore_class=-1)([0, -1, -2, 3], x)


def test_tensor_labels_outside_the_classes_give_nan(mesh_2d):
    """Labels in a tensor are not read on the host: an example whose label is outside the
    classes gets NaN (the fused op's rule, TensorFlow's GPU kernel's), the others their loss."""
    labels, y = operands((4, 6), 13, True)
    x = dtensor.dtensor_from_array(y, dtensor.Layout(["x", "y"], mesh_2d))
    lab = dtensor.dtensor_from_array(np.array([0, 6, -2, 3], np.int32),
                                     dtensor.Layout(["x"], mesh_2d))
    got = dtensor.gather(keras.losses.sparse_categorical_crossentropy(lab, x, from_logits=True))
    assert np.isnan(got[1]) and np.isnan(got[2])
    close(got[[0, 3]], ref_losses([0, 3], y[[0, 3]], True)[0], 2e-5, "valid rows")
