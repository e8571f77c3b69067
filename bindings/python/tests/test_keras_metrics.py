"""keras.losses.SparseCategoricalCrossentropy(from_logits=False) where the clip is active, and
keras.metrics (SparseCategoricalCrossentropy, CategoricalCrossentropy, SparseCategoricalAccuracy,
SparseTopKCategoricalAccuracy, CategoricalAccuracy, Accuracy, Mean), against independent
references: the values in Keras 3's docstrings, and float64 numpy of Keras 3's formulas (the
loss of probabilities as TensorFlow's backend computes it: the cross-entropy of the logits
log(clip(p, 1e-7, 1 - 1e-7)); a metric as Keras's Mean of per-example values:
sum(values * w) / sum(w), ignore_class examples counted unless weights are given). Rows and
classes sharded (50 classes: uneven on 4 devices) on meshes of 1, 2 and 4 devices, stateful
updates, compile by name, and the traced program of the loss: one pass, no log per element,
no all-reduce of maxima."""
import numpy as np
import pytest

import dtensor
from dtensor import keras
from keras_meshes import layouts, mesh_of

U = dtensor.UNSHARDED
EPS = 1e-7
LO, HI = float(np.float32(EPS)), float(np.float32(1 - EPS))  # the clip's float32 bounds


def close(got, want, tol, what):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol,
                               err_msg=what)


def result(m):
    return float(np.asarray(dtensor.gather(m.result())))


# ---- the loss of probabilities where the clip is active ------------------------------------------

def clipped_operands(rows, classes, seed):
    """Probabilities with entries at 0, below eps and at 1 (a one-hot row), labels on clipped
    classes, and one label per row elsewhere."""
    rng = np.random.default_rng(seed)
    p = np.exp(2 * rng.standard_normal((rows, classes)))
    p /= p.sum(-1, keepdims=True)
    labels = rng.integers(0, classes, rows)
    p[0] = 0
    p[0, 5] = 1  # above 1 - eps: clipped, as every 0 in the row
    labels[0] = 5
    p[1, 7], labels[1] = 1e-9, 7  # the label's probability below eps
    p[2, 3] = 0
    p[3, labels[3]] = 2e-7  # just inside
    return labels, p.astype(np.float32)


def ref_loss_grad(labels, p, row_scale):
    """Keras's per-example losses (TensorFlow's backend: log of the clipped probabilities taken
    as logits) and d sum(loss * row_scale) / d p, the chain rule through log and the clip
    (zero where it is active), float64."""
    p64 = np.asarray(p, np.float64)
    z = np.log(np.clip(p64, LO, HI))
    m = z.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(z - m).sum(-1))
    rows = np.arange(len(labels))
    loss = lse - z[rows, labels]
    soft = np.exp(z - lse[:, None])
    soft[rows, labels] -= 1
    inside = (p64 >= LO) & (p64 <= HI)
    return loss, soft / np.clip(p64, LO, HI) * inside * np.asarray(row_scale)[:, None]


@pytest.mark.parametrize("n", [1, 2, 4])
def test_probabilities_where_the_clip_is_active(runtime, n):
    labels, p = clipped_operands(12, 50, n)
    w = np.linspace(0.5, 2, 12)
    want_loss, want_g = ref_loss_grad(labels, p, w / 12)
    mesh = mesh_of(n)
    loss = keras.losses.SparseCategoricalCrossentropy()
    for specs in layouts(n):
        x = dtensor.dtensor_from_array(p, dtensor.Layout(list(specs), mesh))
        with dtensor.GradientTape() as tape:
            tape.watch(x)
            got = loss(labels.astype(np.int32), x, sample_weight=w)
        g = dtensor.gather(tape.gradient(got, x))
        close(dtensor.gather(got), (want_loss * w).mean(), 2e-6, f"loss {specs}")
        close(g, want_g, 2e-6, f"gradient {specs}")
        assert (g[0] == 0).all() and g[1, 7] == 0, "zero gradient where the clip is active"
        assert g[3, labels[3]] < -1e5, "the label just inside the clip has its gradient"


@pytest.mark.parametrize("n", [2, 4])
def test_probabilities_ignore_class(runtime, n):
    """ignore_class examples add 0 and are not counted (the loss's rule); their gradient is 0."""
    labels, p = clipped_operands(8, 50, 10 + n)
    labels[[2, 5]] = 49
    valid = labels != 49
    want_loss, want_g = ref_loss_grad(np.where(valid, labels, 0), p, valid / valid.sum())
    loss = keras.losses.SparseCategoricalCrossentropy(ignore_class=49)
    x = dtensor.dtensor_from_array(p, dtensor.Layout([U, "x" if n == 2 else "y"], mesh_of(n)))
    with dtensor.GradientTape() as tape:
        tape.watch(x)
        got = loss(labels, x)
    close(dtensor.gather(got), (want_loss * valid).sum() / valid.sum(), 2e-6, "loss")
    close(dtensor.gather(tape.gradient(got, x)), want_g, 2e-6, "gradient")


def test_probabilities_program_is_one_pass(mesh_2d):
    """Traced with the classes sharded: the fused op's pass of probabilities, one all-reduce
    (the sums) for the classes, none of maxima, no log of every element."""
    labels, p = clipped_operands(6, 30, 3)
    x = dtensor.dtensor_from_array(p, dtensor.Layout(["x", "y"], mesh_2d))
    lab = dtensor.dtensor_from_array(labels.astype(np.int32), dtensor.Layout(["x"], mesh_2d))
    loss = keras.losses.SparseCategoricalCrossentropy()
    f = dtensor.function(lambda lab, x: loss(lab, x))
    close(dtensor.gather(f(lab, x)), ref_loss_grad(labels, p, np.ones(6))[0].mean(), 2e-6,
          "loss")
    text = f.program(lab, x)[0]
    assert "sum of clipped p" in text and "unary log" not in text, text
    assert "all_reduce max" not in text and text.count("all_reduce sum over {y}") == 1, text


# ---- metrics: Keras's documented values ----------------------------------------------------------

DOC_PRED = [[0.05, 0.95, 0], [0.1, 0.8, 0.1]]


@pytest.mark.parametrize("n", [1, 2])
def test_documented_values(runtime, n):
    """Keras 3's docstring examples, the predictions laid out every way on the mesh."""
    mesh = mesh_of(n)
    M = keras.metrics
    cases = [  # metric, labels, predictions, (result, result with the weights), weights
        (lambda: M.SparseCategoricalCrossentropy(), [1, 2], DOC_PRED, (1.1769392, 1.6271976),
         [0.3, 0.7]),
        (lambda: M.CategoricalCrossentropy(), [[0, 1, 0], [0, 0, 1]], DOC_PRED,
         (1.1769392, 1.6271976), [0.3, 0.7]),
        (lambda: M.SparseCategoricalAccuracy(), [[2], [1]], [[0.1, 0.6, 0.3], [0.05, 0.95, 0]],
         (0.5, 0.3), [0.7, 0.3]),
        (lambda: M.SparseTopKCategoricalAccuracy(k=1), [2, 1],
         [[0.1, 0.9, 0.8], [0.05, 0.95, 0]], (0.5, 0.3), [0.7, 0.3]),
        (lambda: M.CategoricalAccuracy(), [[0, 0, 1], [0, 1, 0]],
         [[0.1, 0.9, 0.8], [0.05, 0.95, 0]], (0.5, 0.3), [0.7, 0.3]),
    ]
    for make, y_true, y_pred, want, weights in cases:
        for specs in layouts(n):
            x = dtensor.dtensor_from_array(np.asarray(y_pred, np.float32),
                                           dtensor.Layout(list(specs), mesh))
            m = make()
            m.update_state(y_true, x)
            close(result(m), want[0], 1e-6, f"{m.name} {specs}")
            m.reset_state()
            m.update_state(y_true, x, sample_weight=np.asarray(weights))
            close(result(m), want[1], 1e-6, f"{m.name} weighted {specs}")
    m = M.Accuracy()
    m.update_state([[1], [2], [3], [4]], [[0], [2], [3], [4]])
    close(result(m), 0.75, 1e-7, "Accuracy")
    m.reset_state()
    m.update_state([[1], [2], [3], [4]], [[0], [2], [3], [4]], sample_weight=[1, 1, 0, 0])
    close(result(m), 0.5, 1e-7, "Accuracy weighted")
    m = M.Mean()
    m.update_state([1, 3, 5, 7])
    close(result(m), 4.0, 1e-7, "Mean")
    m.reset_state()
    m.update_state([1, 3, 5, 7], sample_weight=[1, 1, 0, 0])
    close(result(m), 2.0, 1e-7, "Mean weighted")
    assert m.name == "mean" and M.SparseCategoricalCrossentropy().name == \
        "sparse_categorical_crossentropy"


# ---- metrics against numpy -----------------------------------------------------------------------

def ref_xent(labels, y_pred, from_logits):
    """Keras's per-example sparse cross-entropy, float64 (probabilities: of log of the clipped)."""
    z = np.asarray(y_pred, np.float64)
    if not from_logits:
        z = np.log(np.clip(z, LO, HI))
    m = z.max(-1, keepdims=True)
    logp = z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))
    return -np.take_along_axis(logp, np.asarray(labels)[..., None], -1)[..., 0]


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("from_logits", [True, False])
def test_sparse_crossentropy_metric_accumulates(runtime, n, from_logits):
    """Two batches (the second weighted) accumulate; ignore_class as Keras 3: 0 and counted
    without weights, weight 0 with them; reset_state starts over."""
    rng = np.random.default_rng(20 + n)
    mesh = mesh_of(n)
    for specs in layouts(n):
        m = keras.metrics.SparseCategoricalCrossentropy(from_logits=from_logits,
                                                        ignore_class=0)
        num = den = 0.0
        for k, w in enumerate([None, rng.uniform(0.5, 2, 12)]):
            z = rng.standard_normal((12, 50))
            y = z if from_logits else np.exp(z) / np.exp(z).sum(-1, keepdims=True)
            y = y.astype(np.float32)
            labels = rng.integers(0, 50, 12)
            labels[k::5] = 0
            valid = labels != 0
            v = np.where(valid, ref_xent(labels, y, from_logits), 0)
            ww = np.ones(12) if w is None else w * valid
            num, den = num + (v * ww).sum(), den + ww.sum()
            m.update_state(labels, dtensor.dtensor_from_array(
                y, dtensor.Layout(list(specs), mesh)), sample_weight=w)
        close(result(m), num / den, 2e-6, f"{specs}")
        m.reset_state()
        assert result(m) == 0.0


def test_sequence_metrics_with_rows_weights(mesh_2d):
    """Labels [4, 3] against predictions [4, 3, 20] (rows over x, classes over y), weights per
    row: Keras's mean of each example's mean, counted by its weight."""
    rng = np.random.default_rng(5)
    z = rng.standard_normal((4, 3, 20)).astype(np.float32)
    labels = rng.integers(0, 20, (4, 3))
    w = np.array([1.0, 0.0, 2.0, 0.5])
    x = dtensor.dtensor_from_array(z, dtensor.Layout(["x", U, "y"], mesh_2d))
    m = keras.metrics.SparseCategoricalCrossentropy(from_logits=True)
    m.update_state(labels, x, sample_weight=w)
    v = ref_xent(labels, z, True)
    close(result(m), (v.mean(1) * w).sum() / w.sum(), 2e-6, "crossentropy")
    acc = keras.metrics.SparseCategoricalAccuracy()
    acc.update_state(labels, x, sample_weight=w)
    hits = (z.argmax(-1) == labels).mean(1)
    close(result(acc), (hits * w).sum() / w.sum(), 1e-6, "accuracy")


@pytest.mark.parametrize("n", [1, 4])
def test_top_k_ties_and_sorted_ids(runtime, n):
    """tf.math.in_top_k's ties (the classes tied at the k-th place are all in); a NaN
    prediction is never in; from_sorted_ids reads ids."""
    p = np.array([[0.1, 0.3, 0.3, 0.3, 0.0], [0.5, 0.1, 0.2, 0.1, 0.1],
                  [np.nan, 0.2, 0.2, 0.5, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2]], np.float32)
    labels = np.array([3, 3, 0, 4])
    want = {1: [1, 0, 0, 1], 2: [1, 0, 0, 1], 3: [1, 1, 0, 1]}  # row 1: two classes above
    mesh = mesh_of(n)
    for specs in layouts(n):
        x = dtensor.dtensor_from_array(p, dtensor.Layout(list(specs), mesh))
        for k, hits in want.items():
            m = keras.metrics.SparseTopKCategoricalAccuracy(k=k)
            m.update_state(labels, x)
            close(result(m), np.mean(hits), 1e-7, f"k={k} {specs}")
    ids = np.array([[3, 1, 2], [0, 2, 1]], np.float32)
    m = keras.metrics.SparseTopKCategoricalAccuracy(k=2, from_sorted_ids=True)
    m.update_state([1, 1], dtensor.dtensor_from_array(ids, dtensor.Layout([U, U], mesh)))
    close(result(m), 0.5, 1e-7, "from_sorted_ids")


def test_compile_metrics_by_name(runtime):
    """compile(metrics=[...]) by Keras's names: evaluate's values against numpy of the model's
    own outputs."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(12, 5)).astype(np.float32)
    y = rng.integers(0, 4, 12).astype(np.int32)
    model = keras.Sequential([keras.layers.Dense(4, activation="softmax", input_shape=(5,))])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy",
                  metrics=["sparse_categorical_crossentropy", "sparse_top_k_categorical_accuracy",
                           "accuracy"])
    w, b = model.get_weights()
    z = x.astype(np.float64) @ w + b
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    logs = model.evaluate(x, y, batch_size=6, verbose=0, return_dict=True)
    # the metric of the softmax's probabilities (the loss reads the logits)
    close(logs["sparse_categorical_crossentropy"], ref_xent(y, p, False).mean(), 1e-5, "scce")
    close(logs["sparse_top_k_categorical_accuracy"], 1.0, 0, "top 5 of 4 classes")
    close(logs["accuracy"], (p.argmax(-1) == y).mean(), 0, "accuracy")
