"""dtensor: sharded tensors over meshes of devices, mirroring ``tf.experimental.dtensor``.

Names and semantics follow TensorFlow's DTensor API, with numpy arrays where TensorFlow uses
``tf.Tensor``::

    import numpy as np
    import dtensor

    dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=6)
    mesh = dtensor.create_mesh([("x", 3), ("y", 2)], device_type="CPU")
    layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh)
    t = dtensor.dtensor_from_array(np.arange(6, dtype=np.int32).reshape(3, 2), layout)
    dtensor.unpack(t)          # one component per local device
    dtensor.gather(t)          # the global array, gathered explicitly (collective)

Under ``mpiexec.mpich -n N`` each rank is a client, as in DTensor's multi-client mode; calls
documented as collective must be made by every client in the same order. Every failure raises
:class:`DTensorError` carrying the C status (``.status``, ``.code``) and message.
"""

import atexit
import weakref

import numpy as np

from . import _dtensor as _c
from ._dtensor import DTensorError

__all__ = [
    "UNSHARDED", "DTensorError", "DTensor", "Mesh", "Layout",
    "initialize_accelerator_system", "shutdown_accelerator_system", "is_initialized",
    "create_mesh", "create_distributed_mesh", "client_id", "num_clients", "barrier",
    "num_local_devices", "num_global_devices", "local_devices", "devices_report",
    "dtensor_from_array", "pack", "unpack", "gather", "fetch_layout", "check_layout",
    "print_ordered",
]

UNSHARDED = "unsharded"

_DTYPES = {
    np.dtype(np.float32): _c.DTYPE_F32,
    np.dtype(np.float64): _c.DTYPE_F64,
    np.dtype(np.int32): _c.DTYPE_I32,
    np.dtype(np.int64): _c.DTYPE_I64,
}
_NUMPY = {code: dt for dt, code in _DTYPES.items()}
_DEVICE_TYPES = {"CPU": _c.DEVICE_CPU, "GPU": _c.DEVICE_CUDA, "CUDA": _c.DEVICE_CUDA}

# Live meshes and tensors, so that shutdown can release them before the runtime stops.
_live = weakref.WeakSet()


def _code(dtype):
    dt = np.dtype(dtype)
    if dt not in _DTYPES:
        raise TypeError(f"dtype {dt} is not one of float32, float64, int32, int64")
    return _DTYPES[dt]


# ---- runtime ---------------------------------------------------------------------------------

def initialize_accelerator_system(device_type="CPU", num_logical_cpu_devices=None):
    """Start the runtime (collective). ``num_logical_cpu_devices`` local CPU devices per client
    (default: ``DTENSOR_CPU_DEVICES`` or 1). Under mpiexec each rank becomes a client."""
    if device_type is not None and device_type.upper() not in _DEVICE_TYPES:
        raise ValueError(f"device_type {device_type!r} is not CPU or GPU")
    _c.init(int(num_logical_cpu_devices or 0))
    return device_type or "CPU"


def shutdown_accelerator_system():
    """Release every live mesh and tensor, then stop the runtime (collective)."""
    if not _c.runtime_info()["initialized"]:
        return
    objs = list(_live)
    for o in objs:
        if isinstance(o, DTensor):
            o._handle.free()
    for o in objs:
        if isinstance(o, Mesh):
            o._handle.free()
    _c.finalize()


def is_initialized():
    return _c.runtime_info()["initialized"]


def _ensure_init():
    if not _c.runtime_info()["initialized"]:
        initialize_accelerator_system()


@atexit.register
def _shutdown_at_exit():
    shutdown_accelerator_system()


def client_id():
    """This client's index (the MPI rank under mpiexec, else 0)."""
    _ensure_init()
    return _c.runtime_info()["client_id"]


def num_clients():
    _ensure_init()
    return _c.runtime_info()["num_clients"]


def num_local_devices(device_type="CPU"):
    _ensure_init()
    kind = "cpu" if _DEVICE_TYPES[device_type.upper()] == _c.DEVICE_CPU else "cuda"
    return _c.runtime_info()["local_" + kind]


def num_global_devices(device_type="CPU"):
    _ensure_init()
    kind = "cpu" if _DEVICE_TYPES[device_type.upper()] == _c.DEVICE_CPU else "cuda"
    return _c.runtime_info()["global_" + kind]


def local_devices(device_type="CPU"):
    """This client's devices as "CPU:<global id>" strings."""
    _ensure_init()
    code = _DEVICE_TYPES[device_type.upper()]
    name = "CPU" if code == _c.DEVICE_CPU else "GPU"
    return [f"{name}:{_c.global_device_id(code, i)}"
            for i in range(num_local_devices(device_type))]


def barrier(mesh=None, barrier_name=None):
    """Wait for every client (collective). ``mesh`` and ``barrier_name`` are accepted for
    TensorFlow compatibility."""
    _ensure_init()
    _c.barrier()


def devices_report():
    """Host topology and this client's devices, as text."""
    _ensure_init()
    return _c.devices_report()


def print_ordered(text):
    """Client 0 prints every client's text, in client order (collective)."""
    _c.print_ordered(text)


# ---- mesh ------------------------------------------------------------------------------------

class Mesh:
    """Devices on named axes, in row-major order. Create with :func:`create_mesh`."""

    def __init__(self, handle):
        self._handle = handle
        info = _c.mesh_info(handle)
        self._names = tuple(info["names"])
        self._sizes = tuple(info["sizes"])
        self._local_ids = tuple(info["local_ids"])
        self._device_type = "GPU" if info["device_type"] == "CUDA" else "CPU"
        _live.add(self)

    @property
    def dim_names(self):
        return list(self._names)

    def shape(self):
        return list(self._sizes)

    @property
    def size(self):
        return int(np.prod(self._sizes))

    def dim_size(self, dim_name):
        if dim_name not in self._names:
            raise ValueError(f"{dim_name!r} is not a dimension of {self}")
        return self._sizes[self._names.index(dim_name)]

    def device_type(self):
        return self._device_type

    def local_device_ids(self):
        return list(self._local_ids)

    def num_local_devices(self):
        return len(self._local_ids)

    def local_devices(self):
        return [f"{self._device_type}:{i}" for i in self._local_ids]

    def global_device_ids(self):
        return np.arange(self.size).reshape(self._sizes)

    def __contains__(self, dim_name):
        return dim_name in self._names

    def __eq__(self, other):
        return isinstance(other, Mesh) and other._handle is self._handle

    def __hash__(self):
        return id(self._handle)

    def __repr__(self):
        dims = ",".join(f"{n}={s}" for n, s in zip(self._names, self._sizes))
        return f"Mesh({dims}, {self._device_type}:{self.size})"


def create_mesh(mesh_dims=None, mesh_name="", devices=None, device_type=None,
                use_xla_spmd=False):
    """A mesh over every device of the type on every client (collective).

    ``mesh_dims``: a list of ``(name, size)`` pairs or a dict. ``devices``, when given, must
    list every device in order (``"CPU:0"``, ...): meshes over device subsets are not
    supported. ``mesh_name`` and ``use_xla_spmd`` are accepted for compatibility."""
    _ensure_init()
    if mesh_dims is None:
        raise ValueError("mesh_dims is required, e.g. [('x', 6)]")
    dims = list(mesh_dims.items()) if isinstance(mesh_dims, dict) else list(mesh_dims)
    kind = (device_type or "CPU").upper()
    if kind not in _DEVICE_TYPES:
        raise ValueError(f"device_type {device_type!r} is not CPU or GPU")
    if devices is not None:
        want = [f"{kind}:{i}" for i in range(num_global_devices(kind))]
        got = [d.split("device:")[-1].upper() for d in devices]
        if got != want and len(got) != num_local_devices(kind):
            raise ValueError(f"devices {devices} must be every {kind} device in order ({want})")
    names = [str(n) for n, _ in dims]
    sizes = [int(s) for _, s in dims]
    return Mesh(_c.mesh_create(names, sizes, _DEVICE_TYPES[kind]))


def create_distributed_mesh(mesh_dims, mesh_name="", local_devices=None, device_type=None,
                            use_xla_spmd=False):
    """A mesh spanning every client's devices (collective); the same as :func:`create_mesh`,
    which already spans all clients."""
    return create_mesh(mesh_dims, mesh_name=mesh_name, device_type=device_type)


# ---- layout ----------------------------------------------------------------------------------

class Layout:
    """Per tensor axis the mesh dimension that shards it, or ``UNSHARDED``.

    ``partial`` names mesh dimensions holding pending reductions, e.g. ``{"y": "sum"}`` (one
    reduction for all of them)."""

    def __init__(self, sharding_specs, mesh, partial=None):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh must be a dtensor.Mesh, got {type(mesh).__name__}")
        self._specs = [str(s) for s in sharding_specs]
        self._mesh = mesh
        self._partial = dict(partial or {})
        ops = set(self._partial.values())
        if len(ops) > 1:
            raise ValueError(f"partial dimensions must share one reduction, got {sorted(ops)}")
        text = ",".join(self._specs)
        if self._partial:
            text += f";partial_{ops.pop()}=" + "+".join(self._partial)
        self._text, rank = _c.layout_check(mesh._handle, text)
        assert rank == len(self._specs)

    @classmethod
    def replicated(cls, mesh, rank):
        return cls([UNSHARDED] * rank, mesh)

    @classmethod
    def batch_sharded(cls, mesh, batch_dim, rank, axis=0):
        specs = [UNSHARDED] * rank
        specs[axis] = batch_dim
        return cls(specs, mesh)

    @classmethod
    def inner_sharded(cls, mesh, inner_dim, rank):
        return cls.batch_sharded(mesh, inner_dim, rank, axis=rank - 1)

    @classmethod
    def from_string(cls, layout_str, mesh):
        """Parse ``"x,unsharded"`` (optionally ``";partial_sum=y"``) on ``mesh``."""
        text, _, partial = layout_str.replace(" ", "").partition(";")
        specs = text.split(",") if text else []
        parts = {}
        if partial:
            op, _, axes = partial.partition("=")
            if not op.startswith("partial_"):
                raise ValueError(f"cannot parse layout {layout_str!r}")
            parts = {a: op[len("partial_"):] for a in axes.split("+")}
        return cls(specs, mesh, partial=parts)

    def to_string(self):
        return self._text

    @property
    def sharding_specs(self):
        return list(self._specs)

    @property
    def mesh(self):
        return self._mesh

    @property
    def rank(self):
        return len(self._specs)

    @property
    def partial(self):
        return dict(self._partial)

    def is_fully_replicated(self):
        return not self._partial and all(s == UNSHARDED for s in self._specs)

    def num_shards(self, idx):
        spec = self._specs[idx]
        return 1 if spec == UNSHARDED else self._mesh.dim_size(spec)

    def local_shape(self, global_shape, device):
        """(local shape, global offset) of a global device's shard; uneven splits allowed."""
        return _c.layout_local_shape(self._mesh._handle, self._text, list(global_shape), device)

    def __eq__(self, other):
        return (isinstance(other, Layout) and other._mesh == self._mesh
                and other._text == self._text)

    def __hash__(self):
        return hash((self._text, id(self._mesh._handle)))

    def __repr__(self):
        return f"Layout({self._text!r}, {self._mesh})"


# ---- tensors ---------------------------------------------------------------------------------

class DTensor:
    """A global tensor: shape, dtype, layout and one component per local device."""

    def __init__(self, handle, layout):
        self._handle = handle
        info = _c.tensor_info(handle)
        self._shape = tuple(info["shape"])
        self._dtype = _NUMPY[info["dtype"]]
        self._local_shapes = [tuple(s) for s in info["local_shapes"]]
        self._layout = layout if layout.to_string() == info["layout"] else \
            Layout.from_string(info["layout"], layout.mesh)
        _live.add(self)

    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        return self._dtype

    @property
    def ndim(self):
        return len(self._shape)

    @property
    def layout(self):
        return self._layout

    def numpy(self):
        """The value, when it is fully replicated (as TensorFlow); for a sharded tensor use
        :func:`gather` (an explicit, collective gather)."""
        if not self._layout.is_fully_replicated():
            raise DTensorError(
                f"numpy() needs a fully replicated DTensor, this one has layout "
                f"{self._layout.to_string()!r}: use dtensor.gather(t) or dtensor.unpack(t)")
        out = np.empty(self._shape, dtype=self._dtype)
        _c.tensor_unpack(self._handle, 0, out)
        return out

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def free(self):
        """Release the device memory now (otherwise when garbage collected)."""
        self._handle.free()

    def __repr__(self):
        return (f"DTensor(shape={list(self._shape)}, dtype={self._dtype}, "
                f"layout={self._layout.to_string()!r}, mesh={self._layout.mesh})")


def dtensor_from_array(arr, layout, shape=None, dtype=None):
    """A DTensor from a full array that every client passes; each device keeps its slice."""
    a = np.ascontiguousarray(arr, dtype=dtype)
    if shape is not None:
        a = a.reshape(shape)
    handle = _c.tensor_from_host(layout.mesh._handle, layout.to_string(), _code(a.dtype),
                                 list(a.shape), a)
    return DTensor(handle, layout)


def pack(tensors, layout, shape=None):
    """A DTensor from one component per local device (in local device order); each must have
    the local shape the layout gives its device. The global shape is ``shape`` or, as in
    TensorFlow, each component extent times the number of shards (even splits); pass
    ``shape`` for uneven splits."""
    comps = [np.ascontiguousarray(t) for t in tensors]
    if len(comps) != layout.mesh.num_local_devices():
        raise ValueError(f"pack needs {layout.mesh.num_local_devices()} components (one per "
                         f"local device), got {len(comps)}")
    dtype = comps[0].dtype
    if any(c.dtype != dtype for c in comps):
        raise TypeError(f"components differ in dtype: {sorted({str(c.dtype) for c in comps})}")
    if any(c.ndim != layout.rank for c in comps):
        raise ValueError(f"components must have rank {layout.rank} like the layout")
    if shape is None:
        shape = [comps[0].shape[a] * layout.num_shards(a) for a in range(layout.rank)]
    handle = _c.tensor_pack(layout.mesh._handle, layout.to_string(), _code(dtype), list(shape),
                            comps, [list(c.shape) for c in comps])
    return DTensor(handle, layout)


def unpack(tensor):
    """This client's components, one numpy array per local device."""
    out = []
    for i, shape in enumerate(tensor._local_shapes):
        a = np.empty(shape, dtype=tensor.dtype)
        _c.tensor_unpack(tensor._handle, i, a)
        out.append(a)
    return out


def gather(tensor):
    """The global value as one numpy array on every client (collective; pending partial sums
    are reduced). The only call that materialises a global tensor."""
    out = np.empty(tensor.shape, dtype=tensor.dtype)
    _c.tensor_read(tensor._handle, out)
    return out


def fetch_layout(tensor):
    return tensor.layout


def check_layout(tensor, layout):
    """Raise ValueError unless the tensor has this layout."""
    if tensor.layout != layout:
        raise ValueError(f"layout mismatch: tensor has {tensor.layout}, expected {layout}")
