"""Every dtype through the Python layer against numpy (ml_dtypes' bfloat16): round trips under
sharded and uneven layouts, tf.cast, comparisons giving bool, where, the logical ops and their
operators, PyTorch's promotion of mixed operands, the new float functions, bf16 and f16 matmul
accumulating in f32, and gradients through a cast."""
import math as _math

import ml_dtypes
import numpy as np
import pytest

import dtensor

ALL = [np.float32, np.float64, np.int32, np.int64, ml_dtypes.bfloat16, np.float16, np.bool_,
       np.uint8, np.int8]


def values(shape, dtype, salt=0):
    """Small values exact in every dtype (halves for floats, whole numbers for integers)."""
    i = np.arange(int(np.prod(shape))).reshape(shape)
    v = ((i * 7 + salt * 3) % 11 - 5) * 0.5
    if np.dtype(dtype) == np.bool_:
        return ((i + salt) % 3 != 0)
    if np.issubdtype(np.dtype(dtype), np.integer):
        v = 2 * v
    return v.astype(dtype)


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("spec", [("x", "y"), ("y", "x"), ("unsharded", "x")])
def test_round_trip_every_dtype(mesh_2d, dtype, spec):
    a = values((5, 7), dtype)  # 5 and 7 shard unevenly over 3 and 2
    t = dtensor.dtensor_from_array(a, dtensor.Layout(list(spec), mesh_2d))
    assert t.dtype == np.dtype(dtype)
    got = dtensor.gather(t)
    assert got.dtype == np.dtype(dtype) and np.array_equal(got.view(np.uint8), a.view(np.uint8))
    comps = dtensor.unpack(t)
    back = dtensor.pack(comps, t.layout, shape=(5, 7))
    assert np.array_equal(dtensor.gather(back).view(np.uint8), a.view(np.uint8))


@pytest.mark.parametrize("src", ALL, ids=lambda d: np.dtype(d).name)
def test_cast_matches_numpy(mesh_2d, src):
    a = values((4, 6), src)
    if np.issubdtype(np.dtype(src), np.floating) or np.dtype(src) == ml_dtypes.bfloat16:
        a = (a.astype(np.float64) * 1.25).astype(src)  # thirds: conversions truncate
    t = dtensor.dtensor_from_array(a, dtensor.Layout(["x", "y"], mesh_2d))
    for dst in ALL:
        got = dtensor.gather(dtensor.cast(t, dst))
        want = a.astype(np.float64).astype(dst) if np.dtype(src) == ml_dtypes.bfloat16 else \
            a.astype(dst)
        assert got.dtype == np.dtype(dst)
        assert np.array_equal(got.astype(np.float64), want.astype(np.float64)), (src, dst)


def test_comparisons_give_bool_and_logical_ops(mesh_2d):
    a, b = values((3, 4), np.float32, 1), values((3, 4), np.float32, 2)
    ta = dtensor.dtensor_from_array(a, dtensor.Layout(["x", "unsharded"], mesh_2d))
    tb = dtensor.dtensor_from_array(b, dtensor.Layout(["unsharded", "y"], mesh_2d))
    lt, ge = ta < tb, dtensor.greater_equal(ta, tb)
    assert lt.dtype == np.bool_ and np.array_equal(dtensor.gather(lt), a < b)
    assert np.array_equal(dtensor.gather(ge), a >= b)
    assert np.array_equal(dtensor.gather(lt & ge), np.zeros((3, 4), bool))
    assert np.array_equal(dtensor.gather(lt | ge), np.ones((3, 4), bool))
    assert np.array_equal(dtensor.gather(lt ^ (ta == ta)), ~(a < b))
    assert np.array_equal(dtensor.gather(~lt), ~(a < b))
    assert np.array_equal(dtensor.gather(dtensor.math.logical_not(ge)), a < b)
    with pytest.raises(dtensor.DTensorError, match="bool"):
        dtensor.logical_and(ta, tb)


def test_where_broadcasts_and_promotes(mesh_2d):
    c = values((4, 6), np.bool_, 1)
    x, y = values((4, 6), np.float32, 2), values((6,), np.int32, 3)
    tc = dtensor.dtensor_from_array(c, dtensor.Layout(["x", "y"], mesh_2d))
    tx = dtensor.dtensor_from_array(x, dtensor.Layout(["unsharded", "x"], mesh_2d))
    ty = dtensor.dtensor_from_array(y, dtensor.Layout(["y"], mesh_2d))
    r = dtensor.where(tc, tx, ty)
    assert r.dtype == np.float32
    assert np.array_equal(dtensor.gather(r), np.where(c, x, y.astype(np.float32)))
    assert np.array_equal(dtensor.gather(dtensor.where(tc, tx, 0.5)), np.where(c, x, 0.5))
    with pytest.raises(dtensor.errors.UnimplementedError):
        dtensor.where(tc)


@pytest.mark.parametrize("a_t,b_t,want", [
    (np.float32, np.float64, np.float64), (np.int64, np.float32, np.float32),
    (ml_dtypes.bfloat16, np.float16, np.float32), (np.uint8, np.int8, np.int32),
    (np.bool_, np.int64, np.int64), (np.int32, ml_dtypes.bfloat16, ml_dtypes.bfloat16)])
def test_promotion_as_pytorch(mesh_2d, a_t, b_t, want):
    a, b = values((3, 2), a_t, 1), values((2,), b_t, 2)
    ta = dtensor.dtensor_from_array(a, dtensor.Layout(["x", "y"], mesh_2d))
    tb = dtensor.dtensor_from_array(b, dtensor.Layout(["unsharded"], mesh_2d))
    r = ta * tb
    assert r.dtype == np.dtype(want)
    exact = a.astype(np.float64) * b.astype(np.float64)
    assert np.array_equal(dtensor.gather(r).astype(np.float64), exact.astype(want).astype(np.float64))


def test_float_functions(mesh_2d):
    x = np.linspace(-3, 3, 30).reshape(5, 6)
    t = dtensor.dtensor_from_array(x, dtensor.Layout(["x", "y"], mesh_2d))
    erf = np.vectorize(_math.erf)
    cases = {
        "erf": (dtensor.erf, erf(x)),
        "gelu": (dtensor.nn.gelu, 0.5 * x * (1 + erf(x / np.sqrt(2)))),
        "gelu_tanh": (lambda v: dtensor.nn.gelu(v, approximate=True),
                      0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
        "silu": (dtensor.nn.silu, x / (1 + np.exp(-x))),
    }
    for name, (fn, want) in cases.items():
        np.testing.assert_allclose(dtensor.gather(fn(t)), want, rtol=1e-13, atol=1e-15,
                                   err_msg=name)
    p = dtensor.dtensor_from_array(np.abs(x) + 0.5, dtensor.Layout(["x", "y"], mesh_2d))
    np.testing.assert_allclose(dtensor.gather(dtensor.rsqrt(p)), 1 / np.sqrt(np.abs(x) + 0.5),
                               rtol=1e-15)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bf16", "f16"])
def test_half_matmul_accumulates_in_f32(mesh_2d, dtype):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(6, 40)).astype(dtype)
    b = rng.normal(size=(40, 4)).astype(dtype)
    ta = dtensor.dtensor_from_array(a, dtensor.Layout(["x", "unsharded"], mesh_2d))
    tb = dtensor.dtensor_from_array(b, dtensor.Layout(["unsharded", "y"], mesh_2d))
    got = dtensor.gather(ta @ tb)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert got.dtype == np.dtype(dtype)
    # f32 accumulation, one rounding: within half an ulp of the dtype (and a little f32)
    eps = 2.0 ** -8 if dtype == ml_dtypes.bfloat16 else 2.0 ** -11
    assert np.all(np.abs(got.astype(np.float64) - exact) <= eps * np.abs(exact) + 1e-5)


def test_random_is_the_f32_stream_rounded(mesh_2d):
    f32 = dtensor.random.stateless_uniform((5, 6), seed=(1, 2), dtype=np.float32,
                                           layout=dtensor.Layout(["x", "y"], mesh_2d))
    b16 = dtensor.random.stateless_uniform((5, 6), seed=(1, 2), dtype=ml_dtypes.bfloat16,
                                           layout=dtensor.Layout(["y", "x"], mesh_2d))
    assert np.array_equal(dtensor.gather(b16), dtensor.gather(f32).astype(ml_dtypes.bfloat16))


def test_gradient_through_cast(mesh_2d):
    x = values((3, 4), np.float32, 1)
    w = dtensor.DVariable(dtensor.dtensor_from_array(x, dtensor.Layout(["x", "unsharded"],
                                                                       mesh_2d)))
    with dtensor.GradientTape() as tape:
        h = dtensor.cast(w, ml_dtypes.bfloat16)
        loss = dtensor.reduce_sum(dtensor.cast(h * h, np.float32))
    (g,) = tape.gradient(loss, [w])
    assert g.dtype == np.float32
    np.testing.assert_array_equal(dtensor.gather(g), 2 * x)
