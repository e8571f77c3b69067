"""GPU meshes from Python: ops against numpy, NCCL asked for on meshes of one GPU (one rank per
physical GPU: the logical devices combine on it first), and DLPack to and from PyTorch on the
GPU. Skipped where this client has no GPU device; with GPUs emulated on the host
(DTENSOR_EMULATE_CUDA) the ops run, NCCL and PyTorch's GPU do not."""
import os

import numpy as np
import pytest

import dtensor

EMULATED = bool(os.environ.get("DTENSOR_EMULATE_CUDA"))


@pytest.fixture(scope="module")
def gpus(runtime):
    n = dtensor.num_global_devices("GPU")
    if n == 0 or dtensor.num_local_devices("GPU") == 0:
        pytest.skip("no GPU device on this client")
    return n


def test_ops_on_a_gpu_mesh_match_numpy(gpus):
    mesh = dtensor.create_mesh([("x", gpus)], device_type="GPU")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((8, 4 * gpus)).astype(np.float32)
    b = rng.standard_normal((4 * gpus, 6)).astype(np.float32)
    ta = dtensor.dtensor_from_array(a, dtensor.Layout([dtensor.UNSHARDED, "x"], mesh))
    tb = dtensor.dtensor_from_array(b, dtensor.Layout(["x", dtensor.UNSHARDED], mesh))
    c = dtensor.matmul(ta, tb)  # contracting axis sharded: a sum across the GPUs
    np.testing.assert_allclose(dtensor.gather(c), a @ b, rtol=1e-5, atol=1e-5)
    d = dtensor.relu(c) + 1.0
    np.testing.assert_allclose(dtensor.gather(d), np.maximum(a @ b, 0) + 1, rtol=1e-5, atol=1e-5)
    s = dtensor.reduce_sum(ta, axis=1)
    np.testing.assert_allclose(dtensor.gather(s), a.sum(1), rtol=1e-5, atol=1e-5)


def test_nccl_on_a_mesh_of_one_gpu(gpus):
    if EMULATED:
        pytest.skip("NCCL needs a real GPU")
    if dtensor.num_clients() > 1:
        pytest.skip("a mesh of this client's GPUs")
    n = dtensor.num_local_devices("GPU")
    mesh = dtensor.create_mesh([("x", n)], device_type="GPU")
    dtensor.set_collective_algorithm(mesh, "nccl")
    x = np.arange(3 * n * 5, dtype=np.float32).reshape(3 * n, 5)
    t = dtensor.dtensor_from_array(x, dtensor.Layout(["x", dtensor.UNSHARDED], mesh))
    total = dtensor.reduce_sum(t, axis=0)  # partial sums all-reduced by NCCL
    np.testing.assert_array_equal(dtensor.gather(total), x.sum(0))
    assert any(e["backend"] == "nccl" for e in dtensor.ledger()["entries"])


def test_dlpack_with_torch_on_the_gpu(gpus):
    torch = pytest.importorskip("torch")
    if EMULATED or not torch.cuda.is_available():
        pytest.skip("PyTorch has no GPU here")
    mesh = dtensor.create_mesh([("x", gpus)], device_type="GPU")
    layout = dtensor.Layout(["x"], mesh)
    n = len(mesh.local_device_ids())
    # torch's GPU tensors become the DTensor's components without a copy
    parts = [torch.full((4,), float(d), device="cuda") for d in mesh.local_device_ids()]
    t = dtensor.from_dlpack(parts, layout, shape=(4 * gpus,))
    y = t * 3.0 + 1.0
    back = [torch.from_dlpack(c) for c in dtensor.local_components(y)]
    for d, b in zip(mesh.local_device_ids(), back):
        assert b.is_cuda
        assert b.tolist() == [3.0 * d + 1.0] * 4
    # the DTensor reads the torch tensors' memory itself (a later write is torch's to order)
    parts[0].add_(10.0)
    torch.cuda.synchronize()
    got = dtensor.gather(t)
    assert got[0] == float(mesh.local_device_ids()[0]) + 10.0
    assert n == len(back)
