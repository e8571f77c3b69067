"""The shape and index ops through the Python layer against numpy, under sharded and uneven
layouts on a 3x2 mesh: nn.embedding_lookup (a vocabulary-sharded table), math.
unsorted_segment_sum, one_hot (a sharded depth axis), einsum (every operand layout of a few
equations, requested result layouts), stack, split, pad, tile, broadcast_to, expand_dims,
squeeze and indexing with None; gradients through GradientTape against numpy's."""
import itertools

import ml_dtypes
import numpy as np
import pytest

import dtensor

U = dtensor.UNSHARDED


def values(shape, dtype=np.float32, salt=0):
    i = np.arange(int(np.prod(shape))).reshape(shape)
    v = ((i * 7 + salt * 3) % 11 - 5) * 0.5
    if np.dtype(dtype) == np.bool_:
        return (i + salt) % 3 != 0
    if np.issubdtype(np.dtype(dtype), np.integer):
        v = 2 * v
    return v.astype(dtype)


def put(a, mesh, *spec):
    return dtensor.dtensor_from_array(a, dtensor.Layout(list(spec), mesh))


def ids_for(shape, V, salt=0):
    """Ids with repeats and some outside [0, V) (-1 and V + 3)."""
    k = (np.arange(int(np.prod(shape))) * 5 + salt) % (V + 3)
    k = np.where(k == V + 2, -1, np.where(k == V + 1, V + 3, k))
    return k.reshape(shape)


def np_lookup(table, ids):
    ok = (ids >= 0) & (ids < table.shape[0])
    out = table[np.where(ok, ids, 0)]
    out[~ok] = 0
    return out


def specs(rank, axes=("x", "y")):
    """Every assignment of the mesh axes to a tensor's axes (each at most once)."""
    out = []
    for choice in itertools.product([U, *axes], repeat=rank):
        used = [c for c in choice if c != U]
        if len(used) == len(set(used)):
            out.append(list(choice))
    return out


@pytest.mark.parametrize("table_spec", [["x", U], ["x", "y"], [U, "y"], [U, U]])
@pytest.mark.parametrize("ids_spec", [[U, U], ["y", U], [U, "x"]])
def test_embedding_lookup_vocabulary_sharded(mesh_2d, table_spec, ids_spec):
    table = values((7, 5), np.float32, 1)  # 7 rows over 3 shards: uneven
    ids = ids_for((4, 3), 7, 2).astype(np.int32)
    t = put(table, mesh_2d, *table_spec)
    i = put(ids, mesh_2d, *ids_spec)
    got = dtensor.nn.embedding_lookup(t, i)
    assert got.shape == (4, 3, 5)
    np.testing.assert_array_equal(dtensor.gather(got), np_lookup(table, ids))
    np.testing.assert_array_equal(dtensor.gather(dtensor.gather_rows(t, ids.astype(np.int64))),
                                  np_lookup(table, ids))


@pytest.mark.parametrize("dtype", [np.float64, ml_dtypes.bfloat16, np.int8, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_embedding_lookup_dtypes_and_requested_layouts(mesh_2d, dtype):
    table = values((6, 4), dtype, 3)
    ids = ids_for((5,), 6, 1)
    t = put(table, mesh_2d, "x", U)
    for spec in specs(2):
        layout = dtensor.Layout(spec, mesh_2d)
        got = dtensor.call_with_layout(dtensor.gather_rows, layout, t, ids)
        assert got.layout == layout
        np.testing.assert_array_equal(dtensor.gather(got).astype(np.float64),
                                      np_lookup(table, ids).astype(np.float64))


def test_embedding_lookup_gradient_is_a_segment_sum(mesh_2d):
    table = values((7, 4), np.float32, 1)
    ids = ids_for((3, 5), 7, 4)
    w = dtensor.DVariable(dtensor.dtensor_from_array(
        table, dtensor.Layout(["x", U], mesh_2d)))
    weights = values((3, 5, 4), np.float32, 2)
    wt = put(weights, mesh_2d, "y", U, U)
    i = put(ids.astype(np.int32), mesh_2d, "y", U)
    with dtensor.GradientTape() as tape:
        loss = dtensor.reduce_sum(dtensor.nn.embedding_lookup(w, i) * wt)
    (g,) = tape.gradient(loss, [w])
    want = np.zeros_like(table)
    for (r, c), k in np.ndenumerate(ids):
        if 0 <= k < 7:
            want[k] += weights[r, c]
    assert g.layout == w.layout
    np.testing.assert_allclose(dtensor.gather(g), want, rtol=1e-6)


@pytest.mark.parametrize("data_spec", [["y", U, U], ["x", "y", U], [U, U, "x"]])
def test_unsorted_segment_sum(mesh_2d, data_spec):
    data = values((3, 4, 5), np.float64, 1)
    ids = ids_for((3, 4), 7, 3)
    d = put(data, mesh_2d, *data_spec)
    want = np.zeros((7, 5))
    for (r, c), k in np.ndenumerate(ids):
        if 0 <= k < 7:
            want[k] += data[r, c]
    for out_spec in [None, ["x", U], [U, "y"], ["x", "y"]]:
        fn = dtensor.math.unsorted_segment_sum
        if out_spec is None:
            got = fn(d, ids, 7)
        else:
            layout = dtensor.Layout(out_spec, mesh_2d)
            got = dtensor.call_with_layout(fn, layout, d, ids, 7)
            assert got.layout == layout
        np.testing.assert_allclose(dtensor.gather(got), want, rtol=1e-12)


@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("out_spec", [None, "depth_x", "depth_y"])
def test_one_hot_with_a_sharded_depth(mesh_2d, axis, out_spec):
    idx = ids_for((4, 3), 5, 1)  # depth 5 over 3 or 2 shards: uneven
    i = put(idx.astype(np.int64), mesh_2d, "y" if out_spec != "depth_y" else U, U)
    want = np.moveaxis((idx[..., None] == np.arange(5)).astype(np.float32), -1,
                       axis if axis >= 0 else -1)
    if out_spec is None:
        got = dtensor.one_hot(i, 5, axis=axis)
    else:
        spec = [U, U, U]
        spec[axis if axis >= 0 else 2] = out_spec[-1]
        layout = dtensor.Layout(spec, mesh_2d)
        got = dtensor.call_with_layout(dtensor.one_hot, layout, i, 5, axis=axis)
        assert got.layout == layout
    assert got.dtype == np.float32
    np.testing.assert_array_equal(dtensor.gather(got), want)
    on_off = dtensor.one_hot(i, 5, on_value=3, off_value=-1)
    assert on_off.dtype == np.int32
    np.testing.assert_array_equal(dtensor.gather(on_off),
                                  np.where(idx[..., None] == np.arange(5), 3, -1))


EQUATIONS = [("bsh,hd->bsd", [(2, 3, 4), (4, 5)]),
             ("bhqd,bhkd->bhqk", [(2, 3, 4, 2), (2, 3, 5, 2)]),
             ("ij,jk->ik", [(5, 4), (4, 3)]),
             ("ij->ji", [(5, 4)]),
             ("bij,bjk->bik", [(3, 2, 4), (3, 4, 5)]),
             ("i,i->", [(7,), (7,)]),
             ("ij,j->i", [(5, 4), (4,)]),
             ("ik,kj", [(3, 4), (4, 5)]),
             ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)])]


@pytest.mark.parametrize("eq,shapes", EQUATIONS, ids=[e for e, _ in EQUATIONS])
def test_einsum_every_operand_layout(mesh_2d, eq, shapes):
    xs = [values(s, np.float64, k) for k, s in enumerate(shapes)]
    want = np.einsum(eq, *xs)
    all_specs = [specs(len(s)) for s in shapes]
    # every layout of each operand, with some layout of the other
    for k, ks in enumerate(all_specs):
        for n, spec in enumerate(ks):
            chosen = [spec if q == k else all_specs[q][(n * 5 + 1) % len(all_specs[q])]
                      for q in range(len(shapes))]
            ts = [put(x, mesh_2d, *c) for x, c in zip(xs, chosen)]
            got = dtensor.einsum(eq, *ts)
            np.testing.assert_allclose(dtensor.gather(got), want, rtol=1e-12, atol=1e-12,
                                       err_msg=f"{eq} {chosen}")
    # every requested layout of the result
    ts = [put(x, mesh_2d, *all_specs[q][-1]) for q, x in enumerate(xs)]
    for spec in specs(np.ndim(want)):
        layout = dtensor.Layout(spec, mesh_2d)
        got = dtensor.call_with_layout(dtensor.einsum, layout, eq, *ts)
        assert got.layout == layout
        np.testing.assert_allclose(dtensor.gather(got), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16, np.int32],
                         ids=lambda d: np.dtype(d).name)
def test_einsum_dtypes(mesh_2d, dtype):
    a, b = values((2, 3, 4), dtype, 1), values((4, 5), dtype, 2)
    got = dtensor.einsum("bsh,hd->bsd", put(a, mesh_2d, U, "x", "y"), put(b, mesh_2d, "y", U))
    assert got.dtype == np.dtype(dtype)
    want = np.einsum("bsh,hd->bsd", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(dtensor.gather(got).astype(np.float64), want, rtol=1e-2)
    with pytest.raises(dtensor.DTensorError, match="repeats"):
        dtensor.einsum("ii->i", put(values((3, 3), dtype), mesh_2d, U, U))


def test_einsum_gradients(mesh_2d):
    a, b = values((2, 3, 4), np.float64, 1), values((4, 5), np.float64, 2)
    wa = put(a, mesh_2d, "x", U, "y")
    wb = put(b, mesh_2d, "y", U)
    w = values((2, 3, 5), np.float64, 3)
    with dtensor.GradientTape() as tape:
        tape.watch([wa, wb])
        loss = dtensor.reduce_sum(dtensor.einsum("bsh,hd->bsd", wa, wb) * put(w, mesh_2d, U, U, U))
    ga, gb = tape.gradient(loss, [wa, wb])
    np.testing.assert_allclose(dtensor.gather(ga), np.einsum("bsd,hd->bsh", w, b), rtol=1e-12)
    np.testing.assert_allclose(dtensor.gather(gb), np.einsum("bsd,bsh->hd", w, a), rtol=1e-12)
    # a summed-only label: its gradient is broadcast back
    with dtensor.GradientTape() as tape:
        tape.watch(wa)
        loss = dtensor.reduce_sum(dtensor.einsum("bsh->b", wa))
    (ga,) = tape.gradient(loss, [wa])
    np.testing.assert_array_equal(dtensor.gather(ga), np.ones_like(a))


@pytest.mark.parametrize("spec", [["x", "y"], ["y", U], [U, "x"], [U, U]])
def test_stack_split_pad_tile(mesh_2d, spec):
    x, y = values((5, 4), np.float32, 1), values((5, 4), np.float32, 2)
    tx, ty = put(x, mesh_2d, *spec), put(y, mesh_2d, "y", "x")
    for axis in (0, 1, -1):
        np.testing.assert_array_equal(dtensor.gather(dtensor.stack([tx, ty, tx], axis=axis)),
                                      np.stack([x, y, x], axis=axis))
    many = dtensor.stack([tx] * 20)  # more than the op's 16 operands
    np.testing.assert_array_equal(dtensor.gather(many), np.stack([x] * 20))
    for pieces, axis, sizes in [(2, 1, [2, 2]), ([2, -1], 0, [2, 3]), ([1, 3, 1], 0, [1, 3, 1])]:
        got = dtensor.split(tx, pieces, axis=axis)
        want = np.split(x, np.cumsum(sizes)[:-1], axis=axis)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(dtensor.gather(g), w)
    np.testing.assert_array_equal(
        dtensor.gather(dtensor.pad(tx, [[1, 2], [0, 3]], constant_values=1.5)),
        np.pad(x, [[1, 2], [0, 3]], constant_values=1.5))
    for mult in ([2, 3], [1, 2], [3, 1]):
        np.testing.assert_array_equal(dtensor.gather(dtensor.tile(tx, mult)), np.tile(x, mult))


@pytest.mark.parametrize("spec", [["x", U], [U, U], ["y", U]])
def test_broadcast_expand_squeeze_and_newaxis(mesh_2d, spec):
    x = values((5, 1), np.float64, 1)
    t = put(x, mesh_2d, *spec)
    got = dtensor.broadcast_to(t, [4, 5, 6])
    np.testing.assert_array_equal(dtensor.gather(got), np.broadcast_to(x, (4, 5, 6)))
    assert got.layout.sharding_specs[1] == spec[0]  # the spanned axis keeps its sharding
    e = dtensor.expand_dims(t, 0)
    assert e.shape == (1, 5, 1) and e.layout.sharding_specs[1] == spec[0]
    np.testing.assert_array_equal(dtensor.gather(e), x[None])
    s = dtensor.squeeze(t)
    assert s.shape == (5,) and s.layout.sharding_specs == [spec[0]]
    np.testing.assert_array_equal(dtensor.gather(s), x[:, 0])
    np.testing.assert_array_equal(dtensor.gather(dtensor.squeeze(t, axis=1)), x[:, 0])
    z = put(values((5, 4), np.float64, 2), mesh_2d, *spec)
    zn = values((5, 4), np.float64, 2)
    for key in [(None,), (slice(None), None), (1, None), (None, slice(1, 3), None, 2)]:
        np.testing.assert_array_equal(dtensor.gather(z[key]), zn[key])


def test_shape_op_gradients(mesh_2d):
    x = values((5, 4), np.float64, 1)
    tx = put(x, mesh_2d, "x", "y")
    w = values((5, 4), np.float64, 2)
    cases = [
        (lambda t: dtensor.pad(t, [[1, 0], [2, 1]]), lambda d: d[1:, 2:6]),
        (lambda t: dtensor.tile(t, [2, 3]),
         lambda d: d.reshape(2, 5, 3, 4).sum(axis=(0, 2))),
        (lambda t: dtensor.stack([t, t * t], axis=1),
         lambda d, x=x: d[:, 0] + 2 * x * d[:, 1]),
        (lambda t: dtensor.concat(dtensor.split(t, [2, 3], axis=0)[::-1], axis=0),
         lambda d: np.concatenate([d[3:], d[:3]])),
        (lambda t: dtensor.broadcast_to(dtensor.expand_dims(t, 0), [3, 5, 4]),
         lambda d: d.sum(axis=0)),
        (lambda t: dtensor.squeeze(dtensor.expand_dims(t, 1) * 2.0, axis=1), lambda d: 2 * d),
    ]
    for fn, grad in cases:
        with dtensor.GradientTape() as tape:
            tape.watch(tx)
            y = fn(tx)
            wy = values(y.shape, np.float64, 3)
            loss = dtensor.reduce_sum(y * put(wy, mesh_2d, *[U] * len(y.shape)))
        (g,) = tape.gradient(loss, [tx])
        assert g.layout == tx.layout
        np.testing.assert_allclose(dtensor.gather(g), grad(wy), rtol=1e-12)
    del w
