"""Checkpoints (dtensor.train.Checkpoint, CheckpointManager, keras save_weights): round trips
into other layouts against the gathered tensors, the file read by h5py (an independent HDF5
reader) against them, errors, and a training run resumed from a checkpoint giving bitwise the
losses of the run that never stopped, random draws included."""
import os
import shutil
import tempfile

import h5py
import numpy as np
import pytest

import dtensor
from dtensor import keras


@pytest.fixture
def shared_dir(runtime):
    """One directory for every client (client 0 makes it and names it)."""
    name = tempfile.mkdtemp(prefix="dtensor-ckpt-") if dtensor.client_id() == 0 else None
    name = dtensor._allgather_json(name)[0]
    yield name
    dtensor.barrier()
    if dtensor.client_id() == 0:
        shutil.rmtree(name, ignore_errors=True)


def variables(mesh):
    rng = np.random.default_rng(5)
    specs = {
        "f32": (np.float32, (6, 5), ["x", "y"]),
        "f64": (np.float64, (7, 3), ["y", "x"]),
        "i32": (np.int32, (4, 4), ["x", dtensor.UNSHARDED]),
        "i64": (np.int64, (9,), ["y"]),
        "f16": (np.float16, (5, 3), ["y", dtensor.UNSHARDED]),
        "bf16": (dtensor.bfloat16, (7,), ["x"]),
        "bool": (np.bool_, (3, 4), [dtensor.UNSHARDED, "y"]),
        "u8": (np.uint8, (4, 6), ["x", "y"]),
        "i8": (np.int8, (5,), ["y"]),
    }
    out = {}
    for name, (dt, shape, spec) in specs.items():
        a = (rng.normal(size=shape) * 100).astype(np.float32)
        a = (a > 0) if dt is np.bool_ else a.astype(np.int64).astype(dt) \
            if np.dtype(dt).kind in "iu" else a.astype(dt)
        out[name] = (a, dtensor.DVariable(a, layout=dtensor.Layout(spec, mesh)))
    return out


def test_round_trip_into_other_layouts_and_h5py(mesh_2d, shared_dir):
    vs = variables(mesh_2d)
    ckpt = dtensor.train.Checkpoint(**{k: v for k, (_, v) in vs.items()})
    ckpt.metadata["run"] = "test"
    path = ckpt.save(os.path.join(shared_dir, "c"))
    assert path.endswith("c-1.h5") and ckpt.save_counter == 1
    # into zeros of other layouts (replicated, or sharded differently)
    back = {}
    for k, (a, v) in vs.items():
        spec = [dtensor.UNSHARDED] * a.ndim
        spec[-1] = "x"
        back[k] = dtensor.DVariable(np.zeros_like(a), layout=dtensor.Layout(spec, mesh_2d))
    other = dtensor.train.Checkpoint(**back)
    other.restore(path).assert_consumed()
    assert other.save_counter == 1 and other.metadata == {"run": "test"}
    for k, (a, _) in vs.items():
        got = dtensor.gather(back[k].read_value())
        assert got.dtype == a.dtype
        np.testing.assert_array_equal(got, a)
        assert back[k].layout.sharding_specs[-1] == "x"
    # h5py, on every client: global shapes, dtypes and values, and the attributes
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == "dtensor-checkpoint"
        assert f.attrs["library_version"] == "0.1.0"
        assert f["counters/save_counter"][()] == 1
        assert f["metadata"].attrs["run"] == "test"
        for k, (a, v) in vs.items():
            d = f[f"variables/{k}"]
            got = d[()]
            # HDF5 has no bfloat16 and no bool: raw 16 bits and bytes, named by "dtype"
            assert d.attrs["dtype"] == {"bf16": "bfloat16", "bool": "bool"}.get(
                k, np.dtype(a.dtype).name)
            if k == "bf16":
                got = got.view(dtensor.bfloat16)
            elif k == "bool":
                got = got.astype(np.bool_)
            assert d.shape == a.shape and got.dtype == a.dtype
            np.testing.assert_array_equal(got, dtensor.gather(v.read_value()))
            assert d.attrs["layout"] == v.layout.short_string()
            assert d.attrs["mesh"] == "x=3,y=2"
    # one tensor read alone, in any layout
    t = dtensor.train.load_variable(path, "variables/f64",
                                    dtensor.Layout(["x", "y"], mesh_2d))
    np.testing.assert_array_equal(dtensor.gather(t), vs["f64"][0])
    assert ("variables/i64", (9,)) in dtensor.train.list_variables(path)


def test_restore_errors_name_the_variable(mesh_2d, shared_dir):
    a = dtensor.DVariable(np.ones((4, 2), np.float32), layout=dtensor.Layout.replicated(mesh_2d, 2))
    path = dtensor.train.Checkpoint(w=a).write(os.path.join(shared_dir, "w.h5"))
    wrong = dtensor.DVariable(np.zeros((2, 4), np.float32),
                              layout=dtensor.Layout.replicated(mesh_2d, 2))
    with pytest.raises(dtensor.DTensorError, match=r'variable "w" has shape \[2,4\]') as e:
        dtensor.train.Checkpoint(w=wrong).restore(path)
    assert e.value.status == "DT_ERR_SHAPE"
    np.testing.assert_array_equal(dtensor.gather(wrong.read_value()), np.zeros((2, 4)))
    with pytest.raises(dtensor.DTensorError, match="holds no"):
        dtensor.train.Checkpoint(v=a).restore(path)
    foreign = os.path.join(shared_dir, "foreign.h5")
    if dtensor.client_id() == 0:
        with open(foreign, "w") as f:
            f.write("not hdf5")
    dtensor.barrier()
    with pytest.raises(dtensor.DTensorError, match="not a readable HDF5 file") as e:
        dtensor.train.Checkpoint(w=a).restore(foreign)
    assert e.value.status == "DT_ERR_IO"
    with pytest.raises(TypeError, match="tracked objects"):
        dtensor.train.Checkpoint(w=3).write(os.path.join(shared_dir, "x.h5"))
    assert dtensor.train.Checkpoint(w=a).restore(None) is not None  # nothing to restore


def model_and_data(seed):
    keras.Layer._count = 0
    model = keras.Sequential([keras.layers.Dense(8, activation="tanh", input_shape=(4,)),
                              keras.layers.Dense(3)])
    if seed:  # other initial values, which the restore must overwrite
        for v in model.variables:
            v.assign(np.full(v.shape, seed, dtype=np.float32))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(12, 4)).astype(np.float32)
    y = rng.normal(size=(12, 3)).astype(np.float32)
    return model, x, y


def train_steps(model, opt, gen, x, y, steps, mesh):
    layout = dtensor.Layout.replicated(mesh, 2)
    losses = []
    for _ in range(steps):
        xb = dtensor.dtensor_from_array(x, layout) + gen.normal((12, 4), stddev=0.1,
                                                                  layout=layout)
        yb = dtensor.dtensor_from_array(y, layout)
        with dtensor.GradientTape() as tape:
            d = model(xb) - yb
            loss = dtensor.reduce_mean(d * d)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        losses.append(dtensor.gather(loss).item())
    return losses


def test_resumed_training_gives_the_same_losses(mesh_2d, shared_dir):
    model, x, y = model_and_data(0)
    opt, gen = dtensor.Adam(0.05), dtensor.random.Generator.from_seed(7)
    straight = train_steps(model, opt, gen, x, y, 6, mesh_2d)

    model, x, y = model_and_data(0)
    opt, gen = dtensor.Adam(0.05), dtensor.random.Generator.from_seed(7)
    step = dtensor.DVariable(np.int64(0), layout=dtensor.Layout.replicated(mesh_2d, 0))
    ckpt = dtensor.train.Checkpoint(model=model, optimizer=opt, rng=gen, step=step)
    manager = dtensor.train.CheckpointManager(ckpt, os.path.join(shared_dir, "run"), 2)
    first = train_steps(model, opt, gen, x, y, 3, mesh_2d)
    step.assign_add(3)
    for _ in range(3):
        manager.save()
    assert [os.path.basename(p) for p in manager.checkpoints] == ["ckpt-2.h5", "ckpt-3.h5"]
    assert manager.latest_checkpoint.endswith("ckpt-3.h5")
    assert dtensor.train.latest_checkpoint(os.path.join(shared_dir, "run")) == \
        manager.latest_checkpoint

    # a fresh start: other weights, optimizer and generator, all from the checkpoint
    model, x, y = model_and_data(3)
    opt, gen = dtensor.Adam(0.05), dtensor.random.Generator.from_seed(99)
    step = dtensor.DVariable(np.int64(0), layout=dtensor.Layout.replicated(mesh_2d, 0))
    ckpt = dtensor.train.Checkpoint(model=model, optimizer=opt, rng=gen, step=step)
    manager = dtensor.train.CheckpointManager(ckpt, os.path.join(shared_dir, "run"), 2)
    ckpt.restore(manager.latest_checkpoint)
    assert opt.iterations == 3 and gen.state == (7, 3) and ckpt.save_counter == 3
    assert int(step.numpy()) == 3
    rest = train_steps(model, opt, gen, x, y, 3, mesh_2d)
    assert first + rest == straight  # bitwise: floats compared exactly
    assert manager.save().endswith("ckpt-4.h5")


def test_keras_save_weights_is_an_h5_checkpoint(mesh_2d, shared_dir):
    model, x, y = model_and_data(0)
    path = os.path.join(shared_dir, "weights.h5")
    model.save_weights(path)
    weights = model.get_weights()
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["variables/model/layer_with_weights-0/kernel"][()],
                                      weights[0])
        np.testing.assert_array_equal(f["variables/model/layer_with_weights-1/bias"][()],
                                      weights[3])
    other, _, _ = model_and_data(2)
    other.load_weights(path)
    for a, b in zip(other.get_weights(), weights):
        np.testing.assert_array_equal(a, b)
    # ModelCheckpoint with the optimizer's state
    model.compile(dtensor.Adam(0.01), "mse")
    cb = keras.callbacks.ModelCheckpoint(os.path.join(shared_dir, "e{epoch}.h5"),
                                         save_weights_only=False)
    model.fit(x, y, batch_size=6, epochs=2, verbose=0, shuffle=False, callbacks=[cb])
    with h5py.File(os.path.join(shared_dir, "e2.h5"), "r") as f:
        assert f["optimizers/optimizer/iterations"][()] == 4
        assert f["optimizers/optimizer"].attrs["kind"] == "adam"
        assert "optimizers/optimizer/slots/model/layer_with_weights-0/kernel/v" in f
