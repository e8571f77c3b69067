"""tf.experimental.dtensor names and TensorFlow semantics: pack's agreed shape, meshes over
chosen devices, TensorFlow's string forms, DVariable as a tf.Variable, indexing, division,
floor division and modulo, integer mean; numpy is the reference."""
import gc

import numpy as np
import pytest

import dtensor
from conftest import CLIENTS, DEVICES

PER_CLIENT = DEVICES // CLIENTS


def components(arr, layout):
    return dtensor.unpack(dtensor.dtensor_from_array(arr, layout))


# ---- pack: one global shape on every client ---------------------------------------------------

def test_pack_uneven_without_shape_raises_everywhere(mesh_1d):
    """[3] over 6 devices: shards of 1, 1, 1, 0, 0, 0 imply shapes 6 and 0."""
    layout = dtensor.Layout(["x"], mesh_1d)
    comps = components(np.arange(3.0), layout)
    with pytest.raises(ValueError, match="shape="):
        dtensor.pack(comps, layout)
    t = dtensor.pack(comps, layout, shape=[3])
    np.testing.assert_array_equal(dtensor.gather(t), np.arange(3.0))
    assert float(dtensor.reduce_mean(t).numpy()) == 1.0


def test_pack_uneven_on_every_client_alike(mesh_2d):
    """[5, 2] on x: clients with 2-row shards and clients with 1-row shards disagree; every
    client raises (none waits in a collective)."""
    layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh_2d)
    with pytest.raises(ValueError, match="pass shape="):
        dtensor.pack(components(np.ones((5, 2)), layout), layout)
    dtensor.barrier()


def test_pack_one_client_bad_raises_everywhere(mesh_1d):
    layout = dtensor.Layout(["x"], mesh_1d)
    comps = components(np.arange(6, dtype=np.int32), layout)
    if dtensor.client_id() == CLIENTS - 1:
        comps[0] = comps[0].astype(np.float32)  # float32 next to int32 on the last client
    with pytest.raises(TypeError, match="dtype"):
        dtensor.pack(comps, layout)
    dtensor.barrier()


# ---- meshes over chosen devices ---------------------------------------------------------------

def test_create_mesh_subset_of_devices(runtime):
    ids = [1, 2, 4]
    mesh = dtensor.create_mesh([("x", 3)], devices=[f"CPU:{i}" for i in ids])
    assert mesh.global_device_ids().tolist() == ids
    mine = {i for i in ids if dtensor.client_id() * PER_CLIENT <= i <
            (dtensor.client_id() + 1) * PER_CLIENT}
    assert set(mesh.local_devices()) == {f"CPU:{i}" for i in mine}
    arr = np.arange(9.0).reshape(3, 3)
    t = dtensor.dtensor_from_array(arr, dtensor.Layout(["x", dtensor.UNSHARDED], mesh))
    np.testing.assert_array_equal(dtensor.gather(t * 2 + t), arr * 3)
    # collectives over devices that clients hold in different numbers
    np.testing.assert_array_equal(dtensor.gather(dtensor.reduce_sum(t, axis=0)), arr.sum(axis=0))
    np.testing.assert_allclose(dtensor.gather(dtensor.matmul(dtensor.transpose(t), t)),
                               arr.T @ arr)


def test_create_mesh_with_task_names(runtime):
    """TensorFlow device names: task T's device k is client T's k-th device."""
    last = CLIENTS - 1
    mesh = dtensor.create_mesh([("x", 2)], devices=[
        "/job:worker/replica:0/task:0/device:CPU:0",
        f"/job:worker/replica:0/task:{last}/device:CPU:{PER_CLIENT - 1}"])
    assert mesh.global_device_ids().tolist() == [0, DEVICES - 1]


def test_create_mesh_other_order_refused(runtime):
    with pytest.raises(ValueError, match=r"CPU:1.*CPU:0.*increasing"):
        dtensor.create_mesh([("x", 6)], devices=["CPU:1", "CPU:0", "CPU:2", "CPU:3", "CPU:4",
                                                 "CPU:5"])
    with pytest.raises(ValueError, match="TPU:0"):
        dtensor.create_mesh([("x", 1)], devices=["TPU:0"])
    dtensor.barrier()


def test_create_distributed_mesh_local_devices(runtime):
    """Each client offers its last device: one device per client, in client order."""
    mesh = dtensor.create_distributed_mesh([("x", CLIENTS)],
                                           local_devices=[f"CPU:{PER_CLIENT - 1}"])
    want = [(c + 1) * PER_CLIENT - 1 for c in range(CLIENTS)]
    assert mesh.global_device_ids().tolist() == want
    assert mesh.local_devices() == [f"CPU:{want[dtensor.client_id()]}"]
    arr = np.arange(CLIENTS * 2.0)
    t = dtensor.dtensor_from_array(arr, dtensor.Layout(["x"], mesh))
    np.testing.assert_array_equal(dtensor.gather(t - 1), arr - 1)


def test_create_distributed_mesh_bad_local_device_raises_everywhere(runtime):
    bad = [f"CPU:{PER_CLIENT}"] if dtensor.client_id() == 0 else ["CPU:0"]
    with pytest.raises(ValueError, match=f"CPU:{PER_CLIENT}"):
        dtensor.create_distributed_mesh([("x", CLIENTS)], local_devices=bad)
    dtensor.barrier()


# ---- TensorFlow's string forms ----------------------------------------------------------------

def test_mesh_and_layout_strings(mesh_2d):
    c = dtensor.client_id()
    job = "localhost" if CLIENTS == 1 else "worker"
    local = ",".join(f"/job:{job}/replica:0/task:{c}/device:CPU:{k}" for k in range(PER_CLIENT))
    ids = ",".join(str(c * PER_CLIENT + k) for k in range(PER_CLIENT))
    assert mesh_2d.to_string() == f"|x=3,y=2|0,1,2,3,4,5|{ids}|{local}"
    assert dtensor.Mesh.from_string(mesh_2d.to_string()) is mesh_2d
    layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh_2d)
    assert layout.to_string() == f"sharding_specs:x,unsharded, mesh:{mesh_2d.to_string()}"
    assert dtensor.Layout.from_string(layout.to_string()) == layout
    assert dtensor.Layout.from_string("sharding_specs:unsharded,y, mesh:|x=3,y=2|*CPU") == \
        dtensor.Layout([dtensor.UNSHARDED, "y"], mesh_2d)
    with pytest.raises(ValueError, match="carries no mesh"):
        dtensor.Layout.from_string("x,unsharded")
    assert dtensor.Layout.fully_replicated(mesh_2d, 2) == dtensor.Layout.replicated(mesh_2d, 2)


def test_mesh_from_string_outlives_a_dropped_twin(mesh_2d):
    # a mesh of the same axes and devices made and dropped must not hide the live one
    twin = dtensor.create_mesh([("x", 3), ("y", 2)], device_type="CPU")
    assert twin is not mesh_2d
    del twin
    gc.collect()
    assert dtensor.Mesh.from_string(mesh_2d.to_string()) is mesh_2d


def test_mesh_from_string_creates_on_devices(runtime):
    mesh = dtensor.Mesh.from_string("sub|z=2|1,3|")
    assert mesh.dim_names == ["z"] and mesh.global_device_ids().tolist() == [1, 3]
    assert mesh.name == "sub"
    assert dtensor.Mesh.from_string(mesh.to_string()) is mesh


# ---- values, names, indexing --------------------------------------------------------------------

def test_print_shows_values(mesh_2d, capsys):
    arr = np.arange(6, dtype=np.int32).reshape(3, 2)
    rep = dtensor.dtensor_from_array(arr, dtensor.Layout.replicated(mesh_2d, 2))
    shard = dtensor.dtensor_from_array(arr, dtensor.Layout(["x", "y"], mesh_2d))
    assert np.array2string(arr, separator=", ") in repr(rep)
    assert "mesh=" in repr(shard)  # repr never gathers
    print(shard)  # gathers: every client prints
    assert np.array2string(arr, separator=", ") in capsys.readouterr().out


def test_is_dtensor_like_and_default_mesh(mesh_2d):
    t = dtensor.dtensor_from_array(np.arange(6.0).reshape(3, 2), dtensor.Layout(["x", "y"],
                                                                                  mesh_2d))
    assert dtensor.is_dtensor(t) and not dtensor.is_dtensor(np.zeros(2))
    z, o = dtensor.zeros_like(t), dtensor.ones_like(t, dtype=np.int32)
    assert z.layout == t.layout and o.dtype == np.int32
    np.testing.assert_array_equal(dtensor.gather(z), np.zeros((3, 2)))
    np.testing.assert_array_equal(dtensor.gather(o), np.ones((3, 2)))
    with dtensor.default_mesh(mesh_2d):
        a = dtensor.ones([2, 2])
    with dtensor.run_on(mesh_2d):
        b = dtensor.zeros([3])
    assert a.layout == dtensor.Layout.replicated(mesh_2d, 2) and b.layout.mesh is mesh_2d
    c = dtensor.ones([2])  # outside: this client's first device, as a regular tensor
    assert c.layout.mesh.size == 1 and c.device.endswith("device:CPU:0")


@pytest.mark.parametrize("specs", [["x", "y"], ["unsharded", "x"], ["y", "unsharded"]])
def test_indexing_transpose_len(mesh_2d, specs):
    arr = np.arange(35, dtype=np.float64).reshape(5, 7)
    t = dtensor.dtensor_from_array(arr, dtensor.Layout(specs, mesh_2d))
    for key in [0, -1, 3, (1, 2), (slice(1, 4),), (slice(None), 2), (slice(2, None), slice(1, 5)),
                (-2, slice(None, -3)), slice(4, 1)]:
        np.testing.assert_array_equal(dtensor.gather(t[key]), arr[key], err_msg=str(key))
    np.testing.assert_array_equal(dtensor.gather(t.T), arr.T)
    assert len(t) == 5
    with pytest.raises(IndexError):
        t[5]
    with pytest.raises(ValueError, match="step"):
        t[::2]


# ---- division, floor division, modulo, integer mean --------------------------------------------

def test_integer_true_division(mesh_1d):
    a = dtensor.dtensor_from_array(np.array([7, -7, 1, 0, 9, -3], np.int32),
                                   dtensor.Layout(["x"], mesh_1d))
    q = a / 2
    assert q.dtype == np.float64
    np.testing.assert_array_equal(dtensor.gather(q), np.array([7, -7, 1, 0, 9, -3]) / 2)
    np.testing.assert_array_equal(dtensor.gather(7 / a[:3]), 7 / np.array([7, -7, 1]))
    assert dtensor.cast(a, np.float32).dtype == np.float32


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64])
def test_floordiv_and_mod_as_numpy(mesh_2d, dtype):
    rng = np.random.default_rng(5)
    a = rng.integers(-20, 21, size=(6, 4)).astype(dtype)
    b = rng.integers(-6, 7, size=(6, 4)).astype(dtype)
    b[b == 0] = 3
    if np.issubdtype(dtype, np.floating):
        a = a * dtype(0.75) + dtype(0.1)
        b = b * dtype(0.5)
    ta = dtensor.dtensor_from_array(a, dtensor.Layout(["x", "y"], mesh_2d))
    tb = dtensor.dtensor_from_array(b, dtensor.Layout(["unsharded", "x"], mesh_2d))
    np.testing.assert_array_equal(dtensor.gather(ta // tb), a // b)
    np.testing.assert_array_equal(dtensor.gather(ta % tb), a % b)
    np.testing.assert_array_equal(dtensor.gather(ta // 3), a // dtype(3))
    np.testing.assert_array_equal(dtensor.gather(ta % -3), a % dtype(-3))
    np.testing.assert_array_equal(dtensor.gather(-7 // tb), dtype(-7) // b)
    np.testing.assert_array_equal(dtensor.gather(dtensor.floormod(ta, tb)), np.mod(a, b))


def test_float_floordiv_edge_cases(mesh_1d):
    a = np.array([1.0, -1.0, 0.0, -0.0, 5.5, 1.0], np.float64)
    b = np.array([0.1, 0.1, -2.0, 3.0, -0.0, 0.0], np.float64)
    layout = dtensor.Layout(["x"], mesh_1d)
    ta, tb = dtensor.dtensor_from_array(a, layout), dtensor.dtensor_from_array(b, layout)
    with np.errstate(divide="ignore", invalid="ignore"):
        want_q, want_r = a // b, a % b
    np.testing.assert_array_equal(dtensor.gather(ta // tb), want_q)
    np.testing.assert_array_equal(dtensor.gather(ta % tb), want_r)
    assert np.array_equal(np.signbit(dtensor.gather(ta % tb)[:4]), np.signbit(want_r[:4]))


def test_integer_division_by_zero_is_zero(mesh_1d):
    a = dtensor.dtensor_from_array(np.array([5, -5, 0, 7, -7, 3], np.int64),
                                   dtensor.Layout(["x"], mesh_1d))
    assert dtensor.gather(a // 0).tolist() == [0] * 6
    assert dtensor.gather(a % 0).tolist() == [0] * 6


def test_reduce_mean_integer_truncates(mesh_2d):
    arr = np.array([[1, 2], [4, -8], [3, -7]], np.int32)
    t = dtensor.dtensor_from_array(arr, dtensor.Layout(["x", "y"], mesh_2d))
    assert int(dtensor.reduce_mean(t).numpy()) == int(np.trunc(arr.sum() / arr.size))
    m = dtensor.reduce_mean(t, axis=0)
    assert m.dtype == np.int32
    np.testing.assert_array_equal(dtensor.gather(m), np.trunc(arr.sum(0) / 3).astype(np.int32))
    np.testing.assert_array_equal(dtensor.gather(dtensor.reduce_mean(t, axis=-1, keepdims=True)),
                                  np.trunc(arr.sum(1, keepdims=True) / 2).astype(np.int32))


# ---- DVariable as a tf.Variable ----------------------------------------------------------------

def test_dvariable_constructor_forms(mesh_2d):
    layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh_2d)
    arr = np.arange(6, dtype=np.float32).reshape(3, 2)
    v1 = dtensor.DVariable(arr, layout=layout)
    v2 = dtensor.DVariable(dtensor.dtensor_from_array(arr, dtensor.Layout.replicated(mesh_2d, 2)),
                           layout=layout)
    v3 = dtensor.DVariable(lambda: arr, layout=layout, dtype=np.float64)
    with dtensor.default_mesh(mesh_2d):
        v4 = dtensor.DVariable(2.5)
    for v in (v1, v2):
        assert v.layout == layout and v.shape == (3, 2) and v.dtype == np.float32
        np.testing.assert_array_equal(dtensor.gather(v.value()), arr)
    assert v3.dtype == np.float64
    assert v4.dtype == np.float32 and float(v4.numpy()) == 2.5
    v5 = dtensor.DVariable(arr)  # no layout, no scope: a plain variable, as tf.Variable
    assert v5.layout.mesh.size == 1 and v5.dtype == np.float32
    np.testing.assert_array_equal(v5.numpy(), arr)
    with pytest.raises(dtensor.errors.UnimplementedError):
        v1.numpy()  # sharded, as DTensor.numpy
    assert repr(v1).startswith("<dtensor.Variable 'Variable:0' shape=(3, 2)")


def test_dvariable_operators_and_assign(mesh_2d):
    layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh_2d)
    arr = np.arange(6, dtype=np.float64).reshape(3, 2) - 2.0
    a = np.array([[1.0, -2.0], [0.5, 4.0], [3.0, 1.0]])
    v = dtensor.DVariable(arr, layout=layout)
    ta = dtensor.dtensor_from_array(a, dtensor.Layout.replicated(mesh_2d, 2))
    checks = [(v + ta, arr + a), (ta * v, a * arr), (-v, -arr), (v - 1, arr - 1),
              (2 - v, 2 - arr), (v / ta, arr / a), (v ** 2, arr ** 2), (abs(v), np.abs(arr)),
              (v < ta, (arr < a).astype(np.float64)), (v >= 0, (arr >= 0).astype(np.float64)),
              (v @ ta.T, arr @ a.T), (v // ta, arr // a), (v % 1.5, arr % 1.5), (v[1], arr[1]),
              (v.T, arr.T), (dtensor.matmul(v, ta, transpose_b=True), arr @ a.T)]
    for got, want in checks:
        assert isinstance(got, dtensor.DTensor)
        np.testing.assert_allclose(dtensor.gather(got), want, rtol=1e-15)
    assert len(v) == 3
    v.assign(a)
    np.testing.assert_array_equal(dtensor.gather(v.read_value()), a)
    v.assign_add(dtensor.relayout(ta, layout))
    np.testing.assert_array_equal(dtensor.gather(v.value()), 2 * a)
    v.assign_sub(1.0)
    np.testing.assert_array_equal(dtensor.gather(v), 2 * a - 1)
    with pytest.raises(dtensor.DTensorError):
        v.assign(ta)  # another layout
