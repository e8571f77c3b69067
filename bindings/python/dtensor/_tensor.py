"""The DTensor class and its conversions: host values (Python numbers, arrays and tensors as
TensorFlow converts them), numpy arrays and components to DTensors (pack, from_dlpack) and
back (unpack, gather, local_components), DLPack capsules; and the base of DVariable that the
modules loaded before it test values against."""

import builtins as _builtins

import numpy as np

from . import _dtensor as _c
from . import errors
from ._dtensor import DTensorError
from ._dtypes import TensorShape, UNSHARDED, _DTYPES, _NUMPY, _code, _live, _raw, bfloat16
from ._runtime import _DEVICE_TYPES, _agree, _device_name, client_id, num_clients
from ._mesh import Layout, _layout_arg, _layout_of

# ---- tensors ---------------------------------------------------------------------------------


class _OutOfRange(errors.InvalidArgumentError, IndexError):
    """An index outside a tensor: TensorFlow's InvalidArgumentError, and an IndexError as
    Python's sequences raise."""


class _Variable:
    """The base of DVariable (_variables.py): what the modules loaded before it test values
    against (``isinstance(x, (DTensor, _Variable))``)."""


class DTensor:
    """A global tensor: shape, dtype, layout and one component per local device."""

    def __init__(self, handle, layout):
        dtype, shape, text = _c.tensor_meta(handle)
        self._handle = handle
        self._shape = shape
        self._dtype = _NUMPY[dtype]
        self._layout = layout if layout._text == text else \
            _layout_of(text, layout.mesh)
        _live.add(self)

    @property
    def _local_shapes(self):
        """Shapes of this client's components; None for a symbolic tensor (recorded in a
        function being traced), which holds no shards."""
        shapes = _c.tensor_info(self._handle)["local_shapes"]
        return None if shapes is None else [tuple(s) for s in shapes]

    @property
    def shape(self):
        return TensorShape(self._shape)

    @property
    def dtype(self):
        return self._dtype

    @property
    def ndim(self):
        return len(self._shape)

    @property
    def layout(self):
        return self._layout

    @property
    def device(self):
        """TensorFlow's name of the device holding it when its mesh is one device (a replica's
        value, a tensor on the default mesh), else of this client's first device of the mesh
        (None when it has none)."""
        return _mesh_device(self._layout.mesh)

    def ref(self):
        """A hashable reference (TensorFlow's ``Tensor.ref()``); DTensors hash by identity
        anyway, ``==`` compares values."""
        return _Ref(self)

    def numpy(self):
        """The value, when it is fully replicated (as TensorFlow); a sharded tensor raises
        errors.UnimplementedError (use :func:`gather`, an explicit, collective gather)."""
        if not self._layout.is_fully_replicated():
            raise errors.UnimplementedError(
                f"numpy() needs a fully replicated DTensor, this one has layout "
                f"{self._layout._text!r}: use dtensor.gather(t) or dtensor.unpack(t)")
        out = np.empty(self._shape, dtype=self._dtype)
        _c.tensor_to_host(self._handle, 0, _raw(out))
        return out

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack of this client's one component (a DTensor on one local device, as each
        replica's value in strategy.run): no copy. Several components: local_components."""
        return self._one_component().__dlpack__(stream)

    def __dlpack_device__(self):
        return self._one_component().__dlpack_device__()

    def _one_component(self):
        comps = local_components(self)
        if len(comps) != 1:
            raise DTensorError(f"__dlpack__ needs a DTensor with one component on this client, "
                               f"this one has {len(comps)}: use dtensor.local_components(t)")
        return comps[0]

    def __float__(self):
        """A replicated one-element tensor as a Python float (tf's float(t))."""
        if int(np.prod(self._shape)) != 1:
            raise TypeError(f"float() needs a one-element DTensor, this one has shape "
                            f"{self._shape}")
        return float(_read(self).reshape(()))

    def __int__(self):
        return int(float(self))

    def __index__(self):
        """An integer one-element tensor as a Python int (indexing, range())."""
        if not np.issubdtype(self._dtype, np.integer) or int(np.prod(self._shape)) != 1:
            raise TypeError(f"only a one-element integer DTensor is an index, this one has "
                            f"shape {self._shape} and dtype {self._dtype}")
        return int(_read(self).reshape(()))

    def __bool__(self):
        """The truth of a one-element tensor, as TensorFlow's eager tensors (``if t == 15:``,
        ``assert t == 15``); more elements are ambiguous (ValueError). A sharded one-element
        tensor is gathered, so every client must ask alike."""
        if int(np.prod(self._shape)) != 1:
            raise ValueError(f"the truth value of a DTensor of shape {self._shape} is "
                             f"ambiguous: use dtensor.reduce_all / reduce_any, or numpy()")
        return bool(_read(self).reshape(()))

    __hash__ = object.__hash__  # identity, so DTensors stay usable as dict keys

    def __format__(self, spec):
        return format(float(self), spec) if spec else str(self)

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def free(self):
        """Release the device memory now (otherwise when garbage collected)."""
        self._handle.free()

    @property
    def T(self):  # noqa: N802 (numpy's name)
        from ._math_ops import transpose  # noqa: PLC0415 (a later module)
        return transpose(self)

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of a scalar DTensor")
        return self._shape[0]

    def __iter__(self):
        """The slices along the first axis, as iterating a TensorFlow tensor."""
        for i in _builtins.range(len(self)):
            yield self[i]

    def __getitem__(self, key):
        """Integers and slices of step 1 per axis, through the slice op (an integer drops its
        axis, as numpy and TensorFlow); None (np.newaxis) inserts an axis of extent 1 there
        (expand_dims)."""
        from ._math_ops import reshape, slice  # noqa: PLC0415 (later modules)
        from ._array_ops import expand_dims, relayout  # noqa: PLC0415 (later modules)
        key = key if isinstance(key, tuple) else (key,)
        if any(k is None for k in key):
            out = self[tuple(k for k in key if k is not None)]
            at = 0  # the result axis each key element lands on
            for k in key:
                if k is None:
                    out = expand_dims(out, at)
                    at += 1
                elif not isinstance(k, (int, np.integer)) or isinstance(k, bool):
                    at += 1
            return out
        if len(key) > len(self._shape):
            raise _OutOfRange(f"{len(key)} indices for a tensor of rank {len(self._shape)}")
        begin, size, keep = [], [], []
        for axis, n in enumerate(self._shape):
            k = key[axis] if axis < len(key) else _builtins.slice(None)
            if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                i = int(k) + n if k < 0 else int(k)
                if not 0 <= i < n:
                    raise _OutOfRange(f"index {int(k)} is out of range for axis {axis} of "
                                     f"extent {n}")
                begin.append(i)
                size.append(1)
            elif isinstance(k, _builtins.slice):
                start, stop, step = k.indices(n)
                if step != 1:
                    raise ValueError(f"slice {k} of axis {axis}: only step 1 is supported")
                begin.append(start)
                size.append(max(0, stop - start))
                keep.append(axis)
            else:
                raise TypeError(f"index {k!r} of axis {axis}: only integers and slices")
        out = slice(self, begin, size)
        if len(keep) < len(self._shape):
            # the dropped axes (extent 1) unsharded first: reshape keeps the others' sharding
            specs = [s if a in keep else UNSHARDED
                     for a, s in enumerate(out.layout.sharding_specs)]
            out = reshape(relayout(out, Layout(specs, out.layout.mesh)),
                          [size[a] for a in keep])
        return out

    def _format(self, values):
        return (f"DTensor({np.array2string(values, separator=', ')}, "
                f"layout={self._layout._text!r}, shape={self._shape}, dtype={self._dtype})")

    def __str__(self):
        """The values: read locally when fully replicated, else gathered, so that printing a
        sharded DTensor is collective (every client prints it), an explicit request as
        dtensor.gather is; a symbolic tensor shows its metadata."""
        if self._local_shapes is None:
            return repr(self)
        return self._format(_read(self))

    def __repr__(self):
        """The values when this client can read them alone (fully replicated); otherwise the
        metadata (repr is never collective: use print or dtensor.gather for the values)."""
        if self._local_shapes is not None and self._layout.is_fully_replicated():
            return self._format(self.numpy())
        return (f"DTensor(shape={list(self._shape)}, dtype={self._dtype}, "
                f"layout={self._layout._text!r}, mesh={self._layout.mesh})")


def _read(t):
    """The value of a DTensor on this client, the same way on every client: read locally when
    it is replicated and every client holds a copy (a mesh of this client's alone, or one
    over devices of every client), else gathered (collective, every client alike)."""
    mesh = t._layout.mesh
    if t._layout.is_fully_replicated() and (mesh._local or _on_every_client(mesh)):
        return t.numpy()
    return gather(t)


def _on_every_client(mesh):
    """Whether every client owns a device of the mesh (the same answer on every client: each
    client holds the same number of devices, one block of the global ids)."""
    code = _DEVICE_TYPES[mesh.device_type()]
    per = _c.runtime_info()["local_" + ("cpu" if code == _c.DEVICE_CPU else "cuda")]
    first = _c.global_device_id(code, 0) - client_id() * per
    owners = {(d - first) // per for d in mesh._device_ids} if per else set()
    return len(owners) == num_clients()


# ---- host values: numbers, arrays and DTensors as TensorFlow converts them -------------------


def _value(x):
    """A DVariable's current value; anything else as it is."""
    return x.value() if isinstance(x, _Variable) else x


def _has_numpy(x):
    """Whether a (nested) value holds numpy arrays or scalars, whose dtypes are kept."""
    if isinstance(x, (np.ndarray, np.generic)):
        return True
    if isinstance(x, (list, tuple)):
        return any(_has_numpy(v) for v in x)
    return False


def _host_array(value, dtype=None, what="value"):
    """A numpy array of a value as TensorFlow converts it (tf.constant): numpy arrays and
    scalars keep their dtype; Python floats become float32, Python ints int32 (int64 when one
    does not fit), bools bool; a DTensor its value. TypeError for what is not a number or a
    (nested) list of them."""
    if isinstance(value, (DTensor, _Variable)):
        t = _value(value)
        a = _read(t)
        return a if dtype is None else a.astype(np.dtype(dtype))
    if value is None or isinstance(value, (str, bytes, dict)):
        raise TypeError(f"{what}: expected a number, an array or a DTensor, got "
                        f"{type(value).__name__}")
    try:
        if dtype is not None:
            return np.asarray(value, dtype=np.dtype(dtype))
        a = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"{what}: cannot convert {type(value).__name__} to an array: {e}") \
            from None
    if a.dtype == object or (a.dtype.kind in "USVc" and a.dtype not in _DTYPES):
        raise TypeError(f"{what}: cannot convert {type(value).__name__} of {a.dtype} to a "
                        f"tensor of numbers")
    if not _has_numpy(value):
        if a.dtype == np.float64:
            a = a.astype(np.float32)
        elif a.dtype.kind in "iu":
            fits = a.size == 0 or (a.min() >= -2**31 and a.max() < 2**31)
            a = a.astype(np.int32 if fits else np.int64)
    return a


def _number(value, what):
    """A Python number of a number, a numpy scalar or a one-element tensor; TypeError else."""
    if isinstance(value, (DTensor, _Variable)):
        value = _host_array(value, what=what)
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(())[()]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    raise TypeError(f"{what}: expected a number, got {type(value).__name__}")


def _shape_arg(shape, what):
    """A list of non-negative ints of a shape (a list, tuple, TensorShape, 1-D integer array
    or DTensor); TypeError or ValueError naming what is wrong."""
    if isinstance(shape, (DTensor, _Variable)):
        shape = _host_array(shape, what=f"{what}: shape").reshape(-1).tolist()
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = [shape]
    if isinstance(shape, np.ndarray):
        shape = shape.reshape(-1).tolist()
    if not isinstance(shape, (list, tuple)):
        raise TypeError(f"{what}: shape must be a list of integers, got {type(shape).__name__}")
    out = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"{what}: shape {list(shape)} has a non-integer extent {d!r}")
        if d < 0:
            raise ValueError(f"{what}: shape {list(shape)} has a negative extent {d}")
        out.append(int(d))
    return out


class _Ref:
    """What DTensor.ref() gives: hashable and equal by identity; ``deref()`` returns it."""

    def __init__(self, tensor):
        self._tensor = tensor

    def deref(self):
        return self._tensor

    def __hash__(self):
        return id(self._tensor)

    def __eq__(self, other):
        return isinstance(other, _Ref) and other._tensor is self._tensor


def _mesh_device(mesh):
    """TensorFlow's name of the mesh's (first local) device, None when this client has none."""
    local = mesh.local_device_ids()
    if not local:
        return None
    return _device_name(mesh._device_ids[local[0]], mesh.device_type())


def dtensor_from_array(arr, layout, shape=None, dtype=None):
    """A DTensor from a full array that every client passes (Python values converted as
    TensorFlow converts them); each device keeps its slice."""
    layout = _layout_arg(layout, "dtensor_from_array")
    a = _host_array(arr, dtype, "dtensor_from_array: arr")
    a = np.asarray(a, order="C")  # ascontiguousarray makes scalars 1-d
    if shape is not None:
        shape = _shape_arg(shape, "dtensor_from_array")
        if a.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"dtensor_from_array: {a.size} values do not fill shape {shape}")
        a = a.reshape(shape)
    handle = _c.tensor_from_host(layout.mesh._handle, layout._text, _code(a.dtype),
                                 list(a.shape), _raw(a))
    return DTensor(handle, layout)


def pack(tensors, layout, shape=None):
    """A DTensor from one component per local device of the mesh (in local device order); each
    must have the local shape the layout gives its device. The global shape is ``shape`` or,
    as in TensorFlow, each component extent times the number of shards, which every client
    must infer alike: the clients exchange their inferences (collective), and uneven shards
    (which imply different shapes) raise ValueError on every client asking for ``shape=``.
    Any client's bad component raises on every client."""
    layout = _layout_arg(layout, "pack")
    comps, error = [], None
    try:
        if isinstance(tensors, (DTensor, _Variable, np.ndarray)) or \
                not isinstance(tensors, (list, tuple)):
            raise TypeError(f"pack: expected a list of components, got "
                            f"{type(tensors).__name__}")
        comps = [np.ascontiguousarray(_host_array(t, what=f"pack: component {i}"))
                 for i, t in enumerate(tensors)]
        mesh = layout.mesh
        if len(comps) == mesh.size and len(comps) != mesh.num_local_devices():
            # one component per device of the mesh, as a single-client program passes them:
            # this client keeps its own devices'
            comps = [comps[i] for i in mesh.local_device_ids()]
    except (TypeError, ValueError) as e:
        error = e
    shape, dtype = _agree_components([c.shape for c in comps], [str(c.dtype) for c in comps],
                                     layout, shape, error)
    return _from_components(comps, layout, shape, dtype)


def _agree_components(shapes, dtypes, layout, shape, error=None):
    """The global shape and dtype of per-device components (pack's rules), agreed by every
    client (collective): any client's bad component raises on every client."""
    dtype, guess = None, None
    try:
        if error is not None:
            raise error
        devices = layout.mesh.local_device_ids()
        if len(shapes) != len(devices):
            raise ValueError(f"pack needs {len(devices)} components (one per local device of "
                             f"the mesh), got {len(shapes)}")
        names = sorted(set(dtypes))
        if len(names) > 1:
            raise TypeError(f"components differ in dtype: {names}")
        dtype = names[0] if names else None
        if dtype is not None:
            _code(dtype)
        if any(len(sh) != layout.rank for sh in shapes):
            raise ValueError(f"components have ranks {[len(sh) for sh in shapes]}, the layout "
                             f"{layout._text!r} rank {layout.rank}")
        if shape is not None:
            shape = [int(n) for n in shape]
            if len(shape) != layout.rank:
                raise ValueError(f"shape {shape} has rank {len(shape)}, the layout "
                                 f"{layout._text!r} rank {layout.rank}")
            for d, sh in zip(devices, shapes):
                want = tuple(layout.local_shape(shape, d)[0])
                if tuple(sh) != want:
                    raise ValueError(f"the component of device {d} has shape {tuple(sh)}; the "
                                     f"layout {layout._text!r} gives it {want} of {shape}")
        else:
            # each component's extent times the shards: one shape when the split is even
            guesses = sorted({tuple(sh[a] * layout.num_shards(a)
                                    for a in _builtins.range(layout.rank)) for sh in shapes})
            if len(guesses) > 1:
                raise ValueError(f"components {[tuple(sh) for sh in shapes]} imply global "
                                 f"shapes {guesses} (uneven shards): pass shape=")
            guess = list(guesses[0]) if guesses else None
    except (TypeError, ValueError) as e:
        error = e
    # every client checks the same verdicts, so all agree on the shape or all raise
    verdicts = _agree(error, [dtype, guess])
    dtypes = {d for d, _ in verdicts if d is not None}
    if len(dtypes) > 1:
        raise TypeError("pack: clients pass components of different dtypes: " + ", ".join(
            f"client {c} {d}" for c, (d, _) in enumerate(verdicts) if d is not None))
    if shape is None:
        guesses = {tuple(g) for _, g in verdicts if g is not None}
        if len(guesses) != 1:
            raise ValueError("pack: the clients' components imply different global shapes ("
                             + ", ".join(f"client {c} {tuple(g)}" for c, (_, g) in
                                         enumerate(verdicts) if g is not None)
                             + "): the shards are uneven, pass shape=")
        shape = list(guesses.pop())
    return shape, dtypes.pop()


def from_dlpack(components, layout, shape=None):
    """A DTensor whose local components ARE the given arrays' memory, without a copy: one
    object with ``__dlpack__`` per local device of the layout's mesh (numpy, PyTorch, CuPy
    arrays; on the devices of the mesh's type), each contiguous with its device's local shape.
    Shapes and dtypes are agreed as by :func:`pack` (collective). The arrays must not change
    while the DTensor lives; it hands them back when freed."""
    layout = _layout_arg(layout, "from_dlpack")
    if not isinstance(components, (list, tuple)):
        components = [components]
    error, shapes, dtypes = None, [], []
    try:
        for c in components:
            if not hasattr(c, "__dlpack__"):
                raise TypeError(f"from_dlpack: {type(c).__name__} has no __dlpack__")
            shapes.append(tuple(int(n) for n in c.shape))
            dtypes.append(str(np.dtype(str(c.dtype).replace("torch.", ""))))
    except (TypeError, ValueError) as e:
        error = e
    shape, dtype = _agree_components(shapes, dtypes, layout, shape, error)
    # on GPUs each producer orders its pending work before the stream the device uses (DLPack's
    # stream argument), so the DTensor never reads memory the producer is still writing
    streams = [_c.mesh_stream(layout.mesh._handle, i) for i, _ in enumerate(components)]
    caps = [c.__dlpack__(stream=s) if s else c.__dlpack__() for c, s in zip(components, streams)]
    return DTensor(_c.tensor_from_dlpack(layout.mesh._handle, layout._text, _code(dtype),
                                         list(shape), caps), layout)


class _Component:
    """Local device i's component of a DTensor, lent through DLPack (no copy)."""

    def __init__(self, tensor, i):
        self._tensor, self._i = tensor, i
        self.shape = tensor._local_shapes[i]
        self.dtype = tensor.dtype

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return _c.tensor_dlpack(self._tensor._handle, self._i)

    def __dlpack_device__(self):
        return _c.tensor_dlpack_device(self._tensor._handle, self._i)


def local_components(tensor):
    """This client's components as DLPack-capable objects, one per local device, lending the
    DTensor's memory without a copy (``np.from_dlpack(c)``, ``torch.from_dlpack(c)``)."""
    from ._ops import _as_tensor  # noqa: PLC0415 (a later module)
    t = _as_tensor(tensor, "local_components: tensor")
    if t._local_shapes is None:
        raise DTensorError("local_components: the tensor is symbolic (recorded in a function "
                           "being traced)")
    return [_Component(t, i) for i in _builtins.range(len(t._local_shapes))]


def _capsule_header(capsule):
    """(shape, numpy dtype, contiguous) of a DLPack capsule ("dltensor"), read without
    consuming it (DLPack's DLManagedTensor: the DLTensor comes first)."""
    import ctypes  # noqa: PLC0415

    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                    ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                    ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                    ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.POINTER(ctypes.c_int64)),
                    ("byte_offset", ctypes.c_uint64)]
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    try:
        t = DLTensor.from_address(get(capsule, b"dltensor"))
    except ValueError:
        raise errors.InvalidArgumentError("from_dlpack: the capsule is not an unused DLPack "
                                          "tensor (a capsule is consumed once)") from None
    if t.device_type != 1:
        raise errors.InvalidArgumentError(f"from_dlpack: the memory is on DLPack device "
                                          f"{t.device_type}, not the CPU (1)")
    kinds = {(0, 8): "int8", (0, 32): "int32", (0, 64): "int64", (1, 8): "uint8",
             (2, 16): "float16", (2, 32): "float32", (2, 64): "float64", (4, 16): "bfloat16",
             (6, 8): "bool"}
    name = kinds.get((t.code, t.bits)) if t.lanes == 1 else None
    if name is None:
        raise TypeError(f"from_dlpack: DLPack dtype code {t.code}, {t.bits} bits, {t.lanes} "
                        f"lanes is not one of dtensor's dtypes")
    shape = [t.shape[i] for i in _builtins.range(t.ndim)]
    contiguous = not t.strides or all(
        shape[i] == 1 or t.strides[i] == int(np.prod(shape[i + 1:], dtype=np.int64))
        for i in _builtins.range(t.ndim))
    return shape, (bfloat16 if name == "bfloat16" else np.dtype(name)), contiguous


def _to_dlpack(tensor):
    """tf.experimental.dlpack.to_dlpack: a DLPack capsule lending the memory of a tensor with
    one component on this client (a regular tensor, a replica's value), without a copy."""
    from ._ops import _as_tensor  # noqa: PLC0415 (a later module)
    t = _as_tensor(tensor, "to_dlpack: tensor")
    return t._one_component().__dlpack__()


def _from_dlpack_capsule(dlcapsule):
    """tf.experimental.dlpack.from_dlpack: a regular tensor (this client's host mesh) whose
    memory is a DLPack capsule's (or a ``__dlpack__`` object's, as numpy's and PyTorch's
    arrays), without a copy; CPU memory only. Not collective: only this client takes part."""
    from ._ops import _host_mesh  # noqa: PLC0415 (a later module)
    if hasattr(dlcapsule, "__dlpack__"):
        shape = [int(n) for n in dlcapsule.shape]
        dtype = np.dtype(str(dlcapsule.dtype).replace("torch.", ""))
        contiguous = getattr(getattr(dlcapsule, "flags", None), "c_contiguous", True)
        if contiguous:
            dlcapsule = dlcapsule.__dlpack__()
    elif type(dlcapsule).__name__ == "PyCapsule":
        shape, dtype, contiguous = _capsule_header(dlcapsule)
    else:
        raise TypeError(f"from_dlpack: expected a DLPack capsule or an object with "
                        f"__dlpack__, got {type(dlcapsule).__name__}")
    if not contiguous:
        raise errors.InvalidArgumentError(f"from_dlpack: the memory of shape {tuple(shape)} "
                                          f"is not contiguous")
    layout = Layout.replicated(_host_mesh(), len(shape))
    return DTensor(_c.tensor_from_dlpack(layout.mesh._handle, layout._text, _code(dtype),
                                         shape, [dlcapsule]), layout)


def _from_components(comps, layout, shape, dtype):
    """A DTensor from components already checked against the layout."""
    handle = _c.tensor_pack(layout.mesh._handle, layout._text, _code(dtype), list(shape),
                            [_raw(c) for c in comps], [list(c.shape) for c in comps])
    return DTensor(handle, layout)


class LocalTensor(np.ndarray):
    """A component of a DTensor on one device (what :func:`unpack` gives): a numpy array
    that also answers TensorFlow's ``device`` (the device's name) and ``numpy()``."""

    @property
    def device(self):
        return getattr(self, "_device", None)

    def numpy(self):
        return np.asarray(self)

    def __array_finalize__(self, obj):
        self._device = getattr(obj, "_device", None)


def unpack(tensor):
    """This client's components, one array per local device (numpy arrays whose ``device``
    names the device, as TensorFlow's components)."""
    from ._ops import _as_tensor  # noqa: PLC0415 (a later module)
    tensor = _as_tensor(tensor, "unpack: tensor")
    if tensor._local_shapes is None:
        raise DTensorError("unpack: the tensor is symbolic (recorded in a function being "
                           "traced); call the function to get values")
    mesh = tensor.layout.mesh
    out = []
    for i, (shape, dev) in enumerate(zip(tensor._local_shapes, mesh.local_device_ids())):
        a = np.empty(shape, dtype=tensor.dtype)
        _c.tensor_to_host(tensor._handle, i, _raw(a))
        a = a.view(LocalTensor)
        a._device = _device_name(mesh._device_ids[dev], mesh.device_type())
        out.append(a)
    return out


def gather(tensor):
    """The global value as one numpy array on every client (collective; pending partial sums
    are reduced). The only call that materialises a global tensor."""
    from ._ops import _as_tensor  # noqa: PLC0415 (a later module)
    tensor = _as_tensor(tensor, "gather: tensor")
    out = np.empty(tensor.shape, dtype=tensor.dtype)
    _c.tensor_to_host(tensor._handle, -1, _raw(out))
    return out


def fetch_layout(tensor):
    """The layout of a DTensor or a DVariable."""
    if not isinstance(tensor, (DTensor, _Variable)):
        raise TypeError(f"fetch_layout: expected a DTensor, got {type(tensor).__name__}")
    return tensor.layout


def check_layout(tensor, layout):
    """Raise ValueError unless the tensor has this layout."""
    if fetch_layout(tensor) != _layout_arg(layout, "check_layout"):
        raise ValueError(f"layout mismatch: tensor has {tensor.layout}, expected {layout}")
