"""dtensor.nn.sparse_softmax_cross_entropy_with_logits (one fused op) against numpy: the loss
by a float64 log-softmax and its gradient (softmax - onehot) dy, float32/float64/bfloat16/
float16, logits of rank 1 to 3, the batch and the class axes sharded alone and together on
meshes of 1 to 6 devices (even and uneven shards: 50 classes on 4), eager and inside
dtensor.function; against the composed logsumexp/one_hot formulation; and its errors."""
import numpy as np
import pytest

import dtensor

U = dtensor.UNSHARDED


def reference(labels, logits, dy):
    """Loss and d logits in float64."""
    x = np.asarray(logits, np.float64)
    m = x.max(-1, keepdims=True)
    lse = m + np.log(np.exp(x - m).sum(-1, keepdims=True))
    logp = x - lse
    hot = np.eye(x.shape[-1])[labels]
    loss = -(hot * logp).sum(-1)
    return loss, (np.exp(logp) - hot) * np.asarray(dy, np.float64)[..., None]


def operands(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    logits = (3 * rng.standard_normal(shape)).astype(dtype)
    labels = rng.integers(0, shape[-1], shape[:-1]).astype(np.int32)
    dy = rng.standard_normal(shape[:-1]).astype(dtype)
    return labels, logits, dy


def run(mesh, specs, labels, logits, dy):
    """(loss, d logits) gathered, the gradient of sum(loss * dy) through a GradientTape."""
    layout = dtensor.Layout(list(specs), mesh)
    x = dtensor.dtensor_from_array(logits, layout)
    rows = dtensor.Layout(list(specs[:-1]), mesh)
    lab = dtensor.dtensor_from_array(labels, rows)
    d = dtensor.dtensor_from_array(dy, rows)
    with dtensor.GradientTape() as tape:
        tape.watch(x)
        loss = dtensor.nn.sparse_softmax_cross_entropy_with_logits(labels=lab, logits=x)
        total = dtensor.reduce_sum(loss * d)
    g = tape.gradient(total, x)
    assert loss.dtype == logits.dtype and g.dtype == logits.dtype
    assert loss.layout == rows, "the loss keeps the rows' layout"
    assert g.layout == layout, "the gradient keeps the logits' layout"
    return dtensor.gather(loss), dtensor.gather(g)


TOL = {np.float64: 1e-12, np.float32: 2e-5}


def check(got, labels, logits, dy, tol):
    want = reference(labels, logits, dy)
    for name, g, w in zip(("loss", "dlogits"), got, want):
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=tol, atol=tol,
                                   err_msg=name)


def mesh_of(n):
    return dtensor.create_mesh([("x", n)], devices=[f"CPU:{i}" for i in range(n)])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_meshes_of_1_to_6_devices(runtime, n, dtype):
    """50 classes sharded over every mesh size (uneven on 4, 6: shards of 13 and 12, 9 and 8),
    and the batch of 12 sharded instead."""
    labels, logits, dy = operands((12, 50), dtype, seed=n)
    mesh = mesh_of(n)
    for specs in ([U, "x"], ["x", U], [U, U]):
        check(run(mesh, specs, labels, logits, dy), labels, logits, dy, TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("specs", [
    ("x", "y", U),   # batch over x, sequence over y, classes whole
    ("x", U, "y"),   # batch over x, classes over y (the GPT-2 example's vocabulary)
    (U, U, "x"),     # classes over x, 3 uneven shards of 37
    ("y", "x", U),
    (U, U, U),
])
def test_rank_3_layouts(mesh_2d, dtype, specs):
    labels, logits, dy = operands((3, 4, 37), dtype, seed=7)
    check(run(mesh_2d, specs, labels, logits, dy), labels, logits, dy, TOL[dtype])


def test_rank_1(mesh_1d):
    """One row: logits [C], a scalar label and loss."""
    labels, logits, dy = operands((17,), np.float64, seed=2)
    for specs in ([U], ["x"]):
        check(run(mesh_1d, specs, labels, logits, dy), labels, logits, dy, 1e-12)


@pytest.mark.parametrize("dtype,tol", [(dtensor.bfloat16, 2e-2), (np.float16, 2e-3)])
def test_16_bit_floats_compute_in_float32(mesh_2d, dtype, tol):
    labels, logits, dy = operands((6, 40), np.float32, seed=5)
    logits, dy = logits.astype(dtype), dy.astype(dtype)
    got = run(mesh_2d, ["x", "y"], labels, logits, dy)
    want = reference(labels, logits.astype(np.float64), dy.astype(np.float64))
    for g, w in zip(got, want):
        assert g.dtype == dtype
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=tol, atol=tol)


def test_traced_function(mesh_2d):
    """Inside dtensor.function: the loss and its gradient; the class axis sharded costs
    all-reduces of statistics, never a gather of the logits."""
    labels, logits, dy = operands((6, 4, 30), np.float32, seed=3)
    layout = dtensor.Layout(["x", U, "y"], mesh_2d)
    x = dtensor.dtensor_from_array(logits, layout)
    lab = dtensor.dtensor_from_array(labels, dtensor.Layout(["x", U], mesh_2d))
    d = dtensor.dtensor_from_array(dy, dtensor.Layout(["x", U], mesh_2d))

    f = dtensor.function(lambda lab, x, d: dtensor.reduce_sum(
        dtensor.nn.sparse_softmax_cross_entropy_with_logits(lab, x) * d))
    outs = f.gradient(0, [1], lab, x, d)(lab, x, d)
    want = reference(labels, logits, dy)
    np.testing.assert_allclose(dtensor.gather(outs[0]), (want[0] * dy).sum(), rtol=2e-5)
    np.testing.assert_allclose(dtensor.gather(outs[1]), want[1], rtol=2e-5, atol=2e-5)
    assert outs[1].layout == layout
    text = f.program(lab, x, d)[0]
    assert "xent" in text and "one_hot" not in text
    assert "all_gather" not in text, text


def test_equals_composed_formulation(mesh_2d):
    """Against the loss composed of logsumexp, one_hot, multiply and reduce_sum (the former
    implementation), both differentiated by the tape, classes sharded."""
    labels, logits, dy = operands((6, 21), np.float64, seed=11)
    layout = dtensor.Layout(["x", "y"], mesh_2d)
    x = dtensor.dtensor_from_array(logits, layout)
    lab = dtensor.dtensor_from_array(labels, dtensor.Layout(["x"], mesh_2d))
    d = dtensor.dtensor_from_array(dy, dtensor.Layout(["x"], mesh_2d))
    with dtensor.GradientTape(persistent=True) as tape:
        tape.watch(x)
        fused = dtensor.nn.sparse_softmax_cross_entropy_with_logits(lab, x)
        composed = dtensor.reduce_logsumexp(x, axis=-1) - dtensor.reduce_sum(
            dtensor.one_hot(lab, 21, dtype=dtensor.float64) * x, axis=-1)
        lf = dtensor.reduce_sum(fused * d)
        lc = dtensor.reduce_sum(composed * d)
    np.testing.assert_allclose(dtensor.gather(fused), dtensor.gather(composed), rtol=1e-12,
                               atol=1e-12)
    np.testing.assert_allclose(dtensor.gather(tape.gradient(lf, x)),
                               dtensor.gather(tape.gradient(lc, x)), rtol=1e-12, atol=1e-12)


def test_labels_outside_the_classes_give_nan(mesh_1d):
    """As TensorFlow's GPU kernel: NaN for that row only (eager and traced alike)."""
    logits = np.zeros((3, 6), np.float32)
    x = dtensor.dtensor_from_array(logits, dtensor.Layout([U, "x"], mesh_1d))
    loss = dtensor.gather(dtensor.nn.sparse_softmax_cross_entropy_with_logits([0, 6, -1], x))
    assert np.isclose(loss[0], np.log(6)) and np.isnan(loss[1]) and np.isnan(loss[2])


def test_host_labels_and_small_integers(mesh_1d):
    """Labels as a list, and as int8 / int64 DTensors."""
    labels, logits, dy = operands((6, 9), np.float64, seed=4)
    x = dtensor.dtensor_from_array(logits, dtensor.Layout(["x", U], mesh_1d))
    want = reference(labels, logits, dy)[0]
    for lab in (labels.tolist(),
                dtensor.dtensor_from_array(labels.astype(np.int8), dtensor.Layout([U], mesh_1d)),
                dtensor.dtensor_from_array(labels.astype(np.int64),
                                           dtensor.Layout(["x"], mesh_1d))):
        got = dtensor.nn.sparse_softmax_cross_entropy_with_logits(lab, x)
        np.testing.assert_allclose(dtensor.gather(got), want, rtol=1e-12, atol=1e-12)


# ---- errors: before any op, the same on every client ----------------------------------------

def _t(mesh, shape, dtype=np.float32):
    return dtensor.dtensor_from_array(np.ones(shape, dtype), dtensor.Layout([U] * len(shape),
                                                                            mesh))


@pytest.mark.parametrize("make,error,match", [
    (lambda m: (_t(m, (4,), np.int32), _t(m, (3, 5))), dtensor.errors.InvalidArgumentError,
     r"labels \[4\] do not match logits \[3,5\]"),
    (lambda m: (_t(m, (3, 5), np.int32), _t(m, (3, 5))), dtensor.errors.InvalidArgumentError,
     r"labels \[3,5\] do not match logits \[3,5\]"),
    (lambda m: (_t(m, (3,), np.float32), _t(m, (3, 5))), dtensor.errors.InvalidArgumentError,
     r"labels \[3\] are f32, expected i32 or i64"),
    (lambda m: (_t(m, (3,), np.int32), _t(m, (3, 5), np.int32)),
     dtensor.errors.InvalidArgumentError, r"logits \[3,5\] are i32, expected f32"),
])
def test_bad_operands(mesh_1d, make, error, match):
    labels, logits = make(mesh_1d)
    with pytest.raises(error, match=match):
        dtensor.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)


def test_rank_0_logits(mesh_1d):
    x = dtensor.dtensor_from_array(np.float32(1), dtensor.Layout([], mesh_1d))
    with pytest.raises(ValueError, match="rank >= 1"):
        dtensor.nn.sparse_softmax_cross_entropy_with_logits(0, x)
