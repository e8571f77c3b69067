"""Shape and index ops (gather, one_hot, einsum, stack, split, pad, tile, ...), relayout and
call_with_layout, and DTensor's Python operators."""

import builtins as _builtins

import numpy as np

from . import errors
from ._dtypes import _code
from ._mesh import Layout, _layout_arg
from ._tensor import DTensor, _Variable, _host_array, _shape_arg, _value, dtensor_from_array
from ._ops import _apply, _as_dtensor, _as_tensor, _default_mesh, _op, _requested, _state
from ._math_ops import (abs, add, concat, equal, floordiv, floormod, greater, greater_equal, less,
                        less_equal, logical_and, logical_not, logical_or, logical_xor, matmul,
                        multiply, neg, not_equal, pow, slice, subtract, truediv)

# ---- shape and index ops ---------------------------------------------------------------------


def _int_dtensor(x, like, what):
    """Integer ids or indices: a DTensor as it is; arrays and lists become replicated DTensors on
    like's mesh (int32, or int64 when given so)."""
    if isinstance(x, (DTensor, _Variable)):
        return _value(x)
    a = _host_array(x, what=what)
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{what} must be integers, got {a.dtype}")
    a = a.astype(np.int64 if a.dtype == np.int64 else np.int32)
    mesh = like.layout.mesh if like is not None else _default_mesh()
    return dtensor_from_array(a, Layout.replicated(mesh, a.ndim))


def gather_rows(params, indices):
    """Rows of ``params`` [V, d...] by integer ``indices`` of any shape (tf.gather along axis 0;
    ``dtensor.gather`` is the explicit gather of a tensor to the host): the result has shape
    indices.shape + d. An index outside [0, V) gives a row of zeros. With V sharded over a mesh
    axis each device looks up the rows it owns and one all-reduce sums them (a
    vocabulary-parallel embedding, as Megatron-LM's)."""
    params = _as_tensor(params, "gather_rows: params")
    return _apply("gather", [params, _int_dtensor(indices, params, "gather_rows: indices")])


take = gather_rows


def embedding_lookup(params, ids, max_norm=None, name=None):
    """tf.nn.embedding_lookup of one (possibly vocabulary-sharded) table: ``gather_rows``."""
    if max_norm is not None:
        raise errors.UnimplementedError("embedding_lookup: max_norm is not supported")
    if isinstance(params, (list, tuple)):
        if len(params) != 1:
            raise errors.UnimplementedError("embedding_lookup: a list of tables (shard the table's "
                                      "first axis over a mesh axis instead)")
        params = params[0]
    return gather_rows(params, ids)


def unsorted_segment_sum(data, segment_ids, num_segments):
    """tf.math.unsorted_segment_sum: out[s] = sum of data[i...] over segment_ids[i...] == s
    (segment_ids of data's leading shape; ids outside [0, num_segments) add nothing)."""
    data = _as_tensor(data, "unsorted_segment_sum: data")
    ids = _int_dtensor(segment_ids, data, "unsorted_segment_sum: segment_ids")
    return _apply("unsorted_segment_sum", [data, ids], int(num_segments))


def one_hot(indices, depth, on_value=None, off_value=None, axis=None, dtype=None):
    """tf.one_hot: a depth axis at ``axis`` (-1: last), on_value where the index equals the
    position (float32 1 and 0 by default; the dtype of on_value when given); indices outside
    [0, depth) give off_value only. A depth axis requested sharded (call_with_layout) is
    written by each device from its global offset, without communication."""
    if dtype is None:  # TensorFlow's rule: the dtype of on_value (or off_value), else float32
        given = on_value if on_value is not None else off_value
        dtype = np.float32 if given is None or isinstance(given, float) else \
            np.bool_ if isinstance(given, bool) else \
            np.int32 if isinstance(given, int) else np.asarray(given).dtype
    indices = _int_dtensor(indices, None, "one_hot: indices")
    on = 1.0 if on_value is None else float(on_value)
    off = 0.0 if off_value is None else float(off_value)
    return _apply("one_hot", [indices], int(depth), -1 if axis is None else int(axis),
                  _code(dtype), on, off)


def einsum(equation, *inputs, **kwargs):
    """tf.einsum of one or two operands ("bsh,hd->bsd", "ij->ji", "...ij,...jk->...ik", an
    implicit output): one batched GEMM of the local shards with a mesh axis per label chosen by
    the cost model; contracted labels split over a mesh axis are all-reduced (or
    reduce-scattered into a requested layout)."""
    if kwargs:
        raise TypeError(f"einsum: unexpected arguments {sorted(kwargs)}")
    if len(inputs) == 1 and isinstance(inputs[0], (list, tuple)):
        inputs = tuple(inputs[0])
    if not 1 <= len(inputs) <= 2:
        raise errors.UnimplementedError(f"einsum of {len(inputs)} operands (1 or 2 are supported)")
    like = next((_value(v) for v in inputs if isinstance(v, (DTensor, _Variable))), None)
    if like is None:
        like = _as_tensor(inputs[0], "einsum: operand 0")
    ops = [_as_dtensor(v, like, f"einsum: operand {i}") for i, v in enumerate(inputs)]
    return _apply("einsum", ops, str(equation))


def stack(values, axis=0):
    """tf.stack: tensors of one shape joined along a new axis (block exchanges, no gather)."""
    if isinstance(values, (DTensor, _Variable)) or not isinstance(values, (list, tuple)):
        raise TypeError(f"stack: expected a list of tensors, got {type(values).__name__}")
    if not values:
        raise ValueError("stack: the list of values is empty")
    like = next((_value(v) for v in values if isinstance(v, (DTensor, _Variable))), None)
    if like is None:
        like = _as_tensor(values[0], "stack: values[0]")
    values = [_as_dtensor(v, like, f"stack: values[{i}]") for i, v in enumerate(values)]
    axis = int(axis)
    if len(values) <= 16:
        return _apply("stack", values, axis)
    # more than the op's 16 operands: stack in groups, then join them
    ax = axis + like.ndim + 1 if axis < 0 else axis
    parts = [_apply("stack", values[i:i + 16], ax) for i in _builtins.range(0, len(values), 16)]
    return concat(parts, ax)


def split(value, num_or_size_splits, axis=0, num=None):
    """tf.split: a list of pieces along ``axis``: num_or_size_splits equal pieces, or pieces of
    the listed sizes (one may be -1: the rest). Each piece is one slice op."""
    value = _as_tensor(value, "split: value")
    axis = int(axis)
    ax = axis + value.ndim if axis < 0 else axis
    if not 0 <= ax < value.ndim:
        raise ValueError(f"split: axis {axis} is outside a tensor of rank {value.ndim}")
    n = value.shape[ax]
    if isinstance(num_or_size_splits, (int, np.integer)):
        k = int(num_or_size_splits)
        if k < 1 or n % k:
            raise ValueError(f"split: axis {axis} of extent {n} does not split into {k} equal "
                             f"pieces")
        sizes = [n // k] * k
    else:
        sizes = [int(v) for v in num_or_size_splits]
        if sizes.count(-1) > 1:
            raise ValueError("split: at most one size may be -1")
        if -1 in sizes:
            sizes[sizes.index(-1)] = n - (sum(sizes) + 1)
        if any(v < 0 for v in sizes) or sum(sizes) != n:
            raise ValueError(f"split: sizes {list(num_or_size_splits)} do not add up to the "
                             f"extent {n} of axis {axis}")
    out, at = [], 0
    for size in sizes:
        begin = [0] * value.ndim
        shape = list(value.shape)
        begin[ax], shape[ax] = at, size
        out.append(slice(value, begin, shape))
        at += size
    return out


def pad(tensor, paddings, mode="CONSTANT", constant_values=0, name=None):
    """tf.pad in CONSTANT mode: paddings [[before, after], ...] per axis. Each device fills its
    shard with the constant and receives the elements of the tensor inside it."""
    if str(mode).upper() != "CONSTANT":
        raise errors.UnimplementedError(f"pad: mode {mode!r} (only CONSTANT is supported)")
    t = _as_tensor(tensor, "pad: tensor")
    p = np.asarray(paddings, dtype=np.int64).reshape(-1, 2) if np.size(paddings) else \
        np.zeros((0, 2), np.int64)
    if p.shape[0] != t.ndim:
        raise ValueError(f"pad: {p.shape[0]} paddings for a tensor of rank {t.ndim}")
    return _apply("pad", [t], [int(v) for v in p[:, 0]], [int(v) for v in p[:, 1]],
                  float(constant_values))


def tile(input, multiples):  # noqa: A002 (tf.tile)
    """tf.tile: the tensor repeated multiples[i] times along each axis."""
    t = _as_tensor(input, "tile: input")
    m = [int(v) for v in np.asarray(multiples).reshape(-1)]
    if len(m) != t.ndim:
        raise ValueError(f"tile: {len(m)} multiples for a tensor of rank {t.ndim}")
    return _apply("tile", [t], m)


def broadcast_to(input, shape):  # noqa: A002 (tf.broadcast_to)
    """tf.broadcast_to: stretched to ``shape`` as numpy broadcasts; the sharding of the axes the
    tensor spans stays, each device broadcasts its own shard."""
    return _apply("broadcast_to", [_as_tensor(input, "broadcast_to: input")],
                  _shape_arg(shape, "broadcast_to"))


def expand_dims(input, axis):  # noqa: A002 (tf.expand_dims)
    """tf.expand_dims: an unsharded axis of extent 1 at ``axis`` (metadata only)."""
    return _apply("expand_dims", [_as_tensor(input, "expand_dims: input")], int(axis))


def squeeze(input, axis=None):  # noqa: A002 (tf.squeeze)
    """tf.squeeze: the named axes of extent 1 removed, or all of them (metadata only)."""
    axes = [] if axis is None else \
        [int(a) for a in (axis if isinstance(axis, (list, tuple)) else [axis])]
    return _apply("squeeze", [_as_tensor(input, "squeeze: input")], axes)


def relayout(tensor, layout):
    """The same global tensor in ``layout`` (the minimal transition per mesh axis)."""
    layout = _layout_arg(layout, "relayout")
    t = _as_tensor(tensor, "relayout: tensor")
    if t.layout.mesh is not layout.mesh and t.layout.mesh._local:
        return copy_to_mesh(t, layout)  # a regular tensor: placed as copy_to_mesh does
    return _op("relayout", [t], layout.mesh, layout.mesh._handle, layout._text)


def copy_to_mesh(tensor, layout, source_layout=None):
    """The same global tensor on another mesh (over the same devices, or any devices when the
    tensor is replicated), in ``layout``. A Python value, a numpy array or a regular tensor
    (on the default mesh, a replica's device) is copied from the host: every client passes the
    same value, as tf.experimental.dtensor.copy_to_mesh of a regular tensor."""
    layout = _layout_arg(layout, "copy_to_mesh")
    if not isinstance(tensor, (DTensor, _Variable)) or _value(tensor).layout.mesh._local or \
            (layout.mesh._local and _value(tensor).layout.is_fully_replicated()):
        # from or to a mesh of this client's alone: through the host
        return dtensor_from_array(_host_array(tensor, what="copy_to_mesh: tensor"), layout)
    return _op("copy_to_mesh", [_value(tensor)], layout.mesh, layout.mesh._handle, layout._text)


def call_with_layout(fn, layout, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` so that its result has ``layout`` (as TensorFlow's): creation
    ops inside it make their tensors directly in that layout (no full tensor is built first)
    and ops whose result is requested take it as a hard constraint."""
    layout = _layout_arg(layout, "call_with_layout")
    if not callable(fn):
        raise TypeError(f"call_with_layout: fn must be callable, got {type(fn).__name__}")
    old = _requested()
    _state.layout = layout
    try:
        result = fn(*args, **kwargs)
    finally:
        _state.layout = old
    if isinstance(result, DTensor) and result.layout != layout:
        result = relayout(result, layout)
    return result


def _install_operators():
    ops = {
        "__add__": add, "__sub__": subtract, "__mul__": multiply, "__truediv__": truediv,
        "__floordiv__": floordiv, "__mod__": floormod, "__pow__": pow, "__matmul__": matmul,
        "__lt__": less, "__le__": less_equal, "__gt__": greater, "__ge__": greater_equal,
    }
    for name, fn in ops.items():
        setattr(DTensor, name, lambda self, other, fn=fn: fn(self, other))
    for name, fn in {"__radd__": add, "__rsub__": subtract, "__rmul__": multiply,
                     "__rtruediv__": truediv, "__rfloordiv__": floordiv, "__rmod__": floormod,
                     "__rpow__": pow, "__rmatmul__": matmul}.items():
        setattr(DTensor, name, lambda self, other, fn=fn: fn(_as_dtensor(other, self), self))
    # == and != compare values elementwise, as TensorFlow's (a one-element result works in
    # `if` and `assert` through __bool__); other objects (None, strings) compare unequal
    def compare(fn):
        def op(self, other):
            if not isinstance(other, (DTensor, _Variable, int, float, bool, np.ndarray,
                                      np.generic, list, tuple)):
                return NotImplemented
            return fn(self, other)
        return op
    DTensor.__eq__ = compare(equal)
    DTensor.__ne__ = compare(not_equal)
    DTensor.__neg__ = lambda self: neg(self)
    DTensor.__abs__ = lambda self: abs(self)
    # &, |, ^ and ~ are the logical ops, as on TensorFlow's bool tensors
    for name, fn in {"__and__": logical_and, "__or__": logical_or, "__xor__": logical_xor}.items():
        setattr(DTensor, name, lambda self, other, fn=fn: fn(self, other))
        setattr(DTensor, "__r" + name[2:], lambda self, other, fn=fn: fn(other, self))
    DTensor.__invert__ = lambda self: logical_not(self)


_install_operators()
