"""dtensor.nn.scaled_dot_product_attention (dt_attention) against numpy: the forward pass and
the gradients of q, k and v by the softmax-attention formulas in float64, causal or not, with
and without a scale, over layouts of the batch and head axes on meshes of 1 to 6 devices (even
and uneven shards), float32 and float64, and its errors."""
import numpy as np
import pytest

import dtensor

U = dtensor.UNSHARDED


def reference(q, k, v, dy, causal, scale):
    """y = softmax(scale q k^T) v and its vector-Jacobian product with dy, in float64."""
    q, k, v, dy = (np.asarray(a, np.float64) for a in (q, k, v, dy))
    s = scale * q @ np.swapaxes(k, -1, -2)
    if causal:
        t = q.shape[-2]
        s = np.where(np.triu(np.ones((t, t), bool), 1), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    y = p @ v
    dv = np.swapaxes(p, -1, -2) @ dy
    dp = dy @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return y, scale * ds @ k, scale * np.swapaxes(ds, -1, -2) @ q, dv


def operands(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(4)]


def run(mesh, specs, arrays, causal, scale):
    """(y, dq, dk, dv) gathered, the gradient of sum(y * dy) through a GradientTape."""
    layout = dtensor.Layout(list(specs), mesh)
    q, k, v, dy = (dtensor.dtensor_from_array(a, layout) for a in arrays)
    with dtensor.GradientTape() as tape:
        tape.watch([q, k, v])
        y = dtensor.nn.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        loss = dtensor.reduce_sum(y * dy)
    grads = tape.gradient(loss, [q, k, v])
    # the batch and head layout kept, a split sequence or feature axis gathered
    assert y.layout == dtensor.Layout(list(specs[:-2]) + [U, U], mesh)
    for g in grads:
        assert g.layout == layout
    return [dtensor.gather(t) for t in [y] + grads]


def check(got, arrays, causal, scale, dtype):
    want = reference(*arrays, causal, scale if scale is not None else
                     1 / np.sqrt(arrays[0].shape[-1]))
    tol = 1e-12 if dtype == np.float64 else 2e-5
    for name, g, w in zip(("y", "dq", "dk", "dv"), got, want):
        assert g.dtype == dtype
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=name)


def mesh_of(n):
    return dtensor.create_mesh([("x", n)], devices=[f"CPU:{i}" for i in range(n)])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("causal,scale", [(False, None), (True, None), (True, 0.3),
                                          (False, 1.7)])
def test_meshes_of_1_to_6_devices(runtime, n, causal, scale):
    """Heads sharded over every mesh size: 6 heads split evenly over 1, 2, 3, 6 devices and
    unevenly over 4 and 5; the batch of 3 sharded too where it can be."""
    arrays = operands((3, 6, 7, 5), np.float32, seed=n)
    mesh = mesh_of(n)
    check(run(mesh, [U, "x", U, U], arrays, causal, scale), arrays, causal, scale, np.float32)
    check(run(mesh, ["x", U, U, U], arrays, causal, scale), arrays, causal, scale, np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("specs", [
    ("x", "y", U, U),    # batch over x, heads over y
    ("y", "x", U, U),    # the other way round
    (U, U, U, U),        # replicated
    (U, "y", U, U),      # heads only
    ("x", U, "y", U),    # batch over x, the sequence split: gathered first
    (U, U, U, "x"),      # the features split: gathered first
])
@pytest.mark.parametrize("causal", [False, True])
def test_layouts_of_batch_and_heads(mesh_2d, dtype, specs, causal):
    """On the 3 x 2 mesh, f32 and f64: batch 3 (even over x), 4 heads (uneven over x, even
    over y), a sequence of 9 (uneven over y), 6 features."""
    arrays = operands((3, 4, 9, 6), dtype, seed=7)
    check(run(mesh_2d, specs, arrays, causal, None), arrays, causal, None, dtype)


def test_traced_function_and_rank_3(mesh_1d):
    """Inside dtensor.function, on [B*H, T, D] operands (any rank >= 2 works alike)."""
    arrays = operands((6, 8, 4), np.float64, seed=3)
    layout = dtensor.Layout(["x", U, U], mesh_1d)
    q, k, v, _ = (dtensor.dtensor_from_array(a, layout) for a in arrays)
    f = dtensor.function(lambda a, b, c: dtensor.nn.scaled_dot_product_attention(
        a, b, c, is_causal=True, scale=0.5))
    y = f(q, k, v)
    want = reference(*arrays, True, 0.5)[0]
    np.testing.assert_allclose(dtensor.gather(y), want, rtol=1e-12, atol=1e-12)
    text = f.program(q, k, v)[0]
    assert "attention" in text and "all_" not in text, "sharded batch: no collective"


def test_equals_composed_attention(mesh_2d):
    """Against the same attention composed from dtensor's own ops (matmul, softmax), both
    differentiated by the tape."""
    arrays = operands((3, 2, 6, 4), np.float64, seed=11)
    layout = dtensor.Layout(["x", "y", U, U], mesh_2d)
    q, k, v, dy = (dtensor.dtensor_from_array(a, layout) for a in arrays)
    with dtensor.GradientTape(persistent=True) as tape:
        tape.watch([q, k, v])
        fused = dtensor.nn.scaled_dot_product_attention(q, k, v, scale=0.25)
        composed = dtensor.matmul(dtensor.nn.softmax(
            dtensor.matmul(q, k, transpose_b=True) * 0.25, axis=-1), v)
        lf = dtensor.reduce_sum(fused * dy)
        lc = dtensor.reduce_sum(composed * dy)
    for a, b in zip(tape.gradient(lf, [q, k, v]), tape.gradient(lc, [q, k, v])):
        np.testing.assert_allclose(dtensor.gather(a), dtensor.gather(b), rtol=1e-12,
                                   atol=1e-12)
    np.testing.assert_allclose(dtensor.gather(fused), dtensor.gather(composed), rtol=1e-12,
                               atol=1e-12)


def test_bfloat16_computes_in_float32(mesh_1d):
    arrays = operands((6, 2, 5, 4), np.float32, seed=5)
    bf = [a.astype(dtensor.bfloat16) for a in arrays]
    layout = dtensor.Layout(["x", U, U, U], mesh_1d)
    q, k, v = (dtensor.dtensor_from_array(a, layout) for a in bf[:3])
    y = dtensor.nn.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert y.dtype == dtensor.bfloat16
    want = reference(*[a.astype(np.float32) for a in bf], True, 0.5)[0]
    np.testing.assert_allclose(dtensor.gather(y).astype(np.float32), want, rtol=1e-2,
                               atol=1e-2)


def test_keras_functional(runtime):
    """A Keras functional model's node, as the tf.nn ops (batch of 3, 2 heads)."""
    x = dtensor.keras.Input(shape=(2, 5, 4))
    model = dtensor.keras.Model(x, dtensor.nn.scaled_dot_product_attention(x, x, x,
                                                                           is_causal=True))
    a = operands((3, 2, 5, 4), np.float32, seed=9)[0]
    want = reference(a, a, a, a, True, 0.5)[0]
    np.testing.assert_allclose(np.asarray(dtensor.gather(model(a))), want, rtol=2e-5,
                               atol=2e-5)


# ---- errors: before any op, the same on every client ----------------------------------------

def _t(mesh, shape, dtype=np.float32, specs=None):
    specs = specs or [U] * len(shape)
    return dtensor.dtensor_from_array(np.ones(shape, dtype), dtensor.Layout(specs, mesh))


@pytest.mark.parametrize("make,error,match", [
    (lambda m: (_t(m, (2, 3, 4, 5)), _t(m, (2, 3, 6, 5)), _t(m, (2, 3, 4, 5))),
     dtensor.errors.InvalidArgumentError,
     r"k is float32\[2, 3, 6, 5\], query float32\[2, 3, 4, 5\]"),
    (lambda m: (_t(m, (2, 3, 4, 5)), _t(m, (2, 3, 4, 5)), _t(m, (2, 3, 4, 5), np.float64)),
     dtensor.errors.InvalidArgumentError, r"v is float64\[2, 3, 4, 5\], query float32"),
    (lambda m: (_t(m, (2, 4), np.int32), _t(m, (2, 4), np.int32), _t(m, (2, 4), np.int32)),
     dtensor.errors.InvalidArgumentError, r"q is int32: expected one of float16"),
    (lambda m: (_t(m, (5,)), _t(m, (5,)), _t(m, (5,))),
     dtensor.errors.InvalidArgumentError, r"query has shape \[5\]: expected rank >= 2"),
])
def test_bad_operands(mesh_1d, make, error, match):
    q, k, v = make(mesh_1d)
    with pytest.raises(error, match=match):
        dtensor.nn.scaled_dot_product_attention(q, k, v)


def test_operands_on_two_meshes(mesh_1d, mesh_2d):
    a, b = _t(mesh_1d, (2, 2, 3, 4)), _t(mesh_2d, (2, 2, 3, 4))
    with pytest.raises(dtensor.errors.InvalidArgumentError, match="expected one mesh"):
        dtensor.nn.scaled_dot_product_attention(a, b, a)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_scale(mesh_1d, scale):
    q = _t(mesh_1d, (1, 2, 3, 4))
    with pytest.raises(dtensor.errors.InvalidArgumentError, match=f"scale {scale!r}"):
        dtensor.nn.scaled_dot_product_attention(q, q, q, scale=scale)
    with pytest.raises(dtensor.errors.InvalidArgumentError, match="scale must be a number"):
        dtensor.nn.scaled_dot_product_attention(q, q, q, scale="0.5")


def test_mask_and_dropout_unsupported(mesh_1d):
    q = _t(mesh_1d, (1, 2, 3, 4))
    with pytest.raises(dtensor.errors.UnimplementedError, match="attn_mask"):
        dtensor.nn.scaled_dot_product_attention(q, q, q, attn_mask=q)
    with pytest.raises(dtensor.errors.UnimplementedError, match="dropout_p=0.1"):
        dtensor.nn.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
