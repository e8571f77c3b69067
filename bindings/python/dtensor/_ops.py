"""How an op runs: the requested layout and default mesh, operands converted as TensorFlow
converts them, symbolic (Keras functional) operands, creation ops and random generators."""

import contextlib as _contextlib
import threading as _threading

import numpy as np

from . import _dtensor as _c
from . import _replicas, _tape
from ._dtypes import _NUMPY, _code, _live
from ._runtime import _current_strategy, _ensure_init, client_id
from ._mesh import Layout, Mesh, _layout_of
from ._tensor import (DTensor, _Variable, _has_numpy, _host_array, _number, _shape_arg, _value,
                      dtensor_from_array)

# ---- ops -------------------------------------------------------------------------------------
#
# Every op is collective (every client calls it in the same order) and returns a DTensor. The
# engine chooses the result's layout by its cost model unless one is requested with
# call_with_layout (a hard constraint, as in TensorFlow). Creation ops need a mesh: they take it
# from the requested layout, else from default_mesh / run_on (replicated).

_state = _threading.local()  # this thread's requested layout, programs shown and trace


# the function being traced on this thread (tf.function, _function.py): the ops record into it

class _Untraceable(Exception):
    """Raised while tracing at a step a traced function cannot record (the function then runs
    as Python)."""


def _tracing():
    return getattr(_state, "trace", None)


def _no_trace(what):
    """Raise _Untraceable for a side effect a trace would perform once, at trace time."""
    if _tracing() is not None:
        raise _Untraceable(what)


def _requested():
    return getattr(_state, "layout", None)


def _show_programs():
    return getattr(_state, "programs", False)


@_contextlib.contextmanager
def show_programs():
    """Print the expanded program of every op run inside this block (on client 0)."""
    old = _show_programs()
    _state.programs = True
    try:
        yield
    finally:
        _state.programs = old


def _result(value, mesh):
    """Wrap a C op result (a handle, or (handle, program) when programs are shown)."""
    if type(value) is tuple:
        value, program = value
        if client_id() == 0:
            print(program, end="")
    t = DTensor.__new__(DTensor)
    dtype, t._shape, text = _c.tensor_meta(value)
    t._handle = value
    t._dtype = _NUMPY[dtype]
    t._layout = _layout_of(text, mesh)
    _live.add(t)
    return t


@_contextlib.contextmanager
def default_mesh(mesh):
    """Inside this block, creation ops without a layout make replicated tensors on ``mesh``
    (tf.experimental.dtensor.default_mesh)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"default_mesh needs a dtensor.Mesh, got {type(mesh).__name__}")
    old = getattr(_state, "mesh", None)
    _state.mesh = mesh
    try:
        yield mesh
    finally:
        _state.mesh = old


run_on = default_mesh  # tf.experimental.dtensor.run_on: the same scope

_host = None  # the host mesh: this client's first CPU device alone


def _host_mesh():
    """A one-device mesh over this client's first CPU device, this client's alone (no other
    client takes part in its ops): where TensorFlow would put a regular tensor."""
    global _host
    if _host is None:
        _ensure_init()
        _host = Mesh(_c.mesh_create_local(["host"], [1], _c.DEVICE_CPU, 0),
                     (_c.global_device_id(_c.DEVICE_CPU, 0),), local=True)
    return _host


def _default_mesh():
    """Where a tensor made without a layout lives, replicated: the dtensor.default_mesh in
    scope; inside strategy.run the replica's device; in a strategy's scope its mesh;
    otherwise (and under the default strategy) the host mesh, as TensorFlow puts a regular
    tensor on the host without a strategy."""
    mesh = getattr(_state, "mesh", None)
    if mesh is not None:
        return mesh
    ctx = _replicas.current()
    if ctx is not None and ctx.strategy._kind != _c.STRATEGY_DEFAULT:
        return ctx.strategy._replica_mesh(ctx._local)
    strategy = _current_strategy()
    if strategy is not None and strategy._kind != _c.STRATEGY_DEFAULT:
        return strategy.mesh
    return _host_mesh()


class _Symbolic:
    """Base of symbolic values an op cannot compute (Keras's functional API's KerasTensor): an
    op given one calls ``_make_node`` on it instead (see _symbolic_aware)."""


class _SymbolicOperand(Exception):
    pass


def _symbolic_aware(fn):
    """fn, or, when an operand is symbolic, the node ``symbolic._make_node(fn, args, kwargs)``
    (a Keras functional model's op layer)."""
    def op(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _SymbolicOperand:
            from ._utilities import _nest_flatten  # noqa: PLC0415 (a later module)
            first = next(v for v in _nest_flatten([list(args), kwargs])
                         if isinstance(v, _Symbolic))
            return first._make_node(fn, args, kwargs)
    op.__name__, op.__qualname__, op.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    op.__wrapped__ = fn
    return op


def _as_tensor(x, what="value", dtype=None):
    """A DTensor of a value: a DTensor (or a variable's value) as it is, anything else
    converted as TensorFlow converts it and replicated on the default mesh; None and other
    objects raise TypeError naming ``what``."""
    if isinstance(x, (DTensor, _Variable)):
        t = _value(x)
        return t if dtype is None or np.dtype(dtype) == t.dtype else cast(t, dtype)
    if isinstance(x, _Symbolic):
        raise _SymbolicOperand()
    a = _host_array(x, dtype, what)
    layout = _requested()
    if layout is None or layout.rank != a.ndim:
        layout = Layout.replicated(_default_mesh(), a.ndim)
    return dtensor_from_array(a, layout)


def _operands(tensors, what):
    """The DTensors an op runs on: variables read, Python values and arrays converted next to
    the first DTensor (on its mesh), or on the default mesh when there is none; a regular
    tensor (on the host mesh) next to DTensors of another mesh is copied there, replicated,
    as TensorFlow broadcasts a regular tensor to a DTensor's mesh."""
    if isinstance(tensors, (DTensor, _Variable)) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{what}: expected a list of tensors, got {type(tensors).__name__}")
    if not tensors:
        raise ValueError(f"{what}: no operands")
    if type(tensors[0]) is DTensor:  # the common case: DTensors of one mesh, as they are
        mesh = tensors[0]._layout._mesh
        for t in tensors:
            if type(t) is not DTensor or t._layout._mesh is not mesh:
                break
        else:
            return tensors
    if any(isinstance(t, _Symbolic) for t in tensors):
        raise _SymbolicOperand()
    like = next((t for t in tensors if isinstance(t, (DTensor, _Variable))), None)
    out = [_value(t) if isinstance(t, (DTensor, _Variable)) else
           _as_dtensor(t, like, f"{what}: operand {i}") if like is not None else
           _as_tensor(t, f"{what}: operand {i}") for i, t in enumerate(tensors)]
    target = next((t.layout.mesh for t in out if t.layout.mesh is not _host), None)
    if target is not None:
        out = [dtensor_from_array(t.numpy(), Layout.replicated(target, t.ndim))
               if t.layout.mesh is _host and t._local_shapes is not None else t for t in out]
    return out


def _create(kind, shape, dtype, layout, a=0.0, b=0.0, seed=0, key=0):
    explicit = layout is not None
    shape = _shape_arg(shape, kind)
    if explicit and not isinstance(layout, Layout):
        raise TypeError(f"{kind}: layout must be a dtensor.Layout, got {type(layout).__name__}")
    layout = layout or _requested() or Layout.replicated(_default_mesh(), len(shape))
    if layout.rank != len(shape) and explicit:
        raise ValueError(f"{kind}: layout {layout._text!r} has rank {layout.rank}, the shape "
                         f"{shape} rank {len(shape)}")
    if layout.rank != len(shape):
        # Inside call_with_layout a composite function may create tensors of other ranks:
        # those are replicated on the requested mesh (the result is relayouted at the end).
        layout = Layout.replicated(layout.mesh, len(shape))
    h = _c.create(kind, layout.mesh._handle, layout._text, _code(dtype), shape,
                  float(a), float(b), int(seed), int(key), _show_programs())
    return _result(h, layout.mesh)


def fill(dims, value, dtype=None, layout=None):
    """tf.fill: ``dims`` filled with ``value``, of value's dtype as TensorFlow converts it
    (a Python int int32, a float float32) unless ``dtype`` is given."""
    if dtype is None:
        dtype = _host_array(value, what="fill: value").dtype
    return _create("fill", dims, dtype, layout, a=_number(value, "fill: value"))


def ones(shape, dtype=np.float32, layout=None):
    return _create("fill", shape, dtype, layout, a=1.0)


def zeros(shape, dtype=np.float32, layout=None):
    return _create("fill", shape, dtype, layout, a=0.0)


def _like(value, tensor, dtype):
    t = _as_tensor(tensor, "zeros_like/ones_like: input")
    layout = Layout(t.layout.sharding_specs, t.layout.mesh)  # pending sums are not kept
    return fill(t.shape, value, t.dtype if dtype is None else dtype, layout=layout)


def zeros_like(input, dtype=None):  # noqa: A002 (tf.zeros_like)
    """Zeros of the tensor's shape, in its layout (and its dtype unless given)."""
    return _like(0.0, input, dtype)


def ones_like(input, dtype=None):  # noqa: A002 (tf.ones_like)
    return _like(1.0, input, dtype)


def is_dtensor(tensor):
    """True for a DTensor or a DVariable."""
    return isinstance(tensor, (DTensor, _Variable))


def cast(x, dtype):
    """tf.cast: the same tensor in another dtype, in its layout: each device converts its own
    component (floats to integers toward zero, to bool as x != 0, to the 16-bit floats rounded
    to nearest even), no communication. Recorded by tapes and traced functions like any op."""
    x = _as_tensor(x, "cast: x")
    code = _code(dtype)
    if np.dtype(dtype) == x.dtype:
        return x
    return _apply("cast", [x], code)


def constant(value, dtype=None, shape=None, name=None, layout=None):
    """tf.constant: a tensor of a Python value or array, converted as TensorFlow converts it
    (a Python float is float32, an int int32; numpy arrays keep their dtype), reshaped to
    ``shape`` or filled with a single value; replicated on the default mesh, or in
    ``layout`` (or the layout of call_with_layout)."""
    a = _host_array(value, dtype, "constant: value")
    if shape is not None:
        shape = _shape_arg(shape, "constant")
        if a.size == 1:
            a = np.full(shape, a.reshape(()), dtype=a.dtype)
        elif a.size == int(np.prod(shape, dtype=np.int64)):
            a = a.reshape(shape)
        else:
            raise ValueError(f"constant: {a.size} values do not fill shape {shape}")
    if layout is not None:
        if not isinstance(layout, Layout):
            raise TypeError(f"constant: layout must be a dtensor.Layout, got "
                            f"{type(layout).__name__}")
        return dtensor_from_array(a, layout)
    return _as_tensor(a, "constant: value")


def identity(input, name=None):  # noqa: A002 (tf.identity)
    """tf.identity: the same value (a Python value or array converted as :func:`constant`)."""
    return _as_tensor(input, "identity: input")


def convert_to_tensor(value, dtype=None, dtype_hint=None, name=None):
    """tf.convert_to_tensor: a DTensor as it is (TypeError when ``dtype`` differs), anything
    else as :func:`constant`."""
    if isinstance(value, (DTensor, _Variable)):
        t = _value(value)
        if dtype is not None and np.dtype(dtype) != t.dtype:
            raise TypeError(f"convert_to_tensor: the tensor is {t.dtype}, {np.dtype(dtype)} "
                            f"was requested")
        return t
    if dtype is None and dtype_hint is not None and not _has_numpy(value):
        try:
            return constant(value, dtype_hint)
        except (TypeError, ValueError):
            pass
    return constant(value, dtype)


def range(start, limit=None, delta=1, dtype=None, layout=None):  # noqa: A001 (tf.range)
    """Like tf.range: [start, limit) by delta, or [0, start) with one argument; without a
    layout, replicated on the default mesh. The dtype, unless given, is TensorFlow's: float32
    when an argument is a float, else int32 (int64 when a bound does not fit)."""
    if limit is None:
        start, limit = 0, start
    bounds = [_number(v, f"range: {n}") for n, v in (("start", start), ("limit", limit),
                                                     ("delta", delta))]
    if bounds[2] == 0:
        raise ValueError("range: delta is 0 (it must not be zero)")
    if dtype is None:
        dtype = _host_array(bounds).dtype
    n = max(0, int(np.ceil((bounds[1] - bounds[0]) / bounds[2])))
    return _create("arange", [n], dtype, layout, a=bounds[0], b=bounds[2])


class _Random:
    """Stateless random ops (tf.random.stateless_*): element i of the global tensor depends on
    (seed, i) alone, whatever the layout, mesh or number of clients."""

    @staticmethod
    def _seed(seed):
        try:
            s = np.asarray(seed, dtype=np.int64).reshape(-1)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"seed must hold 2 64-bit integers, got {seed!r}") from None
        if s.size != 2:
            raise ValueError(f"seed must hold 2 integers, got {seed!r}")
        return int(s[0]) & 0xFFFFFFFFFFFFFFFF, int(s[1]) & 0xFFFFFFFFFFFFFFFF

    def stateless_uniform(self, shape, seed, minval=0, maxval=None, dtype=np.float32,
                          layout=None):
        k0, k1 = self._seed(seed)
        return _create("uniform", shape, dtype, layout, a=minval,
                       b=1.0 if maxval is None else maxval, seed=k0, key=k1)

    def stateless_normal(self, shape, seed, mean=0.0, stddev=1.0, dtype=np.float32,
                         layout=None):
        k0, k1 = self._seed(seed)
        return _create("normal", shape, dtype, layout, a=mean, b=stddev, seed=k0, key=k1)


class Generator:
    """tf.random.Generator over the stateless ops: a seed and a counter; each draw is the
    stateless op with (seed, counter), then the counter moves on, so a run that draws in the
    same order gets the same numbers, and a checkpoint (``dtensor.train.Checkpoint(rng=g)``)
    continues the stream after a restore. Draws are collective like any op."""

    def __init__(self, seed=0, counter=0):
        self._handle = _c.generator_create(int(seed) & 0xFFFFFFFFFFFFFFFF)
        if counter:
            _c.generator_state(self._handle, int(seed) & 0xFFFFFFFFFFFFFFFF, int(counter))
        _live.add(self)

    @classmethod
    def from_seed(cls, seed):
        return cls(seed)

    @property
    def state(self):
        """(seed, counter): the counter is the key of the next draw."""
        return _c.generator_state(self._handle)

    def reset_from_seed(self, seed):
        _c.generator_state(self._handle, int(seed) & 0xFFFFFFFFFFFFFFFF, 0)

    def _draw(self, kind, shape, a, b, dtype, layout):
        shape = _shape_arg(shape, f"Generator.{kind}")
        if layout is not None and not isinstance(layout, Layout):
            raise TypeError(f"Generator.{kind}: layout must be a dtensor.Layout, got "
                            f"{type(layout).__name__}")
        layout = layout or _requested() or Layout.replicated(_default_mesh(), len(shape))
        h = _c.generator_draw(self._handle, kind, layout.mesh._handle, layout._text,
                              _code(dtype), shape, _number(a, f"Generator.{kind}"),
                              _number(b, f"Generator.{kind}"), _show_programs())
        return _result(h, layout.mesh)

    def uniform(self, shape, minval=0, maxval=None, dtype=np.float32, layout=None):
        return self._draw("uniform", shape, minval, 1.0 if maxval is None else maxval, dtype,
                          layout)

    def normal(self, shape, mean=0.0, stddev=1.0, dtype=np.float32, layout=None):
        return self._draw("normal", shape, mean, stddev, dtype, layout)


_Random.Generator = Generator
random = _Random()


def _op(op, tensors, mesh, mesh_handle, text, *attrs):
    """Run one op on DTensors (its result on ``mesh``); active GradientTapes record it. While
    a function is traced, concrete operands are captured as its inputs."""
    trace = _tracing()
    if trace is not None:
        tensors = [trace.symbolic(t) for t in tensors]
    h = _c.apply(op, [t._handle for t in tensors], mesh_handle, text, _show_programs(), *attrs)
    out = _result(h, mesh)
    if _tape._tapes():
        _tape.record(op, tensors, mesh_handle, text, attrs, out)
    return out


def _apply(op, tensors, *attrs):
    tensors = _operands(tensors, op)
    mesh = tensors[0]._layout._mesh
    requested = getattr(_state, "layout", None)
    if requested is not None and requested._mesh is mesh:
        return _op(op, tensors, mesh, mesh._handle, requested._text, *attrs)
    return _op(op, tensors, mesh, None, None, *attrs)


def _as_dtensor(x, like, what="operand"):
    """Scalars and arrays next to a DTensor become replicated DTensors on its mesh (Python
    scalars take the DTensor's dtype, as TensorFlow's; numpy arrays keep theirs). None and
    other objects raise TypeError."""
    if isinstance(x, (DTensor, _Variable)):
        return _value(x)
    if isinstance(x, _Symbolic) or isinstance(like, _Symbolic):
        raise _SymbolicOperand()
    like = _value(like)
    a = _host_array(x, None if isinstance(x, np.ndarray) else like.dtype, what)
    rep = Layout.replicated(like.layout.mesh, a.ndim)
    if a.ndim == 0:
        return _create("fill", [], a.dtype, rep, a=float(a))
    return dtensor_from_array(a, rep)
