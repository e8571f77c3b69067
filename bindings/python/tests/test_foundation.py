"""Runtime, Mesh, Layout, pack/unpack and gather, checked against numpy slicing."""
import itertools

import numpy as np
import pytest

import dtensor
from conftest import CLIENTS, DEVICES


def shard_bounds(n, s, i):
    """Balanced split, computed independently of the library: deal n elements one by one to
    the shard with the fewest (lowest index first)."""
    counts = [0] * s
    for _ in range(n):
        counts[counts.index(min(counts))] += 1
    return sum(counts[:i]), sum(counts[:i + 1])


def expected_component(arr, layout, device):
    mesh = layout.mesh
    coords = np.unravel_index(device, mesh.shape())
    index = []
    for axis, spec in enumerate(layout.sharding_specs):
        if spec == dtensor.UNSHARDED:
            index.append(slice(None))
        else:
            dim = mesh.dim_names.index(spec)
            lo, hi = shard_bounds(arr.shape[axis], mesh.shape()[dim], coords[dim])
            index.append(slice(lo, hi))
    return arr[tuple(index)]


def all_layouts(mesh, rank):
    choices = [dtensor.UNSHARDED] + mesh.dim_names
    for specs in itertools.product(choices, repeat=rank):
        named = [s for s in specs if s != dtensor.UNSHARDED]
        if len(named) == len(set(named)):
            yield dtensor.Layout(list(specs), mesh)


def test_runtime(runtime):
    assert dtensor.num_clients() == CLIENTS
    assert 0 <= dtensor.client_id() < CLIENTS
    assert dtensor.num_local_devices("CPU") == DEVICES // CLIENTS
    assert dtensor.num_global_devices("CPU") == DEVICES
    first = dtensor.client_id() * (DEVICES // CLIENTS)
    assert dtensor.local_devices("CPU") == [f"CPU:{first + i}" for i in range(DEVICES // CLIENTS)]
    assert "CPU:0" in dtensor.devices_report()
    dtensor.barrier()


def test_mesh(mesh_2d):
    assert mesh_2d.dim_names == ["x", "y"]
    assert mesh_2d.shape() == [3, 2]
    assert mesh_2d.size == 6
    assert mesh_2d.dim_size("y") == 2
    assert "x" in mesh_2d and "z" not in mesh_2d
    assert mesh_2d.device_type() == "CPU"
    n = DEVICES // CLIENTS
    assert mesh_2d.local_device_ids() == list(range(dtensor.client_id() * n,
                                                    dtensor.client_id() * n + n))
    assert mesh_2d.global_device_ids().tolist() == [[0, 1], [2, 3], [4, 5]]


def test_mesh_errors(runtime):
    with pytest.raises(dtensor.DTensorError) as e:
        dtensor.create_mesh([("x", 4)], device_type="CPU")
    assert e.value.status == "DT_ERR_MESH" and "x=4" in str(e.value) and "6" in str(e.value)
    with pytest.raises(dtensor.DTensorError) as e:
        dtensor.create_mesh([("x", 3), ("x", 2)], device_type="CPU")
    assert "used twice" in str(e.value)
    with pytest.raises(ValueError):
        dtensor.create_mesh([("x", 6)], device_type="TPU")


def test_layout(mesh_2d):
    l = dtensor.Layout(["x", dtensor.UNSHARDED], mesh_2d)
    assert l.short_string() == "x,unsharded"
    assert l.sharding_specs == ["x", "unsharded"] and l.rank == 2 and l.mesh == mesh_2d
    assert dtensor.Layout.from_string("x, unsharded", mesh_2d) == l
    assert dtensor.Layout.replicated(mesh_2d, 2).is_fully_replicated()
    assert dtensor.Layout.batch_sharded(mesh_2d, "y", 3).sharding_specs == ["y", "unsharded",
                                                                            "unsharded"]
    assert dtensor.Layout.inner_sharded(mesh_2d, "x", 2).sharding_specs == ["unsharded", "x"]
    assert l.num_shards(0) == 3 and l.num_shards(1) == 1
    p = dtensor.Layout(["x", dtensor.UNSHARDED], mesh_2d, partial={"y": "sum"})
    assert p.short_string() == "x,unsharded;partial_sum=y"
    assert dtensor.Layout.from_string(p.short_string(), mesh_2d) == p
    assert dtensor.Layout.from_string(p.to_string()) == p
    assert p != l and not p.is_fully_replicated()


@pytest.mark.parametrize("specs,message", [
    (["z"], '"z"'),
    (["x", "x"], "more than one"),
    (["unsharded"] * 9, "9"),
])
def test_layout_errors(mesh_2d, specs, message):
    with pytest.raises(dtensor.DTensorError) as e:
        dtensor.Layout(specs, mesh_2d)
    assert e.value.status == "DT_ERR_LAYOUT" and message in str(e.value)


def test_local_shape_uneven(mesh_2d):
    l = dtensor.Layout(["x", "y"], mesh_2d)
    for n0, n1 in [(7, 3), (2, 5), (0, 1)]:
        for dev in range(6):
            local, offset = l.local_shape((n0, n1), dev)
            x, y = divmod(dev, 2)
            lo0, hi0 = shard_bounds(n0, 3, x)
            lo1, hi1 = shard_bounds(n1, 2, y)
            assert local == (hi0 - lo0, hi1 - lo1) and offset == (lo0, lo1)


def test_guide_first_dtensor(mesh_1d):
    """dtensor_overview: [0, 1] replicated on a 6-device 1-D mesh."""
    layout = dtensor.Layout([dtensor.UNSHARDED], mesh_1d)
    t = dtensor.dtensor_from_array([0, 1], layout, dtype=np.int32)
    assert t.shape == (2,) and t.dtype == np.int32
    assert [c.tolist() for c in dtensor.unpack(t)] == [[0, 1]] * (DEVICES // CLIENTS)
    assert t.numpy().tolist() == [0, 1]
    assert dtensor.fetch_layout(t) == layout
    dtensor.check_layout(t, layout)


@pytest.mark.parametrize("specs,components", [
    (["x", "y"], [[[0]], [[1]], [[2]], [[3]], [[4]], [[5]]]),
    (["unsharded", "unsharded"], [[[0, 1], [2, 3], [4, 5]]] * 6),
    (["x", "unsharded"], [[[0, 1]], [[0, 1]], [[2, 3]], [[2, 3]], [[4, 5]], [[4, 5]]]),
])
def test_guide_sharding(mesh_2d, specs, components):
    """dtensor_overview: fully sharded, fully replicated and hybrid layouts of range(6)."""
    layout = dtensor.Layout(specs, mesh_2d)
    t = dtensor.dtensor_from_array(np.arange(6).reshape(3, 2), layout, dtype=np.int32)
    ids = mesh_2d.local_device_ids()
    assert [c.tolist() for c in dtensor.unpack(t)] == [components[i] for i in ids]
    assert dtensor.gather(t).tolist() == [[0, 1], [2, 3], [4, 5]]
    if layout.is_fully_replicated():
        assert t.numpy().tolist() == [[0, 1], [2, 3], [4, 5]]
    else:
        with pytest.raises(dtensor.DTensorError):
            t.numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_every_layout_round_trip(mesh_2d, dtype):
    rng = np.random.default_rng(0)
    for shape in [(5, 3), (3, 2), (1, 7)]:
        arr = (rng.standard_normal(shape) * 100).astype(dtype)
        for layout in all_layouts(mesh_2d, 2):
            t = dtensor.dtensor_from_array(arr, layout)
            comps = dtensor.unpack(t)
            for dev, comp in zip(mesh_2d.local_device_ids(), comps):
                np.testing.assert_array_equal(comp, expected_component(arr, layout, dev))
            np.testing.assert_array_equal(dtensor.gather(t), arr)
            back = dtensor.pack(comps, layout, shape=shape)
            np.testing.assert_array_equal(dtensor.gather(back), arr)
            t.free()
            back.free()


def test_pack_even_shape_inferred(mesh_2d):
    layout = dtensor.Layout(["x", "y"], mesh_2d)
    arr = np.arange(24, dtype=np.float64).reshape(6, 4)
    t = dtensor.pack(dtensor.unpack(dtensor.dtensor_from_array(arr, layout)), layout)
    assert t.shape == (6, 4)
    np.testing.assert_array_equal(dtensor.gather(t), arr)


def test_partial_sum_gather(mesh_2d):
    """Components of a partial layout are terms: gather reduces them."""
    layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh_2d, partial={"y": "sum"})
    ids = mesh_2d.local_device_ids()
    comps = [np.full((1, 2), 10 * (d // 2) + (d % 2) + 1, dtype=np.int64) for d in ids]
    t = dtensor.pack(comps, layout)
    want = np.array([[10 * x + 1 + 10 * x + 2] * 2 for x in range(3)])
    np.testing.assert_array_equal(dtensor.gather(t), want)
    with pytest.raises(dtensor.DTensorError):
        dtensor.dtensor_from_array(np.zeros((3, 2)), layout)


def test_pack_errors(mesh_2d):
    layout = dtensor.Layout(["x", "y"], mesh_2d)
    n = DEVICES // CLIENTS
    with pytest.raises(ValueError):
        dtensor.pack([np.zeros((1, 1))] * (n + 1), layout)
    with pytest.raises(ValueError) as e:
        dtensor.pack([np.zeros((2, 1))] * n, layout, shape=(3, 2))
    assert "(2, 1)" in str(e.value) and "(1, 1)" in str(e.value)
    with pytest.raises(TypeError):
        dtensor.dtensor_from_array(np.zeros((3, 2), dtype=np.complex64), layout)


def test_check_layout_mismatch(mesh_2d):
    t = dtensor.dtensor_from_array(np.zeros((3, 2)), dtensor.Layout(["x", "y"], mesh_2d))
    with pytest.raises(ValueError):
        dtensor.check_layout(t, dtensor.Layout.replicated(mesh_2d, 2))


def test_no_copy_for_matching_arrays(mesh_2d):
    """A contiguous array of a supported dtype goes to the C layer as is (buffer protocol)."""
    arr = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert np.ascontiguousarray(arr, dtype=None) is arr
    t = dtensor.dtensor_from_array(arr, dtensor.Layout.replicated(mesh_2d, 2))
    np.testing.assert_array_equal(t.numpy(), arr)
