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
