"""The row-wise ops through the Python layer against numpy: nn.softmax, nn.log_softmax,
math.reduce_logsumexp, nn.layer_norm, nn.rms_norm, argmax, argmin and math.cumsum along every
axis under sharded and uneven layouts (the reduced axis sharded included), the dtypes they take
and refuse, gradients through GradientTape against numpy's and central finite differences, and
Keras' LayerNormalization."""
import ml_dtypes
import numpy as np
import pytest

import dtensor

FLOATS = [np.float32, np.float64, ml_dtypes.bfloat16, np.float16]
# one unit in the last place of each float dtype, relative (results round once)
TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12,
       np.dtype(ml_dtypes.bfloat16): 1e-2, np.dtype(np.float16): 2e-3}
SPECS = [("x", "y"), ("y", "x"), ("unsharded", "x"), ("x", "unsharded"), ("unsharded", "unsharded")]


def data(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(scale=2.0, size=shape).astype(dtype)


def put(a, spec, mesh):
    return dtensor.dtensor_from_array(a, dtensor.Layout(list(spec), mesh))


def np_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def np_logsumexp(x, axis, keepdims):
    m = x.max(axis=axis, keepdims=True)
    r = m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))
    return r if keepdims else np.squeeze(r, axis=axis)


def close(got, want, dtype):
    tol = TOL[np.dtype(dtype)]
    got = np.asarray(got).astype(np.float64)
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= tol * np.maximum(1.0, np.abs(want))), \
        np.max(np.abs(got - want))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("spec", SPECS)
def test_softmax_family(mesh_2d, dtype, spec):
    a = data((5, 7), dtype)  # 5 and 7 shard unevenly over 3 and 2
    x, t = a.astype(np.float64), put(a, spec, mesh_2d)
    for axis in (0, 1, -1):
        y = dtensor.nn.softmax(t, axis=axis)
        assert y.dtype == np.dtype(dtype) and y.layout == t.layout
        close(dtensor.gather(y), np_softmax(x, axis), dtype)
        close(dtensor.gather(dtensor.nn.log_softmax(t, axis)), np_log_softmax(x, axis), dtype)
    for axis in (0, 1, None, [0, 1]):
        for keep in (False, True):
            ax = tuple(axis) if isinstance(axis, list) else axis
            close(dtensor.gather(dtensor.math.reduce_logsumexp(t, axis=axis, keepdims=keep)),
                  np_logsumexp(x, ax, keep), dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("spec", [("x", "unsharded", "y"), ("unsharded", "y", "x"),
                                  ("y", "x", "unsharded")])
def test_norms(mesh_2d, dtype, spec):
    a, g, b = data((4, 3, 7), dtype, 1), data((7,), dtype, 2), data((7,), dtype, 3)
    x = a.astype(np.float64)
    gf, bf = g.astype(np.float64), b.astype(np.float64)
    t = put(a, spec, mesh_2d)
    tg, tb = put(g, (spec[2],), mesh_2d), put(b, ("unsharded",), mesh_2d)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    eps = 1e-3
    xhat = (x - mu) / np.sqrt(var + eps)
    close(dtensor.gather(dtensor.nn.layer_norm(t, tg, tb, epsilon=eps)), xhat * gf + bf, dtype)
    close(dtensor.gather(dtensor.nn.layer_norm(t, epsilon=eps)), xhat, dtype)
    close(dtensor.gather(dtensor.nn.layer_norm(t, g, None, eps)), xhat * gf, dtype)  # numpy gamma
    rms = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    close(dtensor.gather(dtensor.nn.rms_norm(t, tg, epsilon=eps)), rms * gf, dtype)
    close(dtensor.gather(dtensor.nn.rms_norm(t, epsilon=eps)), rms, dtype)


ALL = [np.float32, np.float64, np.int32, np.int64, ml_dtypes.bfloat16, np.float16, np.bool_,
       np.uint8, np.int8]


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: np.dtype(d).name)
def test_argmax_argmin(mesh_2d, dtype):
    i = np.arange(5 * 7).reshape(5, 7)
    a = ((i * 5) % 4).astype(dtype) if np.dtype(dtype) != np.bool_ else (i % 3 == 1)  # ties
    if np.dtype(dtype).kind == "f" or np.dtype(dtype) == ml_dtypes.bfloat16:
        a = a.copy()
        a[1, 2] = a[1, 5] = a[3, 0] = np.nan  # NaN wins, the first one
    for spec in SPECS:
        t = put(a, spec, mesh_2d)
        for axis in (0, 1):
            want_max = np.argmax(a.astype(np.float64), axis=axis)
            want_min = np.argmin(a.astype(np.float64), axis=axis)
            got = dtensor.argmax(t, axis=axis)
            assert got.dtype == np.int64
            np.testing.assert_array_equal(dtensor.gather(got), want_max)
            got = dtensor.math.argmin(t, axis, output_type=np.int32)
            assert got.dtype == np.int32
            np.testing.assert_array_equal(dtensor.gather(got), want_min)
    # TensorFlow's default axis is 0
    np.testing.assert_array_equal(dtensor.gather(dtensor.argmax(put(a, SPECS[0], mesh_2d))),
                                  np.argmax(a.astype(np.float64), axis=0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8,
                                   np.int8, ml_dtypes.bfloat16, np.float16],
                         ids=lambda d: np.dtype(d).name)
def test_cumsum(mesh_2d, dtype):
    i = np.arange(5 * 7).reshape(5, 7)
    a = (((i * 7) % 11 - 5) * (0.5 if np.dtype(dtype).kind in "fV" or
                               np.dtype(dtype) == ml_dtypes.bfloat16 else 2)).astype(dtype)
    x = a.astype(np.float64)
    for spec in SPECS:
        t = put(a, spec, mesh_2d)
        for axis in (0, 1):
            for excl in (False, True):
                for rev in (False, True):
                    v = np.flip(x, axis) if rev else x
                    c = np.cumsum(v, axis=axis)
                    if excl:
                        c = c - v
                    want = np.flip(c, axis) if rev else c
                    got = dtensor.math.cumsum(t, axis=axis, exclusive=excl, reverse=rev)
                    assert got.dtype == np.dtype(dtype) and got.layout == t.layout
                    # exact: halves (or whole numbers, wrapping in 8 bits) in every dtype
                    np.testing.assert_array_equal(dtensor.gather(got),
                                                  want.astype(np.int64).astype(dtype)
                                                  if np.dtype(dtype).kind in "iu" else
                                                  want.astype(dtype))


def test_refusals(mesh_2d):
    ti = put(np.arange(6, dtype=np.int32).reshape(2, 3), ("x", "unsharded"), mesh_2d)
    tb = put(np.ones((2, 3), bool), ("x", "unsharded"), mesh_2d)
    with pytest.raises(dtensor.DTensorError, match="i32"):
        dtensor.nn.softmax(ti)
    with pytest.raises(dtensor.DTensorError, match="i32"):
        dtensor.nn.layer_norm(ti)
    with pytest.raises(dtensor.DTensorError, match="bool"):
        dtensor.cumsum(tb)
    with pytest.raises(dtensor.DTensorError, match="axis 2"):
        dtensor.nn.softmax(put(np.ones((2, 3), np.float32), ("x", "y"), mesh_2d), axis=2)
    with pytest.raises(dtensor.DTensorError, match="index dtype f32"):
        dtensor.argmax(ti, 0, output_type=np.float32)
    with pytest.raises(dtensor.DTensorError, match="gamma is"):
        dtensor.nn.layer_norm(put(np.ones((2, 3), np.float32), ("x", "y"), mesh_2d),
                              np.ones(4, np.float32))


def numeric_grad(f, x, h=1e-6):
    g = np.zeros_like(x)
    for k in np.ndindex(*x.shape):
        p, m = x.copy(), x.copy()
        p[k] += h
        m[k] -= h
        g[k] = (f(p) - f(m)) / (2 * h)
    return g


@pytest.mark.parametrize("spec", [("x", "y"), ("unsharded", "x")])
def test_gradients(mesh_2d, spec):
    """d sum(w * op(x)) through GradientTape against finite differences of the numpy op."""
    a = data((5, 6), np.float64, 4)
    w = data((5, 6), np.float64, 5)
    g6, b6 = data((6,), np.float64, 6), data((6,), np.float64, 7)
    eps = 1e-3

    def np_ln(x, g, b):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * g + b

    def np_rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    cases = {
        "softmax": (lambda t: dtensor.nn.softmax(t, axis=1), lambda x: np_softmax(x, 1)),
        "softmax0": (lambda t: dtensor.nn.softmax(t, axis=0), lambda x: np_softmax(x, 0)),
        "log_softmax": (lambda t: dtensor.nn.log_softmax(t), lambda x: np_log_softmax(x, -1)),
        "logsumexp": (lambda t: dtensor.reduce_logsumexp(t, axis=1, keepdims=True) * 1.0,
                      lambda x: np_logsumexp(x, 1, True)),
        "cumsum": (lambda t: dtensor.cumsum(t, axis=1, exclusive=True),
                   lambda x: np.cumsum(x, 1) - x),
        "cumsum_rev": (lambda t: dtensor.cumsum(t, axis=0, reverse=True),
                       lambda x: np.flip(np.cumsum(np.flip(x, 0), 0), 0)),
        "layer_norm": (lambda t: dtensor.nn.layer_norm(t, g6, b6, eps), lambda x: np_ln(x, g6, b6)),
        "rms_norm": (lambda t: dtensor.nn.rms_norm(t, g6, eps), lambda x: np_rms(x, g6)),
    }
    for name, (op, ref) in cases.items():
        v = dtensor.DVariable(put(a, spec, mesh_2d))
        tw = put(w, ("unsharded", "unsharded"), mesh_2d)
        with dtensor.GradientTape() as tape:
            y = op(v)
            if y.ndim == 2 and y.shape[1] == 1:
                y = dtensor.reshape(y, [5])
                tw_ = put(w[:, 0], ("unsharded",), mesh_2d)
                loss = dtensor.reduce_sum(y * tw_)
            else:
                loss = dtensor.reduce_sum(y * tw)
        (g,) = tape.gradient(loss, [v])
        wr = w[:, :1] if name == "logsumexp" else w
        want = numeric_grad(lambda x: float(np.sum(ref(x) * wr)), a)
        np.testing.assert_allclose(dtensor.gather(g), want, rtol=1e-6, atol=1e-7, err_msg=name)


def test_norm_parameter_gradients_batch_sharded(mesh_2d):
    """gamma and beta replicated, x sharded on its batch axis: their gradients sum over the batch
    (partial over x's mesh axis, all-reduced by the expansion) and match numpy's."""
    a, w = data((6, 4), np.float64, 8), data((6, 4), np.float64, 9)
    g0, b0 = data((4,), np.float64, 10), data((4,), np.float64, 11)
    x = put(a, ("x", "unsharded"), mesh_2d)
    gamma = dtensor.DVariable(put(g0, ("unsharded",), mesh_2d))
    beta = dtensor.DVariable(put(b0, ("unsharded",), mesh_2d))
    with dtensor.GradientTape() as tape:
        loss = dtensor.reduce_sum(dtensor.nn.layer_norm(x, gamma, beta, 1e-5) *
                                  put(w, ("x", "unsharded"), mesh_2d))
    dg, db = tape.gradient(loss, [gamma, beta])
    mu, var = a.mean(-1, keepdims=True), a.var(-1, keepdims=True)
    xhat = (a - mu) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(dtensor.gather(dg), (w * xhat).sum(0), rtol=1e-10)
    np.testing.assert_allclose(dtensor.gather(db), w.sum(0), rtol=1e-10)
    assert dg.layout == gamma.layout


def test_keras_layer_normalization(mesh_2d):
    keras = dtensor.keras
    a = data((6, 5), np.float32, 12)
    layer = keras.layers.LayerNormalization(epsilon=1e-3)
    x = put(a, ("x", "unsharded"), mesh_2d)
    y = layer(x)
    x64 = a.astype(np.float64)
    want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-3)
    close(dtensor.gather(y), want, np.float32)
    assert [v.name for v in layer.trainable_variables] == [f"{layer.name}/gamma",
                                                           f"{layer.name}/beta"]
    with dtensor.GradientTape() as tape:
        loss = dtensor.reduce_sum(layer(x) * 2.0)
    dg, db = tape.gradient(loss, layer.trainable_variables)
    np.testing.assert_allclose(dtensor.gather(db), np.full(5, 12.0), rtol=1e-6)
    np.testing.assert_allclose(dtensor.gather(dg), 2 * want.sum(0), rtol=1e-4, atol=1e-5)
