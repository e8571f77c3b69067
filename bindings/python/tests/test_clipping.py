"""Keras's gradient clipping on the optimizer classes (``clipnorm=``, ``clipvalue=``,
``global_clipnorm=``) and AdamW's ``exclude_from_weight_decay(var_list, var_names)``: two updates
of variables sharded unevenly over the 1-D and 2-D meshes against numpy written from Keras's
rules (tf.clip_by_value, tf.clip_by_norm, tf.clip_by_global_norm, then the optimizer's step);
the errors Keras raises for bad arguments."""
import math

import numpy as np
import pytest

import dtensor

SHAPES = [(7, 5), (3,), (6, 4)]  # 7 and 3 over 6 devices: uneven shards, some empty


def layouts(mesh):
    if "y" in mesh.dim_names:
        return [["x", "y"], ["y"], ["unsharded", "unsharded"]]
    return [["x", "unsharded"], ["x"], ["unsharded", "x"]]


def data():
    rng = np.random.default_rng(26)
    w0 = [rng.uniform(-1, 1, s) for s in SHAPES]
    # the second step's gradients a tenth: a clip that bites in the first may not in the second
    grads = [[rng.uniform(-1, 1, s) * (0.1 if t else 1.0) for s in SHAPES] for t in range(2)]
    return w0, grads


def clipped(grads, clipnorm=None, clipvalue=None, global_clipnorm=None):
    if clipnorm:
        return [g * clipnorm / max(np.linalg.norm(g), clipnorm) for g in grads]
    if global_clipnorm:
        n = math.sqrt(sum(float(np.sum(g * g)) for g in grads))
        return [g * global_clipnorm / max(n, global_clipnorm) for g in grads]
    if clipvalue:
        return [np.clip(g, -clipvalue, clipvalue) for g in grads]
    return grads


def numpy_steps(kind, w0, grads, clips, decays=None, lr=0.1):
    """Keras's SGD with momentum 0.9, RMSprop or AdamW (weight decay 0.5) after clipping."""
    w = [x.copy() for x in w0]
    m = [np.zeros_like(x) for x in w0]
    s = [np.zeros_like(x) for x in w0]
    for t, gs in enumerate(grads, start=1):
        for i, g in enumerate(clipped(gs, **clips)):
            if kind == "sgd":
                m[i] = 0.9 * m[i] - lr * g
                w[i] = w[i] + m[i]
            elif kind == "rmsprop":
                s[i] = 0.9 * s[i] + 0.1 * g * g
                w[i] = w[i] - lr * g / np.sqrt(s[i] + 1e-7)
            else:
                if decays is None or decays[i]:
                    w[i] = w[i] - lr * 0.5 * w[i]
                m[i] = 0.9 * m[i] + 0.1 * g
                s[i] = 0.999 * s[i] + 0.001 * g * g
                w[i] = w[i] - lr * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m[i] / (
                    np.sqrt(s[i]) + 1e-7)
    return w


def make(kind, **kw):
    if kind == "sgd":
        return dtensor.keras.optimizers.SGD(0.1, momentum=0.9, **kw)
    if kind == "rmsprop":
        return dtensor.keras.optimizers.RMSprop(0.1, **kw)
    return dtensor.keras.optimizers.AdamW(0.1, weight_decay=0.5, **kw)


def train(mesh, opt, w0, grads):
    vs = [dtensor.DVariable(dtensor.dtensor_from_array(w, dtensor.Layout(spec, mesh)),
                            name=f"v{i}")
          for i, (w, spec) in enumerate(zip(w0, layouts(mesh)))]
    for gs in grads:
        opt.apply_gradients([(dtensor.dtensor_from_array(g, v.layout), v)
                             for g, v in zip(gs, vs)])
    return vs, [dtensor.gather(v.read_value()) for v in vs]


def clip_cases(grads):
    norms = sorted(float(np.linalg.norm(g)) for g in grads[0])
    total = math.sqrt(sum(n * n for n in norms))
    return [{"global_clipnorm": 0.5 * total}, {"clipnorm": norms[1]}, {"clipvalue": 0.3}]


@pytest.mark.parametrize("kind", ["sgd", "rmsprop", "adamw"])
@pytest.mark.parametrize("which", [0, 1, 2])
@pytest.mark.parametrize("mesh_name", ["mesh_1d", "mesh_2d"])
def test_clipping_against_numpy(request, mesh_name, which, kind):
    mesh = request.getfixturevalue(mesh_name)
    w0, grads = data()
    clips = clip_cases(grads)[which]
    _, got = train(mesh, make(kind, **clips), w0, grads)
    want = numpy_steps(kind, w0, grads, clips)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    # the clip bites: without it the reference is far off
    plain = numpy_steps(kind, w0, grads, {})
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(plain, want)) > 1e-3


def test_exclude_from_weight_decay(mesh_2d):
    """var_list and var_names (regular expressions on the variables' names, as Keras) exclude
    from AdamW's decay; clipped by the global norm as well."""
    w0, grads = data()
    clips = clip_cases(grads)[0]
    opt = make("adamw", **clips)
    vs = [dtensor.DVariable(dtensor.dtensor_from_array(w, dtensor.Layout(spec, mesh_2d)),
                            name=name)
          for w, spec, name in zip(w0, layouts(mesh_2d), ["dense/kernel", "dense/bias", "ln"])]
    opt.exclude_from_weight_decay(var_list=[vs[2]], var_names=["bias"])
    for gs in grads:
        opt.apply_gradients([(dtensor.dtensor_from_array(g, v.layout), v)
                             for g, v in zip(gs, vs)])
    want = numpy_steps("adamw", w0, grads, clips, decays=[True, False, False])
    for v, w in zip(vs, want):
        np.testing.assert_allclose(dtensor.gather(v.read_value()), w, rtol=1e-10, atol=1e-12)
    decayed = numpy_steps("adamw", w0, grads, clips)
    assert float(np.max(np.abs(decayed[1] - want[1]))) > 1e-3  # the exclusion shows
    with pytest.raises(ValueError, match="before the optimizer is built"):
        opt.exclude_from_weight_decay(var_names=["kernel"])


def test_keras_errors_and_config():
    with pytest.raises(ValueError, match="Only one of `clipnorm` and `global_clipnorm`"):
        dtensor.keras.optimizers.Adam(clipnorm=1.0, global_clipnorm=1.0)
    for kw, says in [({"clipnorm": -1.0}, "clipnorm -1"),
                     ({"global_clipnorm": float("nan")}, "global_clipnorm nan"),
                     ({"clipvalue": -2.0}, "clipvalue -2"),
                     ({"clipvalue": 1.0, "global_clipnorm": 2.0}, "clipvalue 1")]:
        with pytest.raises(dtensor.errors.InvalidArgumentError, match=says):
            dtensor.keras.optimizers.SGD(0.1, **kw)
    opt = dtensor.keras.optimizers.AdamW(0.01, weight_decay=0.1, global_clipnorm=1.5)
    assert (opt.global_clipnorm, opt.clipnorm, opt.clipvalue) == (1.5, None, None)
    config = opt.get_config()
    assert config["global_clipnorm"] == 1.5 and config["clipnorm"] is None
    again = dtensor.keras.optimizers.AdamW.from_config(config)
    assert again.get_config() == config
    with pytest.raises(TypeError, match="not a DVariable"):
        opt.exclude_from_weight_decay(var_list=[np.zeros(3)])
