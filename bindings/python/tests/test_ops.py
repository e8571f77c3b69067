"""Ops, call_with_layout, DVariable, traced functions and the ledger, checked against numpy."""
import itertools

import numpy as np
import pytest

import dtensor
from test_foundation import all_layouts

A = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
B = np.array([[6, 5], [4, 3], [2, 1]], dtype=np.float32)


def L(mesh, *specs):
    return dtensor.Layout(list(specs), mesh)


@pytest.mark.parametrize("la,lb,multiplies,collectives", [
    (("unsharded", "unsharded"), ("unsharded", "unsharded"), 72, 0),   # fully replicated
    (("unsharded", "x"), ("x", "unsharded"), 24, 1),                   # contracting on x
    (("y", "x"), ("x", "unsharded"), 12, 1),                           # and A's rows on y
])
def test_guide_matmul(mesh_2d, la, lb, multiplies, collectives):
    """dtensor_overview, "DTensor as operands": the same product under three layouts, with the
    guide's multiply counts on the 3x2 mesh."""
    a = dtensor.dtensor_from_array(A, L(mesh_2d, *la))
    b = dtensor.dtensor_from_array(B, L(mesh_2d, *lb))
    c = dtensor.matmul(a, b)
    np.testing.assert_array_equal(dtensor.gather(c), [[20, 14], [56, 41]])
    f = dtensor.function(lambda x, y: x @ y)
    text, mults, colls, _ = f.program(a, b)
    assert (mults, colls) == (multiplies, collectives)
    if collectives:
        assert "all_reduce sum over {x}" in text
    np.testing.assert_array_equal(dtensor.gather(f(a, b)), A @ B)


def test_matmul_output_layout_reduce_scatter(mesh_2d):
    """Requesting the result sharded on the contracting mesh axis: the partial product is
    reduce-scattered over x instead of all-reduced."""
    a = dtensor.dtensor_from_array(A, L(mesh_2d, "unsharded", "x"))
    b = dtensor.dtensor_from_array(B, L(mesh_2d, "x", "unsharded"))
    out = L(mesh_2d, "unsharded", "x")
    f = dtensor.function(lambda x, y: dtensor.call_with_layout(dtensor.matmul, out, x, y))
    assert "reduce_scatter" in f.program(a, b)[0]
    c = f(a, b)
    assert c.layout == out
    np.testing.assert_array_equal(dtensor.gather(c), A @ B)


def test_creation_with_layout(mesh_2d):
    """dtensor_overview, "DTensor as output": ones, zeros and stateless random."""
    layout = L(mesh_2d, "x", "y")
    o = dtensor.call_with_layout(dtensor.ones, layout, shape=(6, 4))
    assert o.layout == layout and o.shape == (6, 4)
    np.testing.assert_array_equal(dtensor.gather(o), np.ones((6, 4)))
    z = dtensor.call_with_layout(dtensor.zeros, layout, shape=(5, 3), dtype=np.float64)
    np.testing.assert_array_equal(dtensor.gather(z), np.zeros((5, 3)))
    r = dtensor.call_with_layout(dtensor.range, L(mesh_2d, "x"), 2, 17, 3)
    np.testing.assert_array_equal(dtensor.gather(r), np.arange(2, 17, 3))
    # no layout: replicated on the default mesh (this client's first device), as TensorFlow
    # places a regular tensor
    o = dtensor.ones((2, 2))
    assert o.layout.is_fully_replicated() and o.layout.mesh.size == 1
    np.testing.assert_array_equal(o.numpy(), np.ones((2, 2), np.float32))


def test_random_is_layout_invariant(mesh_2d, mesh_1d):
    """The same seed gives bitwise the same global tensor under every layout and mesh."""
    ref = None
    for mesh in (mesh_1d, mesh_2d):
        for layout in all_layouts(mesh, 2):
            for fn in (dtensor.random.stateless_uniform, dtensor.random.stateless_normal):
                t = dtensor.call_with_layout(fn, layout, shape=(7, 5), seed=(3, 9))
                g = dtensor.gather(t)
                key = fn.__name__
                if ref is None:
                    ref = {}
                ref.setdefault(key, g)
                assert np.array_equal(ref[key].view(np.uint32), g.view(np.uint32)), (key, layout)
    u = ref["stateless_uniform"]
    assert ((u >= 0) & (u < 1)).all() and 0.3 < u.mean() < 0.7


def test_elementwise_and_broadcasting(mesh_2d):
    rng = np.random.default_rng(1)
    x = rng.uniform(0.5, 2.0, (6, 4)).astype(np.float64)
    y = rng.uniform(0.5, 2.0, (1, 4)).astype(np.float64)
    for lx, ly in [(("x", "y"), ("unsharded", "y")), (("y", "unsharded"), ("unsharded", "x"))]:
        a = dtensor.dtensor_from_array(x, L(mesh_2d, *lx))
        b = dtensor.dtensor_from_array(y, L(mesh_2d, *ly))
        for op, ref in [(dtensor.add, np.add), (dtensor.subtract, np.subtract),
                        (dtensor.multiply, np.multiply), (dtensor.divide, np.divide),
                        (dtensor.maximum, np.maximum), (dtensor.minimum, np.minimum),
                        (dtensor.less, np.less),
                        (dtensor.greater_equal, np.greater_equal)]:
            np.testing.assert_array_equal(dtensor.gather(op(a, b)), ref(x, y).astype(x.dtype))
        # libm and numpy may round transcendental functions differently by one ulp.
        np.testing.assert_allclose(dtensor.gather(dtensor.pow(a, b)), np.power(x, y), rtol=1e-15)
        for op, ref in [(dtensor.neg, np.negative), (dtensor.exp, np.exp), (dtensor.log, np.log),
                        (dtensor.sqrt, np.sqrt), (dtensor.tanh, np.tanh),
                        (dtensor.relu, lambda v: np.maximum(v, 0)), (dtensor.square, np.square)]:
            np.testing.assert_allclose(dtensor.gather(op(a)), ref(x), rtol=1e-15)
        np.testing.assert_array_equal(dtensor.gather(2.0 * a - 1.0), 2.0 * x - 1.0)
        np.testing.assert_array_equal(dtensor.gather(-(a / b)), -(x / y))


@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, True), ((0, 1), True),
                                           (-1, False)])
def test_reductions_uneven(mesh_2d, axis, keepdims):
    x = np.arange(35, dtype=np.float64).reshape(7, 5) - 11.5
    for layout in all_layouts(mesh_2d, 2):
        t = dtensor.dtensor_from_array(x, layout)
        for op, ref in [(dtensor.reduce_sum, np.sum), (dtensor.reduce_mean, np.mean),
                        (dtensor.reduce_max, np.max), (dtensor.reduce_min, np.min),
                        (dtensor.math.reduce_prod, np.prod)]:
            got = dtensor.gather(op(t, axis=axis, keepdims=keepdims))
            np.testing.assert_allclose(got, ref(x, axis=axis, keepdims=keepdims), rtol=1e-12)


def test_shape_ops(mesh_2d):
    x = np.arange(24, dtype=np.int32).reshape(6, 4)
    t = dtensor.dtensor_from_array(x, L(mesh_2d, "x", "y"))
    np.testing.assert_array_equal(dtensor.gather(dtensor.transpose(t)), x.T)
    np.testing.assert_array_equal(dtensor.gather(dtensor.reshape(t, [6, 2, 2])),
                                  x.reshape(6, 2, 2))
    np.testing.assert_array_equal(dtensor.gather(dtensor.slice(t, [1, 1], [4, -1])), x[1:5, 1:])
    np.testing.assert_array_equal(dtensor.gather(dtensor.concat([t, t], axis=1)),
                                  np.concatenate([x, x], axis=1))
    with pytest.raises(dtensor.DTensorError) as e:
        dtensor.reshape(t, [4, 6])
    assert e.value.status == "DT_ERR_LAYOUT"


def test_relayout_every_pair(mesh_2d):
    x = np.arange(35, dtype=np.float32).reshape(7, 5)
    layouts = list(all_layouts(mesh_2d, 2))
    for src, dst in itertools.product(layouts, layouts):
        t = dtensor.relayout(dtensor.dtensor_from_array(x, src), dst)
        assert t.layout == dst
        np.testing.assert_array_equal(dtensor.gather(t), x)


def test_copy_to_mesh(mesh_1d, mesh_2d):
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    t = dtensor.dtensor_from_array(x, L(mesh_2d, "x", "y"))
    u = dtensor.copy_to_mesh(t, L(mesh_1d, "x", "unsharded"))
    assert u.layout.mesh == mesh_1d
    np.testing.assert_array_equal(dtensor.gather(u), x)


def test_dvariable(mesh_2d):
    layout = L(mesh_2d, "x", "unsharded")
    v = dtensor.DVariable(dtensor.call_with_layout(dtensor.ones, layout, shape=(3, 2)))
    assert v.layout == layout
    one = dtensor.call_with_layout(dtensor.ones, layout, shape=(3, 2))
    v.assign_add(one).assign_add(one).assign_sub(one)
    np.testing.assert_array_equal(dtensor.gather(v.read_value()), np.full((3, 2), 2.0))
    wrong = dtensor.relayout(one, dtensor.Layout.replicated(mesh_2d, 2))
    with pytest.raises(dtensor.DTensorError) as e:
        v.assign(wrong)
    assert e.value.status == "DT_ERR_LAYOUT" and '"x,unsharded"' in str(e.value)
    v.assign(dtensor.relayout(wrong, layout))  # explicit relayout is fine
    np.testing.assert_array_equal(dtensor.gather(v.read_value()), np.ones((3, 2)))


def test_function_traces_once_per_signature(mesh_2d):
    calls = []

    @dtensor.function
    def step(x, y):
        calls.append(1)
        return dtensor.relu(x @ y) - 1.0, dtensor.reduce_sum(x)

    a = dtensor.dtensor_from_array(A, L(mesh_2d, "unsharded", "x"))
    b = dtensor.dtensor_from_array(B, L(mesh_2d, "x", "unsharded"))
    for _ in range(3):
        c, s = step(a, b)
        np.testing.assert_array_equal(dtensor.gather(c), np.maximum(A @ B, 0) - 1)
        assert float(dtensor.gather(s)) == A.sum()
    assert len(calls) == 1
    step(dtensor.relayout(a, dtensor.Layout.replicated(mesh_2d, 2)), b)
    assert len(calls) == 2


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("rows", ["x", "unsharded"])
def test_function_on_a_client_without_devices(runtime, devices, rows):
    """A mesh of the first 2 or 4 devices: under -n 2 and -n 3 some client holds none of them
    (2 devices: every client but 0; 4 at -n 3: client 2). A traced function runs there as on
    the others (its symbolic tensors are not taken for concrete ones with no local shard):
    on every client its results equal the eager run's and numpy's."""
    mesh = dtensor.create_mesh([("x", devices)], devices=[f"CPU:{i}" for i in range(devices)])
    rng = np.random.default_rng(7)
    a = rng.standard_normal((7, 3)).astype(np.float32)  # uneven shards over x
    w = rng.standard_normal((3, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    x = dtensor.dtensor_from_array(a, L(mesh, rows, "unsharded"))
    y = dtensor.dtensor_from_array(w, L(mesh, "unsharded", "unsharded"))
    bias = dtensor.DVariable(dtensor.dtensor_from_array(b, L(mesh, "unsharded")))
    shift = dtensor.dtensor_from_array(np.float32(0.25), L(mesh))  # captured by value

    def step(p, q):
        h = dtensor.relu(p @ q + bias) * 0.5 - shift
        return h, dtensor.reduce_sum(dtensor.square(h))

    def clip(*grads):  # examples/gpt2.py's clipping: scalars, many inputs and outputs
        total = dtensor.add_n([dtensor.reduce_sum(dtensor.square(g)) for g in grads])
        coef = dtensor.minimum(1.0 / (dtensor.sqrt(total) + 1e-6), 1.0)
        return [g * coef for g in grads]

    h_np = np.maximum(a @ w + b, 0) * np.float32(0.5) - np.float32(0.25)
    eager_h, eager_s = step(x, y)
    traced = dtensor.function(step)
    for _ in range(2):  # the trace's run, then a run of the cached trace
        h, s = traced(x, y)
        assert h.layout == eager_h.layout
        np.testing.assert_array_equal(dtensor.gather(h), dtensor.gather(eager_h))
        np.testing.assert_allclose(dtensor.gather(h), h_np, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(float(dtensor.gather(s)), float(dtensor.gather(eager_s)),
                                   rtol=1e-6)
        np.testing.assert_allclose(float(dtensor.gather(s)), np.square(h_np).sum(), rtol=1e-5)
    norm = np.sqrt(np.square(a).sum() + np.square(w).sum())
    for got, eager, want in zip(dtensor.function(clip)(x, y), clip(x, y), (a, w)):
        np.testing.assert_allclose(dtensor.gather(got), dtensor.gather(eager), rtol=1e-6)
        np.testing.assert_allclose(dtensor.gather(got), want / norm, rtol=1e-5)


def test_errors(mesh_2d, mesh_1d):
    a = dtensor.dtensor_from_array(A, dtensor.Layout.replicated(mesh_2d, 2))
    with pytest.raises(dtensor.DTensorError) as e:
        dtensor.matmul(a, a)
    assert e.value.status == "DT_ERR_SHAPE" and "[2,3]" in str(e.value)
    f64 = dtensor.dtensor_from_array(A.astype(np.float64), dtensor.Layout.replicated(mesh_2d, 2))
    with pytest.raises(dtensor.DTensorError) as e:
        dtensor.logical_and(a, f64)
    assert e.value.status == "DT_ERR_DTYPE" and "bool" in str(e.value)
    other = dtensor.dtensor_from_array(A, dtensor.Layout.replicated(mesh_1d, 2))
    with pytest.raises(dtensor.DTensorError):
        dtensor.add(a, other)


def test_ledger_records_collectives(mesh_2d):
    dtensor.ledger_clear()
    a = dtensor.dtensor_from_array(A, L(mesh_2d, "unsharded", "x"))
    b = dtensor.dtensor_from_array(B, L(mesh_2d, "x", "unsharded"))
    dtensor.matmul(a, b)
    entries = dtensor.ledger()["entries"]
    assert [(e["op"], e["axes"], e["group_size"], e["cause"]) for e in entries] == \
        [("all_reduce", "x", 3, "matmul")]
    assert "all_reduce" in dtensor.ledger_text()
    dtensor.set_collective_algorithm(mesh_2d, "reduction_to_one_device")
    dtensor.matmul(a, b)
    assert dtensor.ledger()["entries"][-1]["algorithm"] == "reduction_to_one_device"
    dtensor.set_collective_algorithm(mesh_2d, "auto")
    with pytest.raises(dtensor.DTensorError):
        dtensor.set_collective_algorithm(mesh_2d, "nccl")
    with pytest.raises(ValueError):
        dtensor.set_collective_algorithm(mesh_2d, "telepathy")


def test_create_distributed_mesh_and_program_printing(capsys):
    """create_distributed_mesh spans every client's devices; show_programs prints each op's
    expanded program on client 0."""
    mesh = dtensor.create_distributed_mesh([("x", 3), ("y", 2)], device_type="CPU")
    assert mesh.size == 6 and mesh.shape() == [3, 2]
    a = dtensor.dtensor_from_array(A, L(mesh, "unsharded", "x"))
    b = dtensor.dtensor_from_array(B, L(mesh, "x", "unsharded"))
    capsys.readouterr()
    with dtensor.show_programs():
        c = a @ b
    out = capsys.readouterr().out
    if dtensor.client_id() == 0:
        assert "all_reduce sum over {x}" in out and "24 multiplies on 6 devices" in out
    else:
        assert out == ""
    np.testing.assert_array_equal(dtensor.gather(c), A @ B)
