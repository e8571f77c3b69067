"""DVariable: a DTensor that can be assigned (tf.experimental.dtensor.DVariable, tf.Variable)."""

import builtins as _builtins

import numpy as np

from . import _dtensor as _c
from . import _replicas, _tape
from ._dtensor import DTensorError
from ._dtypes import _live, _raw
from ._runtime import _current_strategy
from ._mesh import Layout
from ._tensor import DTensor, _Variable, _host_array, _mesh_device, _value, dtensor_from_array
from ._ops import _default_mesh, _no_trace, _state, _tracing, cast
from ._array_ops import copy_to_mesh, relayout

# ---- variables -------------------------------------------------------------------------------


class DVariable(_Variable):
    """A variable whose layout is fixed at creation (tf.experimental.dtensor.DVariable), used as
    a tf.Variable: operators, ``value()``, ``read_value()``, ``assign*``, ``numpy()``.

    ``initial_value``: a DTensor (relayouted to ``layout`` when one is given), or a numpy value
    or Python number (or a callable returning one) placed in ``layout``, or replicated on the
    ``default_mesh``. Assigning a value of another layout raises; relayout it first. Creation,
    reads and assignments are collective."""

    def __init__(self, initial_value=None, trainable=True, name=None, dtype=None, layout=None):
        if callable(initial_value):
            initial_value = initial_value()
        if layout is not None and not isinstance(layout, Layout):
            raise TypeError(f"DVariable: layout must be a dtensor.Layout, got "
                            f"{type(layout).__name__}")
        strategy = _current_strategy()
        self._strategy = None  # the strategy whose scope placed it (its replicas print)
        self._scope = strategy  # the strategy in scope at creation (extended's query)
        if isinstance(initial_value, (DTensor, DVariable)):
            value = _value(initial_value)
            if dtype is not None and np.dtype(dtype) != value.dtype:
                value = cast(value, dtype)
            if layout is not None and value.layout != layout:
                value = relayout(value, layout)
        else:
            # Python values as TensorFlow converts them (1. is float32, 1 int32)
            a = _host_array(initial_value, dtype, "DVariable: initial_value")
            if layout is None and getattr(_state, "mesh", None) is None and \
                    strategy is not None and strategy._kind != _c.STRATEGY_DEFAULT:
                layout = strategy.variable_layout(a.ndim)  # as tf.Variable in the scope
                self._strategy = strategy
            if layout is None:
                layout = Layout.replicated(_default_mesh(), a.ndim)
            value = dtensor_from_array(a, layout)
        self._handle = _c.variable_create(value._handle)
        self._layout = value.layout
        self._shape, self._dtype = value.shape, value.dtype
        self.trainable = trainable
        self.name = name or "Variable"
        self._version = 0  # bumped by every update: replicas' cached copies go stale
        self._replicas = {}  # (mesh serial, replica) -> (version, DTensor on its device)
        _live.add(self)

    @property
    def layout(self):
        return self._layout

    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        return self._dtype

    @property
    def ndim(self):
        return len(self._shape)

    def read_value(self):
        """A copy of the current value (collective); inside ``strategy.run``, the replica's
        own copy, on its device."""
        ctx = _replicas.current()
        if ctx is None and _tracing() is not None:  # a traced read: bound at each run
            return _tracing().variable(self)
        if ctx is not None:
            t = ctx.strategy._variable_replica(self, ctx._local)
        else:
            t = DTensor(_c.variable_read(self._handle), self._layout)
        if _tape._tapes():
            _tape.note_read(self, t)
        return t

    value = read_value

    def numpy(self):
        """The value when fully replicated; raises for a sharded variable (as DTensor.numpy)."""
        return self.read_value().numpy()

    def __array__(self, dtype=None, copy=None):
        return self.read_value().__array__(dtype)

    def _assign(self, value, mode):
        """A DTensor must have the variable's layout (a regular tensor, on this client's host
        mesh, is copied into it); a numpy value or number is placed in it (broadcast to the
        variable's shape)."""
        _no_trace(f"assigning variable {self.name!r}")
        if _replicas.current() is not None:
            raise DTensorError(
                f"variable {self.name!r}: assigning a mirrored variable inside strategy.run "
                f"would leave its replicas different; update it with "
                f"optimizer.apply_gradients or in ReplicaContext.merge_call")
        if not isinstance(value, (DTensor, DVariable)):
            a = _host_array(value, self._dtype, f"variable {self.name!r}: value")
            try:
                a = np.broadcast_to(a, self._shape)
            except ValueError:
                raise ValueError(f"variable {self.name!r} of shape {self._shape}: a value of "
                                 f"shape {a.shape} does not fit") from None
            value = dtensor_from_array(a, self._layout)
        value = _value(value)
        if value.layout.mesh is not self._layout.mesh and value.layout.mesh._local:
            value = copy_to_mesh(value, self._layout)  # a regular tensor goes where it is used
        _c.variable_assign(self._handle, value._handle, mode)
        self._version += 1
        return self

    def assign(self, value):
        return self._assign(value, 0)

    def assign_add(self, delta):
        return self._assign(delta, 1)

    def assign_sub(self, delta):
        return self._assign(delta, 2)

    @property
    def device(self):
        """TensorFlow's name of the device of its (first local) copy; inside strategy.run, of
        the replica's."""
        ctx = _replicas.current()
        if ctx is not None and ctx.strategy._kind != _c.STRATEGY_DEFAULT:
            return _mesh_device(ctx.strategy._replica_mesh(ctx._local))
        return _mesh_device(self._layout.mesh)

    @property
    def handle(self):
        """The variable's resource (TensorFlow's ``handle``): what it prints names the
        variable, its layout and its mesh."""
        return _VariableHandle(self)

    def _local_value(self, i=0):
        """Local copy i of a fully replicated variable, read on this client alone."""
        a = np.empty(self._shape, dtype=self._dtype)
        _c.tensor_to_host(self._handle, i, _raw(a))
        return a

    def _describe(self, name, value):
        layout = "" if self._layout.is_fully_replicated() else \
            f" layout={self._layout._text!r}"
        shown = "" if value is None else ", numpy=" + (
            str(value[()]) if value.ndim == 0 else
            "\n" + np.array_repr(value))
        return (f"<dtensor.Variable '{name}:0' shape={self.shape} dtype={self._dtype.name}"
                f"{layout}{shown}>")

    def __repr__(self):
        """TensorFlow's form, ``<dtensor.Variable 'Variable:0' shape=() dtype=float32,
        numpy=1.0>``, its value read on this client when it is replicated (never collective:
        a sharded variable shows its layout instead). A variable made in a mirrored
        strategy's scope shows this client's replicas, as TensorFlow's MirroredVariable."""
        from ._ps import PSVariable  # noqa: PLC0415 (a later module)
        readable = self._layout.is_fully_replicated() and \
            bool(self._layout.mesh.local_device_ids()) and not isinstance(self, PSVariable)
        s = self._strategy
        if readable and s is not None and s._kind in (_c.STRATEGY_MIRRORED,
                                                      _c.STRATEGY_MULTI_WORKER_MIRRORED):
            parts = [f"  {i}: " + self._describe(
                self.name if i == 0 else f"{self.name}/replica_{i}", self._local_value(i))
                for i in _builtins.range(len(self._layout.mesh.local_device_ids()))]
            return "MirroredVariable:{\n" + ",\n".join(parts) + "\n}"
        return self._describe(self.name, self._local_value() if readable else None)

    __str__ = __repr__


class _VariableHandle:
    """DVariable.handle: the variable's resource."""

    def __init__(self, variable):
        self._variable = variable

    def __repr__(self):
        v = self._variable
        return (f"<dtensor.Variable handle '{v.name}' shape={v.shape} dtype={v.dtype.name} "
                f"layout={v.layout.to_string()!r}>")


def _install_variable_operators():
    """A DVariable in an expression reads as its value (a DTensor), as a tf.Variable does."""
    names = ["__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
             "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
             "__rpow__", "__matmul__", "__rmatmul__", "__lt__", "__le__", "__gt__", "__ge__",
             "__neg__", "__abs__", "__getitem__", "__len__"]
    for name in names:
        setattr(DVariable, name,
                lambda self, *args, name=name: getattr(self.read_value(), name)(*args))
    def compare(name):
        return lambda self, other: getattr(self.read_value(), name)(other)
    for name in ["__eq__", "__ne__"]:
        setattr(DVariable, name, compare(name))
    DVariable.__bool__ = lambda self: bool(self.read_value())
    DVariable.__hash__ = object.__hash__
    DVariable.T = property(lambda self: self.read_value().T)


_install_variable_operators()
