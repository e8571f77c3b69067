"""Bad arguments from Python: argument errors are TypeError or ValueError raised before C reads
anything (lists shorter or longer than the rank, NUL in names, layouts of another rank),
library errors DTensorError naming the values; nothing reads past what was given."""
import numpy as np
import pytest

import dtensor


@pytest.fixture(scope="module")
def t(mesh_2d):
    return dtensor.dtensor_from_array(np.arange(6, dtype=np.float32).reshape(3, 2),
                                      dtensor.Layout(["x", "y"], mesh_2d))


@pytest.mark.parametrize("call, error, needle", [
    (lambda t: dtensor.transpose(t, [1]), ValueError, "perm has 1 entries, the tensor rank 2"),
    (lambda t: dtensor.transpose(t, [1, 0, 2]), ValueError, "perm has 3 entries"),
    (lambda t: dtensor.slice(t, [0], [1]), ValueError, "begin has 1 entries and size 1"),
    (lambda t: dtensor.slice(t, [0, 0, 0], [1, 1, 1]), ValueError, "the tensor rank 2"),
    (lambda t: dtensor.concat([t, t], -3), dtensor.DTensorError, "axis -3 is outside"),
    (lambda t: dtensor.reduce_sum(t, axis=5), dtensor.DTensorError, "axis 5"),
    (lambda t: dtensor.reshape(t, [2, "a"]), ValueError, "'a'"),
    (lambda t: dtensor.ones([2], layout=t.layout), ValueError, "has rank 2, the shape [2]"),
    (lambda t: dtensor.create_mesh([("a\0b", 6)]), ValueError, "NUL"),
    (lambda t: t[5], IndexError, "out of range"),
])
def test_bad_arguments(t, call, error, needle):
    with pytest.raises(error) as e:
        call(t)
    assert needle in str(e.value)


def test_rank_zero_tensor_from_array(mesh_2d):
    s = dtensor.dtensor_from_array(np.float32(3.5), dtensor.Layout.replicated(mesh_2d, 0))
    assert s.shape == () and float(s) == 3.5


def test_extension_converters(t):
    """The extension's own argument converters (fuzzed by tests/fuzz/fuzz_python.c): an op gets
    exactly the operands its C call reads; a list argument that is not a list or tuple raises
    TypeError; an entry past 64 bits ValueError; a layer that is not a tuple TypeError."""
    c = dtensor._dtensor
    h = t._handle
    with pytest.raises(ValueError, match="matmul: 1 operands, expected 2"):
        c.apply("matmul", [h], None, None, False)
    with pytest.raises(ValueError, match="transpose: 2 operands, expected 1"):
        c.apply("transpose", [h, h], None, None, False, [1, 0])
    with pytest.raises(TypeError, match="expected a list or tuple, got memoryview"):
        c.apply("reshape", [h], None, None, False, memoryview(bytes(8)).cast("b", (2, 4)))
    with pytest.raises(ValueError, match="does not fit in 64 bits"):
        c.apply("reshape", [h], None, None, False, [2**70])
    with pytest.raises(TypeError, match="layer 0: expected a tuple, got int"):
        c.model_create(4, [5], c.DTYPE_F32, 0)


def test_sizes_that_overflow(t):
    """f64 [2^61] is 2^64 bytes: refused naming the shape (it wrote past a short buffer)."""
    with pytest.raises(dtensor.DTensorError, match="2305843009213693952"):
        dtensor.ones((2**61,), dtype=np.float64,
                     layout=dtensor.Layout.replicated(t.layout.mesh, 1))


def test_concat_of_two_dtypes(t):
    with pytest.raises(dtensor.DTensorError) as e:
        dtensor.concat([t, dtensor.cast(t, np.float64)], 0)
    assert e.value.status == "DT_ERR_DTYPE"


# ---- every public entry point, with bad values -------------------------------------------------
#
# Each public function and class of the package (dtensor.__all__ and TensorFlow's module paths:
# nn, math, random, config, distribute, data, keras, train) and each method of its objects is
# called with bad values in its first and second argument: it may succeed (None is a valid
# default for many arguments) or raise DTensorError, TypeError or ValueError, nothing else (no
# AttributeError, IndexError, KeyError, ZeroDivisionError, OverflowError from inside). A new entry
# point is in the table by itself; only the exemptions below (with their reason) are skipped.

ALLOWED = (dtensor.DTensorError, TypeError, ValueError)
BAD = [None, "text", object(), -1, 2.5, 2**70, float("nan"), [], [[1, 2], [3]]]
EXEMPT = {
    # lifecycle: a bad call must not stop the runtime the other tests run on
    "initialize_accelerator_system", "shutdown_accelerator_system",
    # blocking by design: every client must call them alike
    "barrier",
}


def _public(namespace, prefix):
    names = getattr(namespace, "__all__", None) or [n for n in vars(namespace)
                                                     if not n.startswith("_")]
    for name in names:
        obj = getattr(namespace, name, None)
        if callable(obj) and name not in EXEMPT:
            yield f"{prefix}{name}", obj


def entry_points():
    import types
    out = dict(_public(dtensor, "dtensor."))
    for ns in ("nn", "math", "config", "distribute"):
        out.update(_public(getattr(dtensor, ns), f"dtensor.{ns}."))
    for ns in ("experimental", "cluster_resolver", "coordinator"):
        out.update(_public(getattr(dtensor.distribute, ns), f"dtensor.distribute.{ns}."))
    out.update(_public(dtensor.distribute.experimental.partitioners,
                       "dtensor.distribute.experimental.partitioners."))
    for ns in ("layers", "losses", "metrics", "optimizers", "regularizers", "callbacks"):
        out.update(_public(getattr(dtensor.keras, ns), f"dtensor.keras.{ns}."))
    out.update(_public(dtensor.train, "dtensor.train."))
    for name in ("stateless_uniform", "stateless_normal"):
        out[f"dtensor.random.{name}"] = getattr(dtensor.random, name)
    for name in ("from_tensor_slices", "from_tensors", "range"):
        out[f"dtensor.data.Dataset.{name}"] = getattr(dtensor.data.Dataset, name)
    return {k: v for k, v in sorted(out.items()) if not isinstance(v, types.ModuleType)}


def methods(obj, prefix):
    """The public methods of an object (bound), by name."""
    out = {}
    for name in dir(type(obj)):
        if name.startswith("_") and name not in ("__getitem__", "__add__", "__matmul__",
                                                 "__eq__", "__truediv__", "__pow__"):
            continue
        attr = getattr(type(obj), name)
        if isinstance(attr, property) or not callable(attr):
            continue
        out[f"{prefix}.{name}"] = getattr(obj, name)
    return out


def object_methods(t):
    mesh = t.layout.mesh
    layout = t.layout
    v = dtensor.DVariable(np.zeros((3, 2), np.float32), layout=dtensor.Layout.replicated(mesh, 2))
    ds = dtensor.data.Dataset.from_tensor_slices(np.arange(6, dtype=np.float32))
    strategy = dtensor.MirroredStrategy()
    model = dtensor.keras.Sequential([dtensor.keras.layers.Dense(2, input_shape=(3,))])
    out = {}
    for obj, prefix in ((t, "DTensor"), (layout, "Layout"), (mesh, "Mesh"), (v, "DVariable"),
                        (ds, "Dataset"), (strategy, "MirroredStrategy"), (model, "Sequential"),
                        (dtensor.random.Generator.from_seed(1), "Generator")):
        out.update(methods(obj, prefix))
    for skip in ("DVariable.numpy", "DTensor.numpy", "DTensor.free", "Sequential.summary"):
        out.pop(skip, None)
    return out


def _call_all(t, calls):
    wrong = []
    for name, fn in calls.items():
        for args in [(b,) for b in BAD] + [(t, b) for b in BAD] + [(b, b) for b in BAD]:
            try:
                fn(*args)
            except ALLOWED:
                pass
            except Exception as e:  # noqa: BLE001 (the test's subject)
                wrong.append(f"{name}{tuple(type(a).__name__ for a in args)}: "
                             f"{type(e).__name__}: {e}")
    return wrong


@pytest.fixture
def in_scratch_dir(monkeypatch):
    """A directory every client shares, as the working directory: a bad value that is a valid
    file name ("text") may be written there (save_weights), not into the source tree."""
    import os
    import tempfile
    path = os.path.join(tempfile.gettempdir(), f"dtensor-bad-inputs-{os.getuid()}")
    os.makedirs(path, exist_ok=True)
    monkeypatch.chdir(path)


def test_every_entry_point_refuses_bad_values_cleanly(t, in_scratch_dir):
    calls = entry_points()
    assert len(calls) > 250, sorted(calls)  # the table found the package's entry points
    wrong = _call_all(t, calls)
    assert not wrong, "\n".join(wrong)
    dtensor.barrier()


def test_every_method_refuses_bad_values_cleanly(t, in_scratch_dir):
    calls = object_methods(t)
    assert len(calls) > 80, sorted(calls)
    wrong = _call_all(t, calls)
    assert not wrong, "\n".join(wrong)
    dtensor.barrier()


@pytest.mark.parametrize("call, error, needle", [
    (lambda t: dtensor._dtensor.apply("unary", [t._handle], None, None, False, 2**40),
     ValueError, "1099511627776, outside the range of a C int"),
    (lambda t: dtensor._dtensor.apply("reduce", [t._handle], None, None, False, 0, [2**40], 0),
     ValueError, "list entry 0 is 1099511627776"),
    (lambda t: dtensor.create_mesh([("a", 4.9)]), TypeError, "the size must be an integer"),
    (lambda t: dtensor.matmul(t, None), TypeError, "operand 1"),
    (lambda t: dtensor.relayout(t, None), TypeError, "layout must be a dtensor.Layout"),
    (lambda t: dtensor.relayout(t, "x,y"), TypeError, "layout must be a dtensor.Layout"),
    (lambda t: dtensor.ones([2], layout="x"), TypeError, "layout must be a dtensor.Layout"),
    (lambda t: t.layout.num_shards(5), ValueError, "axis 5 is outside the layout's rank 2"),
    (lambda t: dtensor.concat([], 0), ValueError, "no operands"),
    (lambda t: dtensor.range(0, 5, 0), ValueError, "delta is 0"),
    (lambda t: dtensor.reduce_sum(None), TypeError, "None"),
    (lambda t: t + None, TypeError, "NoneType"),
])
def test_named_bad_inputs(t, call, error, needle):
    with pytest.raises(error) as e:
        call(t)
    assert needle in str(e.value)


def test_numpy_operands_are_converted(t):
    """Arrays where a DTensor is needed are converted (replicated next to it), as TensorFlow
    converts them: no AttributeError."""
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(dtensor.gather(dtensor.matmul(a.T, t)), a.T @ a)
    np.testing.assert_array_equal(dtensor.gather(dtensor.reduce_sum(a, axis=0)), a.sum(0))
    assert dtensor.transpose(a).shape == (2, 3)
