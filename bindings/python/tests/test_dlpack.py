"""DLPack: a DTensor's local components lent to numpy (and PyTorch where installed) without a
copy, and arrays' memory taken as a DTensor's components without a copy."""
import gc

import numpy as np
import pytest

import dtensor


def test_components_lent_without_copy(mesh_1d):
    host = np.arange(14, dtype=np.float32).reshape(7, 2)  # 7 rows over 6 devices: uneven
    t = dtensor.dtensor_from_array(host, dtensor.Layout(["x", dtensor.UNSHARDED], mesh_1d))
    comps = dtensor.local_components(t)
    arrays = [np.from_dlpack(c) for c in comps]
    want = []
    for d, a, c in zip(mesh_1d.local_device_ids(), arrays, comps):
        shape, offset = t.layout.local_shape([7, 2], d)
        want.append(host[offset[0]:offset[0] + shape[0]])
        np.testing.assert_array_equal(a, want[-1])
        assert c.__dlpack_device__() == (1, 0)
    # no copy: the arrays are the DTensor's buffers (two reads see one memory)
    if arrays and arrays[0].size:
        again = np.from_dlpack(comps[0])
        assert again.__array_interface__["data"][0] == arrays[0].__array_interface__["data"][0]
    # the memory stays lent after the DTensor is dropped, until the arrays go
    del t, comps
    gc.collect()
    for a, w in zip(arrays, want):
        np.testing.assert_array_equal(a, w)
    del arrays
    gc.collect()


def test_from_dlpack_takes_memory_without_copy(mesh_1d):
    layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh_1d)
    shapes = [layout.local_shape([9, 3], d)[0] for d in mesh_1d.local_device_ids()]
    offsets = [layout.local_shape([9, 3], d)[1][0] for d in mesh_1d.local_device_ids()]
    full = np.arange(27, dtype=np.float64).reshape(9, 3)
    parts = [np.ascontiguousarray(full[o:o + s[0]]) for o, s in zip(offsets, shapes)]
    t = dtensor.from_dlpack(parts, layout, shape=(9, 3))
    np.testing.assert_array_equal(dtensor.gather(t), full)
    np.testing.assert_array_equal(dtensor.gather(dtensor.reduce_sum(t, axis=0)), full.sum(0))
    if parts[0].size:  # the DTensor reads the arrays' memory itself
        parts[0][0, 0] = -1.0
        assert dtensor.unpack(t)[0][0, 0] == -1.0
    del t
    gc.collect()


def test_one_component_dtensor_is_a_dlpack_producer():
    s = dtensor.MultiWorkerMirroredStrategy()
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    batch = next(iter(s.experimental_distribute_dataset([x])))
    lent = s.run(lambda t: np.from_dlpack(t * 2.0).copy(), args=(batch,))
    for k, a in zip(range(s._first_replica, s._first_replica + s._local_replicas), lent.values):
        np.testing.assert_array_equal(a, 2 * x[k:k + 1])


def test_from_dlpack_errors_take_nothing(mesh_1d):
    layout = dtensor.Layout(["x"], mesh_1d)
    n = len(mesh_1d.local_device_ids())
    good = [np.ones(1, np.float32) for _ in range(n)]
    with pytest.raises(ValueError, match="components"):
        dtensor.from_dlpack(good[:-1] if n > 1 else good * 2, layout, shape=(6,))
    with pytest.raises(ValueError, match="shape"):
        dtensor.from_dlpack([np.ones(2, np.float32)] * n, layout, shape=(6,))
    with pytest.raises(TypeError, match="__dlpack__"):
        dtensor.from_dlpack([[1.0]] * n, layout, shape=(6,))
    strided = [np.ones((1, 2), np.float32).T for _ in range(n)]  # (2, 1) view, not contiguous
    layout2 = dtensor.Layout(["x", dtensor.UNSHARDED], mesh_1d)
    t = dtensor.from_dlpack(strided, layout2, shape=(2 * 6, 1))  # unit axes: any stride is fine
    del t
    sliced = [np.ones((2, 4), np.float32)[:, ::2] for _ in range(n)]
    with pytest.raises(ValueError, match="contiguous"):
        dtensor.from_dlpack(sliced, layout2, shape=(12, 2))
    with pytest.raises(dtensor.DTensorError, match="one component"):
        dtensor.ones([6], layout=layout).__dlpack__()
    for a in good:  # still the caller's, untouched
        assert a[0] == 1.0


def test_torch_round_trip(mesh_1d):
    torch = pytest.importorskip("torch")
    layout = dtensor.Layout(["x"], mesh_1d)
    n = len(mesh_1d.local_device_ids())
    parts = [torch.full((2,), float(i)) for i in range(n)]
    t = dtensor.from_dlpack(parts, layout, shape=(12,))
    back = [torch.from_dlpack(c) for c in dtensor.local_components(t * 3.0)]
    for i, b in enumerate(back):
        assert b.tolist() == [3.0 * i] * 2


def test_initialize_gpu_without_gpus_raises_and_stops():
    import subprocess
    import sys

    from examples_run import clean_env
    code = ("import dtensor\n"
            "try:\n"
            "    dtensor.initialize_accelerator_system('GPU')\n"
            "    print('GPU', dtensor.num_local_devices('GPU'))\n"
            "    dtensor.shutdown_accelerator_system()\n"
            "except ValueError as e:\n"
            "    print('raised', e, dtensor.is_initialized())\n"
            "print(dtensor.initialize_accelerator_system(None))\n")
    env = clean_env()
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                         text=True, timeout=60).stdout.split("\n")
    if out[0].startswith("GPU"):  # a machine with GPUs: they are found
        assert int(out[0].split()[1]) > 0 and out[1] == "GPU"
    else:
        assert "clients [0] have no GPU" in out[0] and out[0].endswith("False")
        assert out[1] == "CPU"


def test_tf_experimental_dlpack_round_trip_without_copy():
    """tf.experimental.dlpack as TensorFlow's documentation uses it: to_dlpack(tensor) gives a
    capsule, from_dlpack(capsule) a tensor of that memory (no copy), here a regular tensor on
    this client alone; numpy arrays' memory comes in the same way."""
    from dtensor.experimental import dlpack
    x = dtensor.constant([[1., 2.], [3., 4.]])
    capsule = dlpack.to_dlpack(x)
    y = dlpack.from_dlpack(capsule)
    np.testing.assert_array_equal(y.numpy(), [[1., 2.], [3., 4.]])
    assert y.dtype == np.float32 and y.layout.mesh is x.layout.mesh
    with pytest.raises(dtensor.errors.InvalidArgumentError, match="consumed once"):
        dlpack.from_dlpack(capsule)
    b = dlpack.from_dlpack(dlpack.to_dlpack(dtensor.constant([1.5, -2.], dtensor.bfloat16)))
    assert b.dtype == dtensor.bfloat16 and b.numpy().tolist() == [1.5, -2.]
    # one memory: the components of both are the same buffer
    a, b = (np.from_dlpack(dtensor.local_components(t)[0]) for t in (x, y))
    assert a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    host = np.arange(6, dtype=np.int64).reshape(2, 3)
    z = dlpack.from_dlpack(host)
    assert np.from_dlpack(z).__array_interface__["data"][0] == \
        host.__array_interface__["data"][0]
    np.testing.assert_array_equal((z + 1).numpy(), host + 1)
    with pytest.raises(TypeError, match="DLPack capsule"):
        dlpack.from_dlpack([1, 2])
    with pytest.raises(dtensor.errors.InvalidArgumentError, match="not contiguous"):
        dlpack.from_dlpack(host.T)
