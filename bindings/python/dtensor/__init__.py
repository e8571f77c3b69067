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
import builtins as _builtins
import contextlib as _contextlib
import json as _json
import re as _re
import threading as _threading
import types as _types
import weakref

import ml_dtypes
import numpy as np

from . import _dtensor as _c
from . import _replicas, _tape, errors
from ._dtensor import DTensorError

_c.error_classes.update(errors.BY_STATUS)  # C failures raise TensorFlow's classes

__version__ = _c.VERSION  # the C library's (tf.__version__)

__all__ = [
    "UNSHARDED", "DTensorError", "DTensor", "Mesh", "Layout",
    "initialize_accelerator_system", "shutdown_accelerator_system", "is_initialized",
    "create_mesh", "create_distributed_mesh", "client_id", "num_clients", "barrier",
    "num_local_devices", "num_global_devices", "local_devices", "devices_report",
    "dtensor_from_array", "pack", "unpack", "gather", "fetch_layout", "check_layout",
    "print_ordered", "call_with_layout", "relayout", "copy_to_mesh", "fill", "ones", "zeros",
    "range", "random", "matmul", "add", "subtract", "multiply", "divide", "maximum", "minimum",
    "pow", "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "neg",
    "negative", "abs", "exp", "log", "sqrt", "relu", "tanh", "sigmoid", "square", "sin", "cos",
    "reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "transpose",
    "reshape", "slice", "concat", "DVariable", "function", "Function", "show_programs", "set_collective_algorithm",
    "ledger", "ledger_text", "ledger_clear", "ledger_next_step", "Dense", "Sequential", "SGD",
    "Adam", "AdamW", "RMSprop", "ReduceOp", "Strategy", "OneDeviceStrategy", "MirroredStrategy",
    "MultiWorkerMirroredStrategy", "CentralStorageStrategy", "ParameterServerStrategy",
    "ClusterCoordinator", "RemoteValue", "get_strategy", "compute_average_loss",
    "is_dtensor", "default_mesh", "run_on", "zeros_like", "ones_like", "cast", "truediv",
    "floordiv", "floormod", "mod", "GradientTape", "PerReplica", "ReplicaContext",
    "InputContext", "get_replica_context", "in_cross_replica_context", "Optimizer", "data",
    "keras", "from_dlpack", "local_components", "CrossDeviceOps", "NcclAllReduce",
    "HierarchicalCopyAllReduce", "ReductionToOneDevice", "CommunicationImplementation",
    "CommunicationOptions", "FixedShardsPartitioner", "MinSizePartitioner", "MaxSizePartitioner",
    "TFConfigClusterResolver", "PSVariable", "Variable", "PerWorkerDataset", "bfloat16",
    "float16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool_", "where",
    "logical_and", "logical_or", "logical_xor", "logical_not", "erf", "gelu", "silu", "swish",
    "rsqrt", "nn", "math", "train", "Checkpoint", "CheckpointManager",
    # row-wise ops
    "softmax", "log_softmax", "reduce_logsumexp", "layer_norm", "rms_norm", "argmax", "argmin",
    "cumsum",
    # TensorFlow's names for what TensorFlow programs do around the ops
    "constant", "convert_to_tensor", "identity", "stop_gradient", "TensorShape", "LocalTensor",
    "add_n", "scale_regularization_loss", "softmax_cross_entropy_with_logits",
    "sparse_softmax_cross_entropy_with_logits", "ClusterSpec", "CollectiveCommunication",
    "errors", "config", "distribute", "experimental", "list_physical_devices",
    "list_logical_devices", "set_logical_device_configuration", "LogicalDeviceConfiguration",
    "Module", "nest", "io", "string", "dtypes", "conv2d", "max_pool2d", "avg_pool2d", "moments",
    "batch_normalization", "MeshDimension",
]

UNSHARDED = "unsharded"

#: numpy's bfloat16 (from ml_dtypes, as JAX and TensorFlow take it).
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float16, float32, float64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
int8, uint8, int32, int64 = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int32),
                             np.dtype(np.int64))
bool_ = np.dtype(np.bool_)

_DTYPES = {
    float32: _c.DTYPE_F32,
    float64: _c.DTYPE_F64,
    int32: _c.DTYPE_I32,
    int64: _c.DTYPE_I64,
    bfloat16: _c.DTYPE_BF16,
    float16: _c.DTYPE_F16,
    bool_: _c.DTYPE_BOOL,
    uint8: _c.DTYPE_U8,
    int8: _c.DTYPE_I8,
}
_NUMPY = {code: dt for dt, code in _DTYPES.items()}
_DTYPE_NAMES = ", ".join(str(d) for d in _DTYPES)


def _raw(a):
    """The bytes of a numpy array as the C layer takes them: bfloat16 (which the buffer
    protocol cannot describe) as its 16-bit patterns, everything else as it is."""
    return a.view(np.uint16) if a.dtype == bfloat16 else a


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
    if isinstance(value, (DTensor, DVariable)):
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


class TensorShape(tuple):
    """tf.TensorShape: a tuple of extents (None for an unknown one), ``as_list()``,
    ``rank``, ``num_elements()``."""

    def __new__(cls, dims=()):
        if isinstance(dims, (int, np.integer)):
            dims = [dims]
        return super().__new__(cls, (None if d is None else int(d) for d in (dims or ())))

    @property
    def rank(self):
        return len(self)

    @property
    def ndims(self):
        return len(self)

    @property
    def dims(self):
        return list(self)

    def as_list(self):
        return list(self)

    def num_elements(self):
        return None if None in self else int(np.prod(self, dtype=np.int64))

    def is_fully_defined(self):
        return None not in self

    def __repr__(self):
        return f"TensorShape({list(self)})"

    def __str__(self):
        return "(" + ", ".join("None" if d is None else str(d) for d in self) + \
            ("," if len(self) == 1 else "") + ")"


def _device_name(global_id, kind="CPU"):
    """TensorFlow's name of a device of the runtime: its client's task and its number there
    ("/job:localhost/replica:0/task:0/device:CPU:1"; "/job:worker/..." with several clients)."""
    code = _DEVICE_TYPES[kind]
    first = _c.global_device_id(code, 0)  # this client's first device
    per = _c.runtime_info()["local_" + ("cpu" if code == _c.DEVICE_CPU else "cuda")] or 1
    task = client_id() + (global_id - first) // per if num_clients() > 1 else 0
    job = "localhost" if num_clients() == 1 else "worker"
    return f"/job:{job}/replica:0/task:{task}/device:{kind}:{(global_id - first) % per}"
_DEVICE_TYPES = {"CPU": _c.DEVICE_CPU, "GPU": _c.DEVICE_CUDA, "CUDA": _c.DEVICE_CUDA}

class _Registry:
    """Live objects in creation order (collective creations happen in the same order on every
    client), so that shutdown releases them in reverse order, alike on every client."""

    def __init__(self):
        self._items = weakref.WeakValueDictionary()
        self._next = 0
        self._kept = []

    def add(self, obj, keep=False):
        """keep: an object whose release is collective (a ps variable's window, a coordinator)
        stays alive until shutdown, since garbage collection frees objects at different times
        on different clients."""
        self._items[self._next] = obj
        self._next += 1
        if keep:
            self._kept.append(obj)

    def newest_first(self):
        return [self._items[k] for k in sorted(self._items.keys(), reverse=True)
                if k in self._items]


_live = _Registry()


def _code(dtype):
    dt = np.dtype(dtype)
    if dt not in _DTYPES:
        raise TypeError(f"dtype {dt} is not one of {_DTYPE_NAMES}")
    return _DTYPES[dt]


# ---- runtime ---------------------------------------------------------------------------------

def initialize_accelerator_system(device_type=None, num_logical_cpu_devices=None):
    """Start the runtime (collective) and return the device type its meshes should use.
    ``num_logical_cpu_devices`` local CPU devices per client (default: ``DTENSOR_CPU_DEVICES``
    or 1). ``device_type`` "GPU" needs a GPU on every client (else ValueError on every client,
    naming the clients without one, and the runtime is stopped again); None picks "GPU" when
    every client has one, else "CPU", as TensorFlow. Under mpiexec each rank is a client."""
    kind = None if device_type is None else str(device_type).upper()
    if kind is not None and kind not in _DEVICE_TYPES:
        raise ValueError(f"device_type {device_type!r} is not CPU or GPU")
    if num_logical_cpu_devices is not None and (
            isinstance(num_logical_cpu_devices, bool) or
            not isinstance(num_logical_cpu_devices, (int, np.integer)) or
            num_logical_cpu_devices < 0):
        raise TypeError(f"num_logical_cpu_devices must be a non-negative integer, got "
                        f"{num_logical_cpu_devices!r}")
    _c.init(int(num_logical_cpu_devices or _logical_cpus or 0))
    if kind == "CPU":
        return "CPU"
    gpus = _allgather_json(num_local_devices("GPU"))
    missing = [c for c, n in enumerate(gpus) if n == 0]
    if kind is None:
        return "CPU" if missing else "GPU"
    if missing:
        shutdown_accelerator_system()
        raise ValueError(f"initialize_accelerator_system('GPU'): clients {missing} have no GPU "
                         f"(the CUDA runtime finds none, or dtensor was built without CUDA)")
    return "GPU"


def shutdown_accelerator_system():
    """Release every live mesh and tensor, then stop the runtime (collective)."""
    if not _c.runtime_info()["initialized"]:
        return
    import gc
    gc.collect()  # handles only reachable from dead frames or cycles
    global _default_strategy, _host
    _default_strategy = _host = None
    for o in _live.newest_first():
        o._handle.free()
    _live._kept.clear()
    _c.finalize()


def is_initialized():
    return _c.runtime_info()["initialized"]


# ---- tf.config: devices ------------------------------------------------------------------------

_logical_cpus = 0  # set_logical_device_configuration's count, for the runtime's start


class PhysicalDevice(_types.SimpleNamespace):
    """tf.config.PhysicalDevice: ``name`` ("/physical_device:CPU:0") and ``device_type``."""


class LogicalDevice(_types.SimpleNamespace):
    """tf.config.LogicalDevice: ``name`` ("/job:localhost/replica:0/task:0/device:CPU:1") and
    ``device_type``."""


class LogicalDeviceConfiguration(_types.SimpleNamespace):
    """tf.config.LogicalDeviceConfiguration: one logical device of a physical one
    (``memory_limit`` is accepted and not used)."""

    def __init__(self, memory_limit=None, experimental_priority=None,
                 experimental_device_ordinal=None):
        super().__init__(memory_limit=memory_limit)


def list_physical_devices(device_type=None):
    """tf.config.list_physical_devices: the host's CPU (one physical device, as TensorFlow
    counts it) and, once the runtime runs, this client's GPUs."""
    kind = None if device_type is None else str(device_type).upper()
    out = []
    if kind in (None, "CPU"):
        out.append(PhysicalDevice(name="/physical_device:CPU:0", device_type="CPU"))
    if kind in (None, "GPU") and is_initialized():
        out += [PhysicalDevice(name=f"/physical_device:GPU:{i}", device_type="GPU")
                for i in _builtins.range(num_local_devices("GPU"))]
    return out


def list_logical_devices(device_type=None):
    """tf.config.list_logical_devices: this client's devices by TensorFlow's names (starts the
    runtime, as TensorFlow's does)."""
    _ensure_init()
    kinds = ["CPU", "GPU"] if device_type is None else [str(device_type).upper()]
    out = []
    for kind in kinds:
        if kind not in _DEVICE_TYPES:
            raise ValueError(f"device_type {device_type!r} is not CPU or GPU")
        code = _DEVICE_TYPES[kind]
        out += [LogicalDevice(name=_device_name(_c.global_device_id(code, i), kind),
                              device_type=kind)
                for i in _builtins.range(num_local_devices(kind))]
    return out


def set_logical_device_configuration(device, logical_devices):
    """tf.config.set_logical_device_configuration: split the host CPU into
    ``len(logical_devices)`` CPU devices (per client). As in TensorFlow, only before the
    runtime starts: afterwards errors.FailedPreconditionError (a RuntimeError, as
    TensorFlow's), unless the runtime already has that many."""
    global _logical_cpus
    kind = getattr(device, "device_type", None)
    if kind != "CPU":
        raise ValueError(f"set_logical_device_configuration: {device!r} is not a CPU from "
                         f"list_physical_devices('CPU') (logical GPUs come from "
                         f"DTENSOR_CUDA_DEVICES)")
    if not isinstance(logical_devices, (list, tuple)) or not logical_devices or not all(
            isinstance(c, LogicalDeviceConfiguration) for c in logical_devices):
        raise TypeError("set_logical_device_configuration: logical_devices must be a "
                        "non-empty list of LogicalDeviceConfiguration")
    n = len(logical_devices)
    if is_initialized():
        if num_local_devices("CPU") != n:
            raise errors.FailedPreconditionError(
                f"Virtual devices cannot be modified after being initialized "
                               f"(the runtime has {num_local_devices('CPU')} CPU devices, "
                               f"{n} were asked for)")
        return
    _logical_cpus = n


config = _types.SimpleNamespace(
    list_physical_devices=list_physical_devices, list_logical_devices=list_logical_devices,
    set_logical_device_configuration=set_logical_device_configuration,
    LogicalDeviceConfiguration=LogicalDeviceConfiguration, PhysicalDevice=PhysicalDevice,
    LogicalDevice=LogicalDevice,
    experimental=_types.SimpleNamespace(
        set_virtual_device_configuration=set_logical_device_configuration,
        VirtualDeviceConfiguration=LogicalDeviceConfiguration))


def _ensure_init():
    if not _c.runtime_info()["initialized"]:
        initialize_accelerator_system()


@atexit.register
def _shutdown_at_exit():
    shutdown_accelerator_system()


def client_id():
    """This client's index (the MPI rank under mpiexec, else 0); known before the runtime
    starts, as TensorFlow's."""
    if not _c.runtime_info()["initialized"]:
        import os
        for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"):
            if os.environ.get(var, "").isdigit():
                return int(os.environ[var])
        return 0
    return _c.runtime_info()["client_id"]


def _launcher_size():
    """The clients an MPI launcher started (as the runtime will find them), before it runs."""
    import os
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


def num_clients():
    """How many clients run this program (MPI ranks under mpiexec, else 1); known before the
    runtime starts, as TensorFlow's, so that devices can be configured from it."""
    if not _c.runtime_info()["initialized"]:
        return _launcher_size()
    return _c.runtime_info()["num_clients"]


def _device_code(device_type):
    """The C device type of "CPU" / "GPU" (any case); ValueError or TypeError otherwise."""
    if not isinstance(device_type, str):
        raise TypeError(f"device_type must be 'CPU' or 'GPU', got {type(device_type).__name__}")
    if device_type.upper() not in _DEVICE_TYPES:
        raise ValueError(f"device_type {device_type!r} is not CPU or GPU")
    return _DEVICE_TYPES[device_type.upper()]


def num_local_devices(device_type="CPU"):
    kind = "cpu" if _device_code(device_type) == _c.DEVICE_CPU else "cuda"
    _ensure_init()
    return _c.runtime_info()["local_" + kind]


def num_global_devices(device_type="CPU"):
    kind = "cpu" if _device_code(device_type) == _c.DEVICE_CPU else "cuda"
    _ensure_init()
    return _c.runtime_info()["global_" + kind]


def local_devices(device_type="CPU"):
    """This client's devices as "CPU:<global id>" strings."""
    code = _device_code(device_type)
    _ensure_init()
    name = "CPU" if code == _c.DEVICE_CPU else "GPU"
    return [f"{name}:{_c.global_device_id(code, i)}"
            for i in _builtins.range(num_local_devices(device_type))]


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


def _allgather_json(value):
    """Every client's JSON-able value, in client order (collective): lengths first, then the
    texts padded to the longest (the C exchange needs one length on every client)."""
    data = _json.dumps(value).encode()
    longest = max(int.from_bytes(b, "little")
                  for b in _c.client_allgather(len(data).to_bytes(8, "little")))
    return [_json.loads(b) for b in _c.client_allgather(data.ljust(longest))]


_ERRORS = {"TypeError": TypeError, "ValueError": ValueError}


def _agree(error, payload=None):
    """Agree on local checks before a collective (collective): when any client's ``error`` (an
    exception or None) is set, every client raises, a failing client its own error and the
    others the first failing client's, naming it; otherwise every client's ``payload``, in
    client order."""
    verdicts = _allgather_json([None if error is None else [type(error).__name__, str(error)],
                                payload])
    for c, (err, _) in enumerate(verdicts):
        if err is not None:
            if error is not None:
                raise error
            raise _ERRORS.get(err[0], DTensorError)(f"client {c}: {err[1]}")
    return [p for _, p in verdicts]


# ---- mesh ------------------------------------------------------------------------------------

class Mesh:
    """Devices on named axes, in row-major order. Create with :func:`create_mesh`."""

    def __init__(self, handle, device_ids=None, name="", local=False):
        self._handle = handle
        info = _c.mesh_info(handle)
        self._names = tuple(info["names"])
        self._sizes = tuple(info["sizes"])
        self._local_ids = tuple(info["local_ids"])  # mesh ids of this client's devices
        self._device_type = "GPU" if info["device_type"] == "CUDA" else "CPU"
        # the runtime's global device id of each mesh device, in row-major order
        self._device_ids = tuple(info["device_ids"] if device_ids is None else device_ids)
        self._name = name
        self._local = local  # this client's alone: its tensors move to other meshes by host
        self._layouts = {}  # canonical layout text -> Layout, for op results
        _live.add(self)
        if not local:  # a client-local mesh (one replica's device) is no global mesh's twin
            _meshes[self._key()] = self

    def _key(self):
        return (self._names, self._sizes, self._device_type, self._device_ids)

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
        """This client's devices of the mesh as "CPU:<global device id>"."""
        return [f"{self._device_type}:{self._device_ids[i]}" for i in self._local_ids]

    def global_device_ids(self):
        """The global device id of every mesh device, shaped as the mesh."""
        return np.array(self._device_ids).reshape(self._sizes)

    @property
    def name(self):
        return self._name

    def to_string(self):
        """TensorFlow's text form, ``name|x=3,y=2|ids|local ids|local devices``: the third
        field holds the runtime's global device id of each mesh device (0..n-1 for a mesh over
        every device, as TensorFlow writes it), so :meth:`from_string` rebuilds the same
        placement; the local devices are this client's, by TensorFlow's device names."""
        dims = ",".join(f"{n}={s}" for n, s in zip(self._names, self._sizes))
        first = _c.global_device_id(_DEVICE_TYPES[self._device_type], 0)
        job = "localhost" if num_clients() == 1 else "worker"
        local = [f"/job:{job}/replica:0/task:{client_id()}/device:{self._device_type}:"
                 f"{self._device_ids[i] - first}" for i in self._local_ids]
        return "|".join([self._name, dims, ",".join(map(str, self._device_ids)),
                         ",".join(map(str, self._local_ids)), ",".join(local)])

    @staticmethod
    def from_string(mesh_str):
        """The mesh of a :meth:`to_string` text (TensorFlow's form; ``|x=2|*CPU`` means every
        CPU device). A live mesh with the same axes, type and devices is returned as is;
        otherwise one is created, which is collective."""
        if not isinstance(mesh_str, str):
            raise TypeError(f"Mesh.from_string: expected a string, got {type(mesh_str).__name__}")
        fields = mesh_str.strip().split("|")
        if len(fields) < 3:
            raise ValueError(f"cannot parse mesh {mesh_str!r}: expected "
                             f"'name|x=2,y=3|device ids|local ids|local devices'")
        dims = []
        for d in fields[1].split(","):
            n, eq, size = d.partition("=")
            if not eq or not size.strip().isdigit():
                raise ValueError(f"cannot parse mesh dimension {d!r} in {mesh_str!r}")
            dims.append((n.strip(), int(size)))
        ids_text = fields[2].strip()
        if ids_text.startswith("*"):
            kind, ids = ids_text[1:].upper() or "CPU", None
        else:
            found = _re.findall(r"device:([A-Za-z]+):", "|".join(fields[4:]))
            kind = found[0].upper() if found else "CPU"
            try:
                ids = tuple(int(i) for i in ids_text.split(","))
            except ValueError:
                raise ValueError(f"cannot parse device ids {ids_text!r} in {mesh_str!r}") \
                    from None
        if kind not in _DEVICE_TYPES:
            raise ValueError(f"device type {kind!r} in {mesh_str!r} is not CPU or GPU")
        kind = "GPU" if _DEVICE_TYPES[kind] == _c.DEVICE_CUDA else "CPU"
        key_ids = ids if ids is not None else tuple(
            _builtins.range(int(np.prod([s for _, s in dims]))))
        mesh = _meshes.get((tuple(n for n, _ in dims), tuple(s for _, s in dims), kind, key_ids))
        if mesh is not None:
            return mesh
        return _make_mesh(dims, kind, ids, fields[0])

    def __contains__(self, dim_name):
        return dim_name in self._names

    def __getitem__(self, dim_name):
        """The dimension ``(name, size)`` (TensorFlow's MeshDimension)."""
        return MeshDimension(dim_name, self.dim_size(dim_name))

    @property
    def strides(self):
        """Row-major strides of the mesh: a device's coordinates are (id // strides) % shape."""
        return [int(np.prod(self._sizes[k + 1:])) for k in _builtins.range(len(self._sizes))]

    def unravel_index(self):
        """{mesh device index: {dimension name: coordinate}} for every device of the mesh."""
        return {i: dict(zip(self._names, (int(c) for c in np.unravel_index(i, self._sizes))))
                for i in _builtins.range(self.size)}

    def coords(self, device_idx):
        """The mesh coordinates of device ``device_idx`` (an index into the mesh)."""
        return [int(c) for c in np.unravel_index(int(device_idx), self._sizes)]

    def local_device_locations(self):
        """The coordinates ({dimension name: index}) of this client's devices, in local
        order."""
        where = self.unravel_index()
        return [where[i] for i in self._local_ids]

    def min_global_device_id(self):
        return min(self._device_ids)

    def is_remote(self):
        """True when this client owns none of the mesh's devices."""
        return not self._local_ids

    def host_mesh(self):
        """The mesh's CPU twin (TensorFlow's host mesh): itself for a CPU mesh."""
        if self._device_type == "CPU":
            return self
        raise errors.UnimplementedError(f"host_mesh of {self}: a GPU mesh's host mesh")

    def __eq__(self, other):
        return isinstance(other, Mesh) and other._handle is self._handle

    def __hash__(self):
        return id(self._handle)

    def __repr__(self):
        dims = ",".join(f"{n}={s}" for n, s in zip(self._names, self._sizes))
        return f"Mesh({dims}, {self._device_type}:{self.size})"


_meshes = weakref.WeakValueDictionary()  # (names, sizes, type, device ids) -> live Mesh


class MeshDimension(_types.SimpleNamespace):
    """A mesh dimension: ``name`` and ``size``."""

    def __init__(self, name, size):
        super().__init__(name=name, size=size)

    def __iter__(self):
        return iter((self.name, self.size))


def _make_mesh(dims, kind, device_ids=None, name=""):
    """A Mesh over every device of the type, or over ``device_ids`` (collective)."""
    names, sizes = [], []
    for d in dims:
        if not isinstance(d, (list, tuple)) or len(d) != 2:
            raise TypeError(f"mesh dimension {d!r}: expected a (name, size) pair")
        n, size = d
        if not isinstance(n, str):
            raise TypeError(f"mesh dimension {d!r}: the name must be a string")
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise TypeError(f"mesh dimension {d!r}: the size must be an integer, got "
                            f"{type(size).__name__}")
        names.append(n)
        sizes.append(int(size))
    ids = None if device_ids is None else list(device_ids)
    return Mesh(_c.mesh_create(names, sizes, _DEVICE_TYPES[kind], ids), ids, name)


def _device_index(device, kind):
    """The device number of "CPU:3", "/device:CPU:3" or "/job:w/replica:0/task:1/device:CPU:3"
    and its task (None without one)."""
    m = _re.fullmatch(r"(?:.*/)?(?:device:)?([A-Za-z]+):(\d+)", str(device).strip())
    if not m or m.group(1).upper() not in _DEVICE_TYPES or \
            _DEVICE_TYPES[m.group(1).upper()] != _DEVICE_TYPES[kind]:
        raise ValueError(f"device {device!r} is not a {kind} device name like '{kind}:0'")
    task = _re.search(r"/task:(\d+)", str(device))
    return int(m.group(2)), None if task is None else int(task.group(1))


def _mesh_args(mesh_dims, device_type):
    _ensure_init()
    if mesh_dims is None:
        raise ValueError("mesh_dims is required, e.g. [('x', 6)]")
    kind = (device_type or "CPU").upper()
    if kind not in _DEVICE_TYPES:
        raise ValueError(f"device_type {device_type!r} is not CPU or GPU")
    return list(mesh_dims.items()) if isinstance(mesh_dims, dict) else list(mesh_dims), kind


def _check_order(devices, ids):
    if any(b <= a for a, b in zip(ids, ids[1:])):
        raise ValueError(
            f"devices {list(devices)} (global ids {list(ids)}) must be in increasing order "
            f"without repeats: each client's devices are one contiguous block of the mesh, so "
            f"another order cannot be honoured (list them in increasing order)")


def create_mesh(mesh_dims=None, mesh_name="", devices=None, device_type=None,
                use_xla_spmd=False):
    """A mesh over every device of the type on every client (collective).

    ``mesh_dims``: a list of ``(name, size)`` pairs or a dict. ``devices``, when given, lists
    the mesh's devices in row-major order, as global ids (``"CPU:3"``) or TensorFlow names with
    a task (``"/job:worker/replica:0/task:1/device:CPU:0"``: client 1's first device): a subset
    of the devices is fine; the order must be increasing (another order raises ValueError
    naming the devices, it is never silently replaced). ``use_xla_spmd`` is accepted for
    compatibility."""
    dims, kind = _mesh_args(mesh_dims, device_type)
    if devices is None:
        return _make_mesh(dims, kind, name=mesh_name)
    # a task's devices start at the sum of the earlier clients' device counts
    counts = _allgather_json(num_local_devices(kind))
    firsts = [sum(counts[:c]) for c in _builtins.range(len(counts))]
    ids, error = [], None
    try:
        for d in devices:
            i, task = _device_index(d, kind)
            if task is not None and not 0 <= task < len(firsts):
                raise ValueError(f"device {d!r}: task {task} is not one of the "
                                 f"{len(firsts)} clients")
            ids.append(i if task is None else firsts[task] + i)
        _check_order(devices, ids)
    except ValueError as e:
        error = e
    _agree(error)
    return _make_mesh(dims, kind, ids, mesh_name)


def create_distributed_mesh(mesh_dims, mesh_name="", local_devices=None, device_type=None,
                            use_xla_spmd=False):
    """A mesh spanning the clients (collective). ``local_devices``, when given, lists this
    client's devices of the mesh by local number (``"CPU:0"`` is this client's first device);
    the mesh takes every client's list in client order (a client may list none), each in
    increasing order; without it, every device of every client."""
    if local_devices is None:
        return create_mesh(mesh_dims, mesh_name=mesh_name, device_type=device_type)
    dims, kind = _mesh_args(mesh_dims, device_type)
    ids, error = [], None
    try:
        local = [_device_index(d, kind)[0] for d in local_devices]
        for d, i in zip(local_devices, local):
            if not 0 <= i < num_local_devices(kind):
                raise ValueError(f"local device {d!r} is not one of this client's "
                                 f"{num_local_devices(kind)} {kind} devices")
        ids = [_c.global_device_id(_DEVICE_TYPES[kind], i) for i in local]
        _check_order(local_devices, ids)
    except ValueError as e:
        error = e
    every = [i for client_ids in _agree(error, ids) for i in client_ids]
    return _make_mesh(dims, kind, every, mesh_name)


# ---- layout ----------------------------------------------------------------------------------

def _rank_arg(rank):
    """A tensor rank: an integer in 0..8; TypeError or ValueError otherwise."""
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise TypeError(f"rank must be an integer, got {type(rank).__name__}")
    if not 0 <= rank <= 8:
        raise ValueError(f"rank {rank} is outside 0..8")
    return int(rank)


class Layout:
    """Per tensor axis the mesh dimension that shards it, or ``UNSHARDED``.

    ``partial`` names mesh dimensions holding pending reductions, e.g. ``{"y": "sum"}`` (one
    reduction for all of them)."""

    def __init__(self, sharding_specs, mesh, partial=None):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh must be a dtensor.Mesh, got {type(mesh).__name__}")
        if isinstance(sharding_specs, str) or not isinstance(sharding_specs, (list, tuple)):
            raise TypeError(f"sharding_specs must be a list of mesh dimension names or "
                            f"UNSHARDED, got {type(sharding_specs).__name__}")
        if not all(isinstance(sp, str) for sp in sharding_specs):
            raise TypeError(f"sharding_specs {list(sharding_specs)}: each entry is a mesh "
                            f"dimension name or UNSHARDED")
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
        return cls([UNSHARDED] * _rank_arg(rank), mesh)

    @classmethod
    def fully_replicated(cls, mesh, rank):
        return cls.replicated(mesh, rank)

    @classmethod
    def batch_sharded(cls, mesh, batch_dim, rank, axis=0):
        specs = [UNSHARDED] * _rank_arg(rank)
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or \
                not -len(specs) <= axis < len(specs):
            raise ValueError(f"batch_sharded: axis {axis!r} is not an axis of rank {rank}")
        specs[axis] = batch_dim
        return cls(specs, mesh)

    @classmethod
    def inner_sharded(cls, mesh, inner_dim, rank):
        return cls.batch_sharded(mesh, inner_dim, rank, axis=rank - 1)

    @classmethod
    def from_string(cls, layout_str, mesh=None):
        """Parse TensorFlow's form ``"sharding_specs:x,unsharded, mesh:|x=2|0,1|0,1|..."``
        (the mesh is found among the live meshes, or created: see :meth:`Mesh.from_string`),
        or the short form ``"x,unsharded"`` (optionally ``";partial_sum=y"``) on ``mesh``."""
        if not isinstance(layout_str, str):
            raise TypeError(f"Layout.from_string: expected a string, got "
                            f"{type(layout_str).__name__}")
        if mesh is not None and not isinstance(mesh, Mesh):
            raise TypeError(f"Layout.from_string: mesh must be a dtensor.Mesh, got "
                            f"{type(mesh).__name__}")
        text = layout_str.strip()
        if text.startswith("sharding_specs:"):
            specs, sep, mesh_str = text[len("sharding_specs:"):].partition(", mesh:")
            if not sep:
                raise ValueError(f"cannot parse layout {layout_str!r}: no ', mesh:'")
            carried = Mesh.from_string(mesh_str)
            if mesh is not None and mesh is not carried:
                raise ValueError(f"layout {layout_str!r} is on {carried}, not on {mesh}")
            mesh, text = carried, specs
        if mesh is None:
            raise ValueError(f"layout {layout_str!r} carries no mesh: pass mesh=")
        text, _, partial = text.replace(" ", "").partition(";")
        specs = text.split(",") if text else []
        parts = {}
        if partial:
            op, _, axes = partial.partition("=")
            if not op.startswith("partial_"):
                raise ValueError(f"cannot parse layout {layout_str!r}")
            parts = {a: op[len("partial_"):] for a in axes.split("+")}
        return cls(specs, mesh, partial=parts)

    def to_string(self):
        """TensorFlow's form: ``"sharding_specs:x,unsharded, mesh:<Mesh.to_string()>"`` (partial
        axes, an extension, follow the specs as in the short form)."""
        return f"sharding_specs:{self._text}, mesh:{self._mesh.to_string()}"

    def short_string(self):
        """The short form ``"x,unsharded"`` (``";partial_sum=y"`` for partial axes)."""
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

    @property
    def shape(self):
        """The number of shards of each tensor axis (TensorFlow's Layout.shape)."""
        return [self.num_shards(i) for i in _builtins.range(self.rank)]

    def delete(self, dims):
        """The layout without the tensor axes ``dims`` (its sharding of the others kept)."""
        dims = {int(d) % self.rank if self.rank else int(d) for d in dims}
        return Layout([s for i, s in enumerate(self.sharding_specs) if i not in dims],
                      self.mesh)

    def is_fully_replicated(self):
        return not self._partial and all(s == UNSHARDED for s in self._specs)

    def num_shards(self, idx):
        """How many shards split tensor axis ``idx`` (1 when unsharded)."""
        if isinstance(idx, bool) or not isinstance(idx, (int, np.integer)):
            raise TypeError(f"num_shards: axis must be an integer, got {type(idx).__name__}")
        if not -len(self._specs) <= idx < len(self._specs):
            raise ValueError(f"num_shards: axis {idx} is outside the layout's rank "
                             f"{len(self._specs)}")
        spec = self._specs[idx]
        return 1 if spec == UNSHARDED else self._mesh.dim_size(spec)

    def local_shape(self, global_shape, device):
        """(local shape, global offset) of a global device's shard; uneven splits allowed."""
        shape = _shape_arg(global_shape, "Layout.local_shape")
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)) or \
                not 0 <= device < self._mesh.size:
            raise ValueError(f"Layout.local_shape: device {device!r} is not one of the mesh's "
                             f"{self._mesh.size}")
        return _c.layout_local_shape(self._mesh._handle, self._text, shape, int(device))

    def __eq__(self, other):
        return (isinstance(other, Layout) and other._mesh == self._mesh
                and other._text == self._text)

    def __hash__(self):
        return hash((self._text, id(self._mesh._handle)))

    def __repr__(self):
        return f"Layout({self._text!r}, {self._mesh})"


# ---- tensors ---------------------------------------------------------------------------------

class _OutOfRange(errors.InvalidArgumentError, IndexError):
    """An index outside a tensor: TensorFlow's InvalidArgumentError, and an IndexError as
    Python's sequences raise."""


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
        if isinstance(tensors, (DTensor, DVariable, np.ndarray)) or \
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
    t = _as_tensor(tensor, "to_dlpack: tensor")
    return t._one_component().__dlpack__()


def _from_dlpack_capsule(dlcapsule):
    """tf.experimental.dlpack.from_dlpack: a regular tensor (this client's host mesh) whose
    memory is a DLPack capsule's (or a ``__dlpack__`` object's, as numpy's and PyTorch's
    arrays), without a copy; CPU memory only. Not collective: only this client takes part."""
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
    tensor = _as_tensor(tensor, "gather: tensor")
    out = np.empty(tensor.shape, dtype=tensor.dtype)
    _c.tensor_to_host(tensor._handle, -1, _raw(out))
    return out


def fetch_layout(tensor):
    """The layout of a DTensor or a DVariable."""
    if not isinstance(tensor, (DTensor, DVariable)):
        raise TypeError(f"fetch_layout: expected a DTensor, got {type(tensor).__name__}")
    return tensor.layout


def check_layout(tensor, layout):
    """Raise ValueError unless the tensor has this layout."""
    if fetch_layout(tensor) != _layout_arg(layout, "check_layout"):
        raise ValueError(f"layout mismatch: tensor has {tensor.layout}, expected {layout}")


# ---- ops -------------------------------------------------------------------------------------
#
# Every op is collective (every client calls it in the same order) and returns a DTensor. The
# engine chooses the result's layout by its cost model unless one is requested with
# call_with_layout (a hard constraint, as in TensorFlow). Creation ops need a mesh: they take it
# from the requested layout, else from default_mesh / run_on (replicated).

_state = _threading.local()


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


def _layout_of(text, mesh):
    """The Layout of a canonical text on a mesh, cached on the mesh (results of ops)."""
    layout = mesh._layouts.get(text)
    if layout is None:
        layout = mesh._layouts[text] = Layout.from_string(text, mesh)
    return layout


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
    if isinstance(x, (DTensor, DVariable)):
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
    if isinstance(tensors, (DTensor, DVariable)) or not isinstance(tensors, (list, tuple)):
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
    like = next((t for t in tensors if isinstance(t, (DTensor, DVariable))), None)
    out = [_value(t) if isinstance(t, (DTensor, DVariable)) else
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
    return isinstance(tensor, (DTensor, DVariable))


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
    if isinstance(value, (DTensor, DVariable)):
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


def _number(value, what):
    """A Python number of a number, a numpy scalar or a one-element tensor; TypeError else."""
    if isinstance(value, (DTensor, DVariable)):
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
    if isinstance(shape, (DTensor, DVariable)):
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


def _value(x):
    """A DVariable's current value; anything else as it is."""
    return x.value() if isinstance(x, DVariable) else x


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
    if isinstance(x, (DTensor, DVariable)):
        return _value(x)
    if isinstance(x, _Symbolic) or isinstance(like, _Symbolic):
        raise _SymbolicOperand()
    like = _value(like)
    a = _host_array(x, None if isinstance(x, np.ndarray) else like.dtype, what)
    rep = Layout.replicated(like.layout.mesh, a.ndim)
    if a.ndim == 0:
        return _create("fill", [], a.dtype, rep, a=float(a))
    return dtensor_from_array(a, rep)


def matmul(a, b, transpose_a=False, transpose_b=False):
    """a @ b with optional transposes of the last two axes; leading batch axes allowed."""
    return _apply("matmul", [a, b], int(bool(transpose_a)), int(bool(transpose_b)))


def _unary(code):
    def op(x):
        return _apply("unary", (x,), code)
    return op


neg = negative = _unary(_c.UNARY_NEG)
abs = _unary(_c.UNARY_ABS)  # noqa: A001 (tf.abs)
exp = _unary(_c.UNARY_EXP)
log = _unary(_c.UNARY_LOG)
sqrt = _unary(_c.UNARY_SQRT)
relu = _unary(_c.UNARY_RELU)
tanh = _unary(_c.UNARY_TANH)
sigmoid = _unary(_c.UNARY_SIGMOID)
square = _unary(_c.UNARY_SQUARE)
sin = _unary(_c.UNARY_SIN)
cos = _unary(_c.UNARY_COS)
erf = _unary(_c.UNARY_ERF)
silu = swish = _unary(_c.UNARY_SILU)
rsqrt = _unary(_c.UNARY_RSQRT)
logical_not = _unary(_c.UNARY_LOGICAL_NOT)
_gelu_erf = _unary(_c.UNARY_GELU)
_gelu_tanh = _unary(_c.UNARY_GELU_TANH)


def gelu(features, approximate=False):
    """tf.nn.gelu: x Phi(x) with the normal distribution's Phi (erf form), or its tanh
    approximation when ``approximate``."""
    return (_gelu_tanh if approximate else _gelu_erf)(features)


def _binary(code):
    def op(a, b):
        if not isinstance(a, (DTensor, DVariable)) and not isinstance(b, (DTensor, DVariable)):
            a = _as_tensor(a, "x")  # two Python values: TensorFlow's conversion
        if type(a) is not DTensor:
            a = _as_dtensor(a, b)
        if type(b) is not DTensor:
            b = _as_dtensor(b, a)
        return _apply("binary", (a, b), code)
    return op


add = _binary(_c.BINARY_ADD)
subtract = _binary(_c.BINARY_SUB)
multiply = _binary(_c.BINARY_MUL)
_divide = _binary(_c.BINARY_DIV)  # integers truncate
floordiv = _binary(_c.BINARY_FLOORDIV)
floormod = mod = _binary(_c.BINARY_FLOORMOD)
maximum = _binary(_c.BINARY_MAX)
minimum = _binary(_c.BINARY_MIN)
pow = _binary(_c.BINARY_POW)  # noqa: A001 (tf.pow)
equal = _binary(_c.BINARY_EQ)
not_equal = _binary(_c.BINARY_NE)
less = _binary(_c.BINARY_LT)
less_equal = _binary(_c.BINARY_LE)
greater = _binary(_c.BINARY_GT)
greater_equal = _binary(_c.BINARY_GE)
logical_and = _binary(_c.BINARY_LOGICAL_AND)
logical_or = _binary(_c.BINARY_LOGICAL_OR)
logical_xor = _binary(_c.BINARY_LOGICAL_XOR)


def where(condition, x=None, y=None):
    """tf.where(condition, x, y): x where the bool condition holds, else y; the three broadcast
    as numpy does and x and y are promoted to one dtype. (The one-argument form, the indices
    of true elements, has a data-dependent shape and is not supported.)"""
    if x is None or y is None:
        raise errors.UnimplementedError("where(condition) without x and y (indices of the true "
                                  "elements) is not supported: its shape depends on the data")
    like = next((v for v in (x, y, condition) if isinstance(v, (DTensor, DVariable))), None)
    if like is None:
        raise TypeError("where: no operand is a DTensor")
    like = _value(like)
    c = condition if isinstance(condition, (DTensor, DVariable)) else \
        _as_dtensor(np.asarray(condition, dtype=bool), like)
    x = x if isinstance(x, (DTensor, DVariable)) else _as_dtensor(x, like)
    y = y if isinstance(y, (DTensor, DVariable)) else _as_dtensor(y, like)
    return _apply("where", (c, x, y))


def _reduce(code):
    def op(input_tensor, axis=None, keepdims=False):
        if axis is None:
            axes = []
        elif isinstance(axis, (list, tuple)):
            axes = [int(a) for a in axis]
        else:
            axes = [int(axis)]
        if axis is not None and not axes:
            raise ValueError("reduce over an empty list of axes")
        return _apply("reduce", [input_tensor], code, axes, int(bool(keepdims)))
    return op


def truediv(x, y):
    """x / y as TensorFlow's truediv: integer operands are converted to float64 first (so
    7 / 2 is 3.5); floats divide in their dtype."""
    if not isinstance(x, (DTensor, DVariable)) and not isinstance(y, (DTensor, DVariable)):
        x = _as_tensor(x, "truediv: x")
    x, y = (v if isinstance(v, (DTensor, DVariable)) else _as_dtensor(v, w)
            for v, w in ((x, y), (y, x)))
    if np.issubdtype(x.dtype, np.integer):
        x, y = cast(x, np.float64), cast(y, np.float64)
    return _divide(x, y)


divide = truediv

reduce_sum = _reduce(_c.REDUCE_SUM)
_reduce_mean = _reduce(_c.REDUCE_MEAN)


def reduce_mean(input_tensor, axis=None, keepdims=False):
    """The mean; of an integer tensor, the integer sum divided by the count, truncated as
    TensorFlow's integer mean."""
    x = _as_tensor(input_tensor, "reduce_mean: input_tensor")
    if not np.issubdtype(x.dtype, np.integer):
        return _reduce_mean(x, axis, keepdims)
    total = reduce_sum(x, axis, keepdims)  # checks the axes
    axes = _builtins.range(x.ndim) if axis is None else \
        (axis if isinstance(axis, (list, tuple)) else [axis])
    count = int(np.prod([x.shape[int(a)] for a in axes], dtype=np.int64))
    return _divide(total, count)


reduce_max = _reduce(_c.REDUCE_MAX)
reduce_min = _reduce(_c.REDUCE_MIN)
reduce_prod = _reduce(_c.REDUCE_PROD)


# ---- row-wise ops: softmax, normalization, arg reductions, running sums ----------------------
# One C op each (spmd/ops/softmax.c, norm.c, arg_reduce.c, cumsum.c): along a sharded axis only
# the per-row statistics cross devices (all-reduces of [rows, 1], an all-gather of (value, index)
# records or of shard totals), never x itself.

def softmax(logits, axis=-1):
    """tf.nn.softmax: exp(x - max) / sum exp(x - max) along ``axis`` (floating x)."""
    return _apply("softmax", [logits], 0, [int(axis)], 0)


def log_softmax(logits, axis=-1):
    """tf.nn.log_softmax: x - max - log sum exp(x - max) along ``axis`` (floating x)."""
    return _apply("softmax", [logits], 1, [int(axis)], 0)


def reduce_logsumexp(input_tensor, axis=None, keepdims=False):
    """tf.math.reduce_logsumexp: log sum exp(x) over ``axis`` (None: every axis), computed as
    max + log sum exp(x - max)."""
    if axis is None:
        axes = []
    elif isinstance(axis, (list, tuple)):
        axes = [int(a) for a in axis]
        if not axes:
            raise ValueError("reduce_logsumexp over an empty list of axes")
    else:
        axes = [int(axis)]
    return _apply("softmax", [input_tensor], 2, axes, int(bool(keepdims)))


def _norm(code, x, params, epsilon):
    x = _as_tensor(x, "layer_norm/rms_norm: x")
    tensors, flag = [x], 0
    for bit, p in params:
        if p is not None:
            tensors.append(p if isinstance(p, (DTensor, DVariable)) else _as_dtensor(p, x))
            flag |= bit
    return _apply("norm", tensors, code, flag, float(epsilon))


def layer_norm(x, gamma=None, beta=None, epsilon=1e-5):
    """Layer normalization over the last axis: (x - mean) / sqrt(var + epsilon) * gamma + beta
    (gamma and beta of shape [last], either may be None). As Keras' LayerNormalization(axis=-1).
    """
    return _norm(0, x, ((1, gamma), (2, beta)), epsilon)


def rms_norm(x, gamma=None, epsilon=1e-6):
    """RMS normalization over the last axis: x / sqrt(mean(x^2) + epsilon) * gamma."""
    return _norm(1, x, ((1, gamma),), epsilon)


def _arg_reduce(code):
    def op(input, axis=None, output_type=int64):  # noqa: A002 (TensorFlow's names)
        axis = 0 if axis is None else int(axis)  # TensorFlow's default axis is 0
        return _apply("arg_reduce", [input], code, [axis, _code(output_type)])
    return op


argmax = _arg_reduce(0)
argmax.__doc__ = """tf.math.argmax: the index of the largest element along ``axis`` (the first on
ties, the first NaN as numpy), as ``output_type`` (int64 or int32); any dtype."""
argmin = _arg_reduce(1)
argmin.__doc__ = """tf.math.argmin: the index of the smallest element along ``axis``."""


def cumsum(x, axis=0, exclusive=False, reverse=False):
    """tf.math.cumsum: running sums along ``axis``; ``exclusive`` leaves each element out of its
    own sum, ``reverse`` sums from the end (numeric dtypes; integers wrap)."""
    return _apply("cumsum", [x], int(axis), int(bool(exclusive)) | (int(bool(reverse)) << 1))


def transpose(a, perm=None):
    a = _as_tensor(a, "transpose: a")
    perm = list(reversed(_builtins.range(a.ndim))) if perm is None else [int(p) for p in perm]
    return _apply("transpose", [a], 0, perm)


def reshape(tensor, shape):
    """tf.reshape; one extent may be -1 (inferred from the others)."""
    shape = [int(d) for d in (np.asarray(shape).reshape(-1).tolist()
                              if isinstance(shape, (np.ndarray, DTensor)) else shape)]
    if -1 in shape:
        t = _as_tensor(tensor, "reshape: tensor")
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        total = int(np.prod(t.shape, dtype=np.int64))
        if shape.count(-1) > 1 or known == 0 or total % known:
            raise ValueError(f"reshape: cannot infer the -1 of {shape} for {total} elements "
                             f"(shape {t.shape})")
        shape[shape.index(-1)] = total // known
        tensor = t
    return _apply("reshape", [tensor], 0, shape)


def slice(input_, begin, size):  # noqa: A001 (tf.slice)
    """input_[begin[i] : begin[i] + size[i]]; size -1 takes the rest of the axis."""
    input_ = _as_tensor(input_, "slice: input_")
    begin, size = [int(b) for b in begin], [int(s) for s in size]
    if len(begin) != input_.ndim or len(size) != input_.ndim:
        raise ValueError(f"slice: begin has {len(begin)} entries and size {len(size)}, the "
                         f"tensor rank {input_.ndim}")
    size = [input_.shape[i] - begin[i] if s == -1 else s for i, s in enumerate(size)]
    return _apply("slice", [input_], 0, begin, size)


def concat(values, axis):
    return _apply("concat", values, int(axis))


# ---- shape and index ops ---------------------------------------------------------------------

def _int_dtensor(x, like, what):
    """Integer ids or indices: a DTensor as it is; arrays and lists become replicated DTensors on
    like's mesh (int32, or int64 when given so)."""
    if isinstance(x, (DTensor, DVariable)):
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
    like = next((_value(v) for v in inputs if isinstance(v, (DTensor, DVariable))), None)
    if like is None:
        like = _as_tensor(inputs[0], "einsum: operand 0")
    ops = [_as_dtensor(v, like, f"einsum: operand {i}") for i, v in enumerate(inputs)]
    return _apply("einsum", ops, str(equation))


def stack(values, axis=0):
    """tf.stack: tensors of one shape joined along a new axis (block exchanges, no gather)."""
    if isinstance(values, (DTensor, DVariable)) or not isinstance(values, (list, tuple)):
        raise TypeError(f"stack: expected a list of tensors, got {type(values).__name__}")
    if not values:
        raise ValueError("stack: the list of values is empty")
    like = next((_value(v) for v in values if isinstance(v, (DTensor, DVariable))), None)
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


def _layout_arg(layout, what):
    if not isinstance(layout, Layout):
        raise TypeError(f"{what}: layout must be a dtensor.Layout, got {type(layout).__name__}")
    return layout


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
    if not isinstance(tensor, (DTensor, DVariable)) or _value(tensor).layout.mesh._local or \
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
            if not isinstance(other, (DTensor, DVariable, int, float, bool, np.ndarray,
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


# ---- variables -------------------------------------------------------------------------------

class DVariable:
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


# ---- functions (tf.function) -----------------------------------------------------------------

class _Untraceable(Exception):
    """Raised while tracing at a step a traced function cannot record (the function then runs
    as Python)."""


class _Trace:
    """The function being recorded on this thread: the concrete tensors and the variables its
    ops use become inputs of their own (captures), bound at every run, as tf.function captures
    them: a tensor by value, a variable by reference (its value when the function runs)."""

    def __init__(self, f):
        self.f = f
        self.bound = {}  # id(concrete DTensor or DVariable) -> (it, its symbolic input)
        self.captures = []  # () -> the concrete DTensor to bind, in input order

    def _input(self, layout, dtype, shape):
        t = DTensor(_c.function_input(self.f, layout.mesh._handle, layout._text, _code(dtype),
                                      list(shape)), layout)
        return t

    def symbolic(self, t):
        """An operand as this function's tensor: a concrete one is captured (by value)."""
        if t._local_shapes is None:
            return t
        hit = self.bound.get(id(t))
        if hit is None:
            hit = self.bound[id(t)] = (t, self._input(t.layout, t.dtype, t.shape))
            self.captures.append(lambda t=t: t)
        return hit[1]

    def variable(self, v):
        """A read of a variable: an input bound to its value at each run."""
        hit = self.bound.get(id(v))
        if hit is None:
            hit = self.bound[id(v)] = (v, self._input(v.layout, v.dtype, v.shape))
            self.captures.append(v.read_value)
        return hit[1]


def _tracing():
    return getattr(_state, "trace", None)


def _no_trace(what):
    """Raise _Untraceable for a side effect a trace would perform once, at trace time."""
    if _tracing() is not None:
        raise _Untraceable(what)


def _flatten_outputs(out):
    """A traced function's result as (its tensors, a rebuild of the structure from their
    values): DTensors and variables (read) in lists, tuples and dicts; None when anything else
    is in it."""
    if isinstance(out, (DTensor, DVariable)):
        return [out], lambda vals: vals[0]
    if isinstance(out, (list, tuple)):
        parts = [_flatten_outputs(v) for v in out]
        if any(p is None for p in parts):
            return None
        flat, sizes = [], []
        for f, _ in parts:
            flat.extend(f)
            sizes.append(len(f))

        def rebuild(vals, kind=type(out)):
            items, at = [], 0
            for (_, r), n in zip(parts, sizes):
                items.append(r(vals[at:at + n]))
                at += n
            return kind(items) if kind in (list, tuple) else kind(*items)
        return flat, rebuild
    if isinstance(out, dict):
        keys = list(out)
        inner = _flatten_outputs([out[k] for k in keys])
        if inner is None:
            return None
        return inner[0], lambda vals: dict(zip(keys, inner[1](vals)))
    return None


class Function:
    """A traced function (tf.function): the first call with a new input signature (layouts,
    dtypes, shapes) records the ops, propagates layouts and expands once; later calls only
    run. Concrete tensors the function uses are captured by value, variables it reads by
    reference, as TensorFlow captures them. A function that a trace cannot record (one that
    assigns variables, reads values on the host, calls strategy.run or a GradientTape, or
    returns something other than tensors) runs as the Python function it wraps for that
    signature; the first such call runs its Python code twice (the trace, then the run)."""

    def __init__(self, fn):
        self._fn = fn
        self._traces = {}
        self._eager = set()  # signatures whose trace failed: they run as Python
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", "function")

    @staticmethod
    def _signature(args):
        return tuple((a.layout._text, id(a.layout.mesh._handle), str(a.dtype), a.shape)
                     for a in args)

    def _trace(self, args):
        """The trace of this signature, or None when the function cannot be traced."""
        sig = self._signature(args)
        if sig in self._traces:
            return self._traces[sig]
        f = _c.function_begin()
        trace = _Trace(f)
        _state.trace = trace
        try:
            inputs = [trace._input(a.layout, a.dtype, a.shape) for a in args]
            flat = _flatten_outputs(self._fn(*inputs))
            outs = [trace.variable(o) if isinstance(o, DVariable) else trace.symbolic(o)
                    for o in flat[0]] if flat else None
        except Exception:  # noqa: BLE001 (the eager run raises a real error again)
            outs = None
        finally:
            _state.trace = None
        if not outs:
            f.free()
            return None
        _c.function_end(f, [o._handle for o in outs])
        trace = (f, len(outs), flat[1], [o.layout.mesh for o in outs], trace.captures)
        self._traces[sig] = trace
        return trace

    def __call__(self, *args, **kwargs):
        # traced when it has arguments and every one is a DTensor; otherwise (strategy.run
        # inside, PerReplica, Python or no arguments), under a GradientTape (which records the
        # ops one by one) and inside another trace (which records its ops) it runs as the
        # Python function it wraps
        if kwargs or not args or _tape._tapes() or _replicas.current() is not None or \
                _tracing() is not None or not all(isinstance(a, DTensor) for a in args):
            return self._fn(*args, **kwargs)
        sig = self._signature(args)
        trace = None if sig in self._eager else self._trace(args)
        if trace is None:
            self._eager.add(sig)
            return self._fn(*args)
        f, n, rebuild, meshes, captures = trace
        bound = list(args) + [c() for c in captures]
        results = [_result(h, m) for h, m in zip(_c.function_run(f, [a._handle for a in bound],
                                                                 n), meshes)]
        return rebuild(results)

    def _traced(self, args, what):
        trace = self._trace(args)
        if trace is None:
            raise errors.UnimplementedError(
                f"{what}: {self.__name__} cannot be traced (it assigns variables, reads values "
                f"on the host or returns something other than tensors); it runs as Python")
        return trace

    def program(self, *args):
        """The expanded program for these arguments' signature as text, with its totals:
        (text, multiplies summed over devices, collectives, largest bytes a device sends)."""
        return _c.function_program(self._traced(args, "program")[0])


def function(fn=None):
    """Decorator like tf.function: ``@dtensor.function``."""
    return Function(fn) if fn is not None else Function


# ---- collectives and the communication ledger ------------------------------------------------

def set_collective_algorithm(mesh, algorithm):
    """'auto', 'ring', 'nccl', 'hierarchical_copy' or 'reduction_to_one_device' (every client
    must set the same before its next collective on the mesh)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"set_collective_algorithm: mesh must be a dtensor.Mesh, got "
                        f"{type(mesh).__name__}")
    _c.mesh_set_algorithm(mesh._handle, algorithm)


def ledger_text():
    """This client's communication ledger as a table, per step."""
    return _c.ledger(False)


def ledger():
    """This client's communication ledger: {"client", "dropped", "entries": [...]}."""
    import json
    return json.loads(_c.ledger(True))


def ledger_clear():
    _c.ledger_clear()


def ledger_next_step():
    return _c.ledger_next_step()


# ---- training: gradients, models, optimizers -------------------------------------------------

def _function_gradient(self, loss_output, wrt, *args):
    """A Function computing this one's outputs followed by the gradients of the sum of output
    ``loss_output`` with respect to the inputs at positions ``wrt``, each in that input's
    layout (weight gradients of batch-sharded data come out all-reduced by the expansion)."""
    f, _, _, meshes, captures = self._traced(args, "gradient")
    g = _c.function_gradient(f, int(loss_output), [int(i) for i in wrt])
    grad = Function(self._fn)
    n = len(meshes) + len(wrt)
    grad._traces[self._signature(args)] = (g, n, list, meshes + [args[i].layout.mesh
                                                                  for i in wrt], captures)
    return grad


Function.gradient = _function_gradient

_ACTIVATIONS = {None: _c.ACTIVATION_NONE, "linear": _c.ACTIVATION_NONE,
                "relu": _c.ACTIVATION_RELU, "tanh": _c.ACTIVATION_TANH,
                "sigmoid": _c.ACTIVATION_SIGMOID}
_INITIALIZERS = {"zeros": _c.INIT_ZEROS, "ones": _c.INIT_ONES,
                 "glorot_uniform": _c.INIT_GLOROT_UNIFORM, "random_normal": _c.INIT_RANDOM_NORMAL}
_LOSSES = {"mean_squared_error": _c.LOSS_MEAN_SQUARED_ERROR, "mse": _c.LOSS_MEAN_SQUARED_ERROR,
           "softmax_cross_entropy": _c.LOSS_SOFTMAX_CROSS_ENTROPY,
           "categorical_crossentropy": _c.LOSS_SOFTMAX_CROSS_ENTROPY,
           "binary_cross_entropy": _c.LOSS_BINARY_CROSS_ENTROPY,
           "binary_crossentropy": _c.LOSS_BINARY_CROSS_ENTROPY}


def _lookup(table, name, what):
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; one of {sorted(k for k in table if k)}")
    return table[name]


class Dense:
    """A dense layer config (keras.layers.Dense): y = activation(x @ kernel + bias)."""

    def __init__(self, units, activation=None, use_bias=True, kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", kernel_regularizer_l2=0.0):
        self.config = (int(units), _lookup(_ACTIVATIONS, activation, "activation"),
                       _lookup(_INITIALIZERS, kernel_initializer, "initializer"),
                       _lookup(_INITIALIZERS, bias_initializer, "initializer"),
                       0 if use_bias else 1, float(kernel_regularizer_l2))


class Sequential:
    """A sequential model of Dense layers on inputs [batch, input_features]. Created inside a
    strategy's scope, its variables take that strategy's layouts (collective)."""

    def __init__(self, layers, input_features, dtype=np.float32, seed=0):
        if not isinstance(layers, (list, tuple)) or not all(isinstance(l, Dense) for l in layers):
            raise TypeError("Sequential: layers must be a list of dtensor.Dense")
        _ensure_init()
        self._handle = _c.model_create(int(input_features), [l.config for l in layers],
                                       _code(dtype), int(seed))
        self._strategy = _current_strategy()
        self.dtype = np.dtype(dtype)
        _live.add(self)

    @property
    def variable_names(self):
        return _c.model_variables(self._handle)

    def get_weights(self):
        """Every variable's value as a numpy array (collective gather)."""
        out = []
        for i in _builtins.range(len(self.variable_names)):
            h = _c.model_variable_read(self._handle, i)
            dtype, shape, _ = _c.tensor_meta(h)
            a = np.empty(shape, dtype=_NUMPY[dtype])
            _c.tensor_to_host(h, -1, _raw(a))
            h.free()
            out.append(a)
        return out

    def __call__(self, x):
        return _result(_c.model_predict(self._handle, x._handle), x.layout.mesh)

    def evaluate(self, x, y, loss="mean_squared_error"):
        return _c.model_evaluate(self._handle, _lookup(_LOSSES, loss, "loss"), x._handle,
                                 y._handle)

    def train_step(self, x, y, loss, optimizer):
        """One step of the tf.distribute custom training loop (per-replica losses / global
        batch, gradients, optimizer update); returns the step's loss (SUM over replicas)."""
        s = self._strategy._handle if self._strategy else None
        return _c.train_step(s, self._handle, _lookup(_LOSSES, loss, "loss"),
                             optimizer._handle, x._handle, y._handle)


class Optimizer:
    """An optimizer over DVariables (the C dt_optimizer: slots kept per variable in its
    layout). ``apply_gradients(zip(grads, variables))`` updates them; inside
    ``strategy.run`` it first sums every replica's gradients (all-reduce, as TensorFlow's
    MirroredStrategy does), then updates the mirrored variables once."""

    def __init__(self, kind, learning_rate, momentum=0.0, nesterov=False, beta_1=0.0,
                 beta_2=0.0, epsilon=0.0, weight_decay=0.0, rho=0.0):
        kinds = (_c.OPTIMIZER_SGD, _c.OPTIMIZER_ADAM, _c.OPTIMIZER_ADAMW, _c.OPTIMIZER_RMSPROP)
        if isinstance(kind, bool) or kind not in kinds:
            raise ValueError(f"Optimizer: kind {kind!r} is not one of {kinds} (use SGD, Adam, "
                             f"AdamW or RMSprop)")
        numbers = [_number(v, f"Optimizer: {n}") for n, v in (
            ("learning_rate", learning_rate), ("momentum", momentum), ("beta_1", beta_1),
            ("beta_2", beta_2), ("epsilon", epsilon), ("weight_decay", weight_decay),
            ("rho", rho))]
        self._lr = float(numbers[0])
        self._handle = _c.optimizer_create(kind, self._lr, float(numbers[1]),
                                           bool(nesterov), *[float(v) for v in numbers[2:]])
        self.iterations = 0
        self._kind = kind
        momentum_, b1, b2, eps, wd, rho_ = (float(v) for v in numbers[1:])
        self._hyper = {"momentum": momentum_, "nesterov": bool(nesterov), "beta_1": b1 or 0.9,
                       "beta_2": b2 or 0.999, "epsilon": eps or 1e-7, "weight_decay": wd,
                       "rho": rho_ or 0.9}
        _live.add(self)
        # made in a parameter-server strategy's scope: its slots live on the ps tasks too
        strategy = _current_strategy()
        self._ps_slots = {}  # id(PSVariable) -> its slot variables on the ps tasks
        self._ps_step = None
        if isinstance(strategy, ParameterServerStrategy):
            self._ps_step = _SharedCounter(strategy)
            strategy._optimizers.append(self)
            for ref in strategy._ps_variables:
                if ref() is not None:
                    self._add_ps_slots(ref())

    def _slot_count(self):
        if self._kind == _c.OPTIMIZER_SGD:
            return 1 if self._hyper["momentum"] > 0 else 0
        if self._kind == _c.OPTIMIZER_RMSPROP:
            return 2 if self._hyper["momentum"] > 0 else 1
        return 2

    def _add_ps_slots(self, v):
        """The slots of a parameter-server variable, made on the ps tasks when the variable or
        the optimizer is (collective: every client makes them in the same order)."""
        self._ps_slots[id(v)] = [
            PSVariable(np.zeros(v.shape, v.dtype), trainable=False,
                       name=f"{v.name}/{'mv'[k]}", _slot=True)
            for k in _builtins.range(self._slot_count())]

    def _ps_update(self, pairs):
        """Updates of parameter-server variables by a worker, Keras's rules on the host: it
        reads each variable and its slots, computes the new values and adds the differences
        one-sidedly (the ps tasks are not locked, so concurrent workers' updates interleave,
        as asynchronous training's do)."""
        h, lr = self._hyper, self._lr
        t = None
        if self._kind in (_c.OPTIMIZER_ADAM, _c.OPTIMIZER_ADAMW):
            t = self._ps_step.fetch_add(1) + 1  # the cluster's update count, as TF's iterations
        for v, g in pairs:
            slots = self._ps_slots.get(id(v))
            if slots is None:
                raise DTensorError(f"apply_gradients: {v.name!r} lives on the ps tasks but the "
                                   f"optimizer was not made in the strategy's scope (its slots "
                                   f"must live there too)")
            g = np.asarray(_read(_value(g)), dtype=v.dtype)
            w = v._host()
            old = [sl._host() for sl in slots]
            new = list(old)
            if self._kind == _c.OPTIMIZER_SGD:
                if slots:
                    new[0] = h["momentum"] * old[0] - lr * g
                    step = h["momentum"] * new[0] - lr * g if h["nesterov"] else new[0]
                    nw = w + step
                else:
                    nw = w - lr * g
            elif self._kind == _c.OPTIMIZER_RMSPROP:
                new[0] = h["rho"] * old[0] + (1 - h["rho"]) * g * g
                d = lr * g / np.sqrt(new[0] + h["epsilon"])
                if len(slots) > 1:
                    new[1] = h["momentum"] * old[1] + d
                    d = new[1]
                nw = w - d
            else:
                base = w * (1 - lr * h["weight_decay"]) if self._kind == _c.OPTIMIZER_ADAMW \
                    else w
                new[0] = h["beta_1"] * old[0] + (1 - h["beta_1"]) * g
                new[1] = h["beta_2"] * old[1] + (1 - h["beta_2"]) * g * g
                lr_t = lr * np.sqrt(1 - h["beta_2"] ** t) / (1 - h["beta_1"] ** t)
                nw = base - lr_t * new[0] / (np.sqrt(new[1]) + h["epsilon"])
            for sl, a, b in zip(slots, old, new):
                sl._add_host(np.asarray(b - a, dtype=v.dtype))
            v._add_host(np.asarray(nw - w, dtype=v.dtype))

    @property
    def learning_rate(self):
        """The learning rate as Keras shows it, a scalar variable (``numpy()``, ``assign``,
        ``float()``); assigning ``optimizer.learning_rate = x`` sets it for the next updates
        (every client alike)."""
        return _LearningRate(self)

    @learning_rate.setter
    def learning_rate(self, value):
        lr = float(_number(value, "Optimizer: learning_rate"))
        _c.optimizer_set_learning_rate(self._handle, lr)
        self._lr = lr

    lr = learning_rate  # Keras 2's name

    def get_config(self):
        """The constructor's arguments (Keras's get_config): what a saved model recompiles
        with."""
        return dict(getattr(self, "_config", {}), learning_rate=self._lr)

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def apply_gradients(self, grads_and_vars):
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        for g, v in pairs:
            if not isinstance(v, DVariable):
                raise TypeError(f"apply_gradients: {v!r} is not a DVariable")
        ctx = _replicas.current()
        if ctx is not None:
            strategy = ctx.strategy

            def merge(payloads):
                summed = [_replicas._sum_replicas(strategy, [p[j] for p in payloads], "SUM")
                          for j in _builtins.range(len(pairs))]
                self._update([v for _, v in pairs], summed)
                return [None] * len(payloads)
            ctx._runner.sync(ctx._local, ("apply_gradients", id(self)), merge,
                             [g for g, _ in pairs])
        else:
            self._update([v for _, v in pairs], [_value(g) for g, _ in pairs])
        return self.iterations

    def minimize(self, loss, var_list, tape):
        """apply_gradients of tape.gradient(loss, var_list)."""
        return self.apply_gradients(zip(tape.gradient(loss, var_list), var_list))

    def _update(self, variables, grads):
        _no_trace("an optimizer's update")
        ps = [(v, g) for v, g in zip(variables, grads) if isinstance(v, PSVariable)]
        if ps:
            self._ps_update(ps)
            pairs = [(v, g) for v, g in zip(variables, grads) if not isinstance(v, PSVariable)]
            variables, grads = [v for v, _ in pairs], [g for _, g in pairs]
            if not variables:
                self.iterations += 1
                return
        fitted = []
        for v, g in zip(variables, grads):
            if g.layout.mesh is not v.layout.mesh:
                g = copy_to_mesh(g, v.layout)
            elif g.layout != v.layout:
                g = relayout(g, v.layout)
            fitted.append(g)
        _c.optimizer_apply(self._handle, [v._handle for v in variables],
                           [g._handle for g in fitted])
        for v in variables:
            v._version += 1
        self.iterations += 1


class _LearningRate:
    """An optimizer's learning rate, shown as Keras's scalar variable."""

    def __init__(self, optimizer):
        self._optimizer = optimizer

    def numpy(self):
        return np.float32(self._optimizer._lr)

    def assign(self, value):
        self._optimizer.learning_rate = value
        return self

    def __float__(self):
        return float(self._optimizer._lr)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.numpy(), dtype=dtype)

    def __format__(self, spec):
        return format(self.numpy(), spec)

    def __eq__(self, other):
        return float(self) == other

    __hash__ = None

    def __repr__(self):
        return (f"<dtensor.Variable 'learning_rate:0' shape=() dtype=float32, "
                f"numpy={self.numpy()}>")


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__truediv__", "__rtruediv__", "__lt__", "__le__", "__gt__", "__ge__", "__neg__"):
    setattr(_LearningRate, _name,
            lambda self, *other, _name=_name: getattr(float(self), _name)(*other))


class SGD(Optimizer):
    def __init__(self, learning_rate=0.01, momentum=0.0, nesterov=False):
        self._config = {"momentum": momentum, "nesterov": nesterov}
        super().__init__(_c.OPTIMIZER_SGD, learning_rate, momentum, nesterov)


class Adam(Optimizer):
    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
        self._config = {"beta_1": beta_1, "beta_2": beta_2, "epsilon": epsilon}
        super().__init__(_c.OPTIMIZER_ADAM, learning_rate, 0.0, False, beta_1, beta_2, epsilon)


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Keras's AdamW): each update first shrinks a variable by
    learning_rate * weight_decay of itself, then takes Adam's step."""

    def __init__(self, learning_rate=0.001, weight_decay=0.004, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-7):
        if not weight_decay > 0:
            raise ValueError(f"AdamW: weight_decay {weight_decay}, expected > 0 (Adam has none)")
        self._config = {"weight_decay": weight_decay, "beta_1": beta_1, "beta_2": beta_2,
                        "epsilon": epsilon}
        super().__init__(_c.OPTIMIZER_ADAMW, learning_rate, 0.0, False, beta_1, beta_2, epsilon,
                         weight_decay)


class RMSprop(Optimizer):
    """Keras's RMSprop (not centered): a running mean of squared gradients scales each step."""

    def __init__(self, learning_rate=0.001, rho=0.9, momentum=0.0, epsilon=1e-7,
                 centered=False):
        if centered:
            raise errors.UnimplementedError("RMSprop: centered=True is not supported")
        self._config = {"rho": rho, "momentum": momentum, "epsilon": epsilon}
        super().__init__(_c.OPTIMIZER_RMSPROP, learning_rate, momentum, False, 0.0, 0.0,
                         epsilon, 0.0, rho)


# ---- strategies (tf.distribute) --------------------------------------------------------------

class ReduceOp:
    SUM = "SUM"
    MEAN = "MEAN"


_strategy_stack = _threading.local()


def _current_strategy():
    stack = getattr(_strategy_stack, "items", [])
    return stack[-1] if stack else None


class Strategy:
    """A tf.distribute strategy as a layout preset: a 1-D mesh "batch", variables replicated
    (or sharded on the ps tasks), inputs batch-sharded. Collective to create."""

    _kind = _c.STRATEGY_DEFAULT

    def __init__(self, *, fixed_shards=0, min_shard_bytes=0, max_shards=0, device_type="CPU",
                 device=0, first_device=0, num_devices=0):
        _ensure_init()
        self._handle = self._create(self._kind, int(fixed_shards), int(min_shard_bytes),
                                    int(max_shards), _DEVICE_TYPES[device_type], int(device),
                                    int(first_device), int(num_devices))
        info = _c.strategy_info(self._handle)
        self._replicas = info["replicas"]
        self._cluster = info["cluster"]
        self.mesh = Mesh(info["mesh"])
        self.mesh._owner = self  # the mesh lives as long as the strategy
        # central storage keeps the variables on a mesh of their own (device 0)
        self.variable_mesh = self.mesh
        if info["variable_mesh"] is not None:
            self.variable_mesh = Mesh(info["variable_mesh"])
            self.variable_mesh._owner = self
        self._init_replicas()
        _live.add(self)

    _create = staticmethod(_c.strategy_create)

    @property
    def num_replicas_in_sync(self):
        return self._replicas

    @_contextlib.contextmanager
    def scope(self):
        """Models created inside take this strategy's layouts."""
        _c.strategy_scope(self._handle, True)
        stack = getattr(_strategy_stack, "items", [])
        _strategy_stack.items = stack + [self]
        try:
            yield self
        finally:
            _strategy_stack.items = stack
            _c.strategy_scope(self._handle, False)

    def input_layout(self, rank):
        return _layout_of(_c.strategy_layouts(self._handle, _rank_arg(rank))[1], self.mesh)

    def variable_layout(self, rank):
        return _layout_of(_c.strategy_layouts(self._handle, _rank_arg(rank))[0],
                          self.variable_mesh)

    def distribute_batch(self, batch):
        """A global batch (the full array, on every client) as one DTensor in the input layout
        (collective): each device keeps its rows; a batch that does not divide by the
        replicas gives uneven shards. The SPMD form of a distributed batch (Model.fit's)."""
        a = np.ascontiguousarray(batch)
        return dtensor_from_array(a, self.input_layout(a.ndim))

    # ---- the replica contract (dtensor/_replicas.py) ----

    def _init_replicas(self):
        local = self.mesh.local_device_ids()
        self._replica_meshes = {}
        # mirrored and parameter-server meshes are each client's own: their reductions and
        # metrics involve this client alone
        self._client_local = num_clients() > 1 and self._kind in (
            _c.STRATEGY_MIRRORED, _c.STRATEGY_PARAMETER_SERVER)
        if self._kind == _c.STRATEGY_DEFAULT:  # one replica, computed alike by every client
            self._local_replicas, self._first_replica = 1, 0
            counts = [1]
        elif self._kind == _c.STRATEGY_PARAMETER_SERVER:
            # a worker is one replica (TensorFlow's with CPU workers): strategy.run calls fn
            # once, on the worker's first device
            self._replicas = self._local_replicas = 1
            self._first_replica = 0
            counts = [1]
        else:
            self._local_replicas = len(local)
            self._first_replica = 0 if self._client_local or not local else local[0]
            # a client-local mesh (mirrored, parameter server) is this client's alone
            shared = num_clients() > 1 and not self._client_local
            counts = _allgather_json(self._local_replicas) if shared else [self._local_replicas]
        # the clients that own replicas each feed one input pipeline
        owners = [c > 0 for c in counts]
        missing = [c for c, own in enumerate(owners) if not own]
        self._run_refusal = None  # why strategy.run cannot run here (the same on every client)
        if missing:
            self._run_refusal = (f"clients {missing} own no device of {type(self).__name__}'s "
                                 f"mesh {self.mesh}, so they have no replica to run")
        elif self.variable_mesh is not self.mesh and num_clients() > 1:
            self._run_refusal = (f"the variables live on {self.variable_mesh}, of which "
                                 f"clients other than 0 own no device to read them from")
        self._num_clients_in_sync = max(1, sum(owners))
        self._client_index = sum(owners[:client_id()]) if len(owners) > 1 else 0

    def _replica_mesh(self, i):
        """A client-local 1-device mesh over local replica i's device (not collective)."""
        mesh = self._replica_meshes.get(i)
        if mesh is None:
            kind = self.mesh.device_type()
            gid = self.mesh._device_ids[self.mesh.local_device_ids()[i]]
            index = gid - _c.global_device_id(_DEVICE_TYPES[kind], 0)
            mesh = Mesh(_c.mesh_create_local(["replica"], [1], _DEVICE_TYPES[kind], index),
                        (gid,), local=True)
            self._replica_meshes[i] = mesh
        return mesh

    def _replica_tensor(self, array, i):
        a = _host_array(array, what="a per-replica value")
        return dtensor_from_array(a, Layout.replicated(self._replica_mesh(i), a.ndim))

    def _to_replica(self, value, i):
        """What replica i sees of a value: its part of a PerReplica, its component of a
        DTensor on the strategy's mesh, a variable as it is (its reads give the replica's
        copy), anything else unchanged."""
        if isinstance(value, _replicas.PerReplica):
            return value.values[i]
        if isinstance(value, DTensor) and value.layout.mesh is self.mesh:
            shape = value._local_shapes[i]
            a = np.empty(shape, dtype=value.dtype)
            _c.tensor_to_host(value._handle, i, _raw(a))
            return self._replica_tensor(a, i)
        return value

    def _variable_replica(self, var, i):
        """Replica i's copy of a variable, on its device, cached until the variable changes."""
        key = (id(self), i)
        cached = var._replicas.get(key)
        if cached is not None and cached[0] == var._version:
            return cached[1]
        mesh = var.layout.mesh
        if not var.layout.is_fully_replicated():
            raise DTensorError(f"variable {var.name!r} has layout {var.layout._text!r}: "
                               f"inside strategy.run a replica reads a whole copy, so the "
                               f"variable must be replicated")
        if mesh.num_local_devices() == 0:
            raise DTensorError(f"variable {var.name!r} lives on {mesh}, of which this client "
                               f"owns no device: its replicas cannot read it inside "
                               f"strategy.run")
        a = np.empty(var.shape, dtype=var.dtype)
        own = mesh.local_device_ids()
        _c.tensor_to_host(var._handle, i if mesh is self.mesh and i < len(own) else 0, _raw(a))
        t = self._replica_tensor(a, i)
        var._replicas[key] = (var._version, t)
        return t

    def run(self, fn, args=(), kwargs=None):
        """tf.distribute's Strategy.run: ``fn(*args, **kwargs)`` once per local replica, with
        the replica's part of each PerReplica argument (and of each DTensor on this
        strategy's mesh); results come back as PerReplica values (in their structure).
        Collective when fn makes cross-replica calls."""
        return _replicas.run(self, fn, args, kwargs)

    def reduce(self, reduce_op, value, axis=None):
        """SUM or MEAN over the replicas (collective), a replicated DTensor: of PerReplica
        values (scalars or tensors of one shape; ``axis`` reduces along that axis of each
        replica's value first, MEAN then dividing by the total extent, uneven batches
        included); of a DTensor on the strategy's mesh with ``axis`` (along it, globally); a
        value that is the same on every replica comes back for MEAN (SUM raises with more
        than one replica), as TensorFlow's."""
        return _replicas.reduce(self, reduce_op, value, axis)

    def experimental_local_results(self, value):
        """This client's replicas' values: a tuple (a DTensor per replica; one item for a
        value that is not per-replica); of a structure (list, tuple, dict) holding PerReplica
        values, one structure per replica, as TensorFlow's."""
        if isinstance(value, _replicas.PerReplica):
            return value.values
        if isinstance(value, (list, tuple, dict)) and _replicas._holds_per_replica(value):
            return tuple(_replicas._map(lambda v, i=i: v.values[i] if isinstance(
                v, _replicas.PerReplica) else v, value)
                for i in _builtins.range(self._local_replicas))
        if self._kind == _c.STRATEGY_DEFAULT:
            return (value,)
        if isinstance(value, DVariable) and not isinstance(value, PSVariable) and \
                value.layout.mesh is self.variable_mesh and value.layout.is_fully_replicated():
            # a mirrored variable: one copy per local replica (central storage's one)
            return tuple(self._variable_replica(value, i)
                         for i in _builtins.range(min(self._local_replicas,
                                                      value.layout.mesh.num_local_devices())))
        if isinstance(value, DTensor) and value.layout.mesh is self.mesh:
            return tuple(self._to_replica(value, i) for i in _builtins.range(self._local_replicas))
        return (value,)

    experimental_run_v2 = property(lambda self: self.run)  # TensorFlow 2.0's name of run

    def gather(self, value, axis):
        """Every replica's part of ``value`` (a PerReplica, or a DTensor on this strategy's
        mesh) concatenated along ``axis``, as a regular tensor on this client (the "current
        device"), as tf.distribute.Strategy.gather; a value that is not distributed comes back
        as it is. Collective when the replicas span clients."""
        if isinstance(value, _replicas.PerReplica):
            return _as_tensor(_replicas._gather_replicas(self, value.values, int(axis)))
        if isinstance(value, (DTensor, DVariable)) and _value(value).layout.mesh is self.mesh \
                and self._kind != _c.STRATEGY_DEFAULT:
            return _as_tensor(gather(_value(value)))
        return value

    @property
    def extended(self):
        """tf.distribute.StrategyExtended's queries: ``variable_created_in_scope``,
        ``worker_devices``, ``parameter_devices``."""
        return _StrategyExtended(self)

    def experimental_distribute_dataset(self, dataset, options=None):
        """The dataset's global batches split over the replicas (auto-sharded: each client
        keeps its replicas' rows); iterate it for PerReplica batches."""
        return _replicas.DistributedDataset(self, dataset)

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        """``dataset_fn(InputContext)`` called once on this client; its elements are
        per-replica batches, one per local replica each step."""
        return _replicas.DistributedDatasetFromFunction(self, dataset_fn)

    # TensorFlow 2.2's name
    experimental_distribute_datasets_from_function = distribute_datasets_from_function

    def experimental_distribute_values_from_function(self, value_fn):
        """PerReplica values ``value_fn(ValueContext)`` for each local replica."""
        values = []
        for i in _builtins.range(self._local_replicas):
            v = value_fn(_replicas.ValueContext(self._first_replica + i,
                                                self.num_replicas_in_sync))
            values.append(v if isinstance(v, DTensor) else self._replica_tensor(v, i))
        return _replicas.PerReplica(values)

    def make_experimental_numpy_dataset(self, numpy_input):
        """A dataset of the rows of numpy arrays (a tuple of arrays: tuples of rows)."""
        return data.Dataset.from_tensor_slices(numpy_input)

    def __repr__(self):
        return f"{type(self).__name__}(num_replicas_in_sync={self._replicas}, mesh={self.mesh})"


class _StrategyExtended:
    """strategy.extended (tf.distribute.StrategyExtended)."""

    def __init__(self, strategy):
        self._strategy = strategy

    def variable_created_in_scope(self, v):
        """Whether ``v`` was created in this strategy's scope."""
        return getattr(v, "_scope", None) is self._strategy

    @property
    def worker_devices(self):
        """TensorFlow's names of this client's replicas' devices."""
        s = self._strategy
        return tuple(_mesh_device(s._replica_mesh(i)) for i in _builtins.range(s._local_replicas))

    @property
    def parameter_devices(self):
        """TensorFlow's names of the devices that hold the variables (this client's)."""
        m = self._strategy.variable_mesh
        return tuple(_device_name(m._device_ids[i], m.device_type())
                     for i in m.local_device_ids())


def _parse_device(device):
    """("CPU" or "GPU", device number, task or None) of "/cpu:1", "GPU:0", "/job:w/replica:0/
    task:1/device:CPU:2"."""
    m = _re.fullmatch(r"(?:.*/)?(?:device:)?([A-Za-z]+):(\d+)", str(device).strip())
    kind = m.group(1).upper() if m else None
    if kind not in ("CPU", "GPU"):
        raise ValueError(f"device {device!r} is not a device name like '/cpu:1' or 'GPU:0'")
    task = _re.search(r"/task:(\d+)", str(device))
    return kind, int(m.group(2)), None if task is None else int(task.group(1))


class OneDeviceStrategy(Strategy):
    """One replica on one device (tf.distribute.OneDeviceStrategy): "/cpu:1" or "CPU:1" is
    global device 1, "/job:worker/replica:0/task:1/device:CPU:0" client 1's first device.
    Collective; every client names the same device."""

    _kind = _c.STRATEGY_ONE_DEVICE

    def __init__(self, device="/cpu:0"):
        _ensure_init()
        kind, index, task = _parse_device(device)
        if task is not None:
            counts = _allgather_json(num_local_devices(kind))
            if task >= len(counts):
                raise ValueError(f"device {device!r}: task {task} is not one of the "
                                 f"{len(counts)} clients")
            index += sum(counts[:task])
        self.device = device
        super().__init__(device_type=kind, device=index)


class CrossDeviceOps:
    """How a mirrored strategy's replicas exchange (tf.distribute.CrossDeviceOps): the
    collective algorithm its mesh uses (set_collective_algorithm)."""

    _algorithm = "auto"


class NcclAllReduce(CrossDeviceOps):
    """NCCL all-reduce: needs GPU devices (a CPU strategy refuses it at creation)."""

    _algorithm = "nccl"

    def __init__(self, num_packs=1):
        self.num_packs = num_packs


class HierarchicalCopyAllReduce(CrossDeviceOps):
    """Reduce inside each client, one exchange across clients, copy back."""

    _algorithm = "hierarchical_copy"

    def __init__(self, num_packs=1):
        self.num_packs = num_packs


class ReductionToOneDevice(CrossDeviceOps):
    """Reduce onto one device, then broadcast from it."""

    _algorithm = "reduction_to_one_device"

    def __init__(self, reduce_to_device=None, accumulation_fn=None):
        self.reduce_to_device, self.accumulation_fn = reduce_to_device, accumulation_fn


class MirroredStrategy(Strategy):
    """Replicas on this client's devices, or on ``devices`` (consecutive local devices of one
    type, e.g. ["/gpu:0", "/gpu:1"]); ``cross_device_ops`` picks the exchange. Collective."""

    _kind = _c.STRATEGY_MIRRORED

    def __init__(self, devices=None, cross_device_ops=None):
        _ensure_init()
        kind, first, count = "CPU", 0, 0
        if devices is not None:
            parsed = [_parse_device(d) for d in devices]
            kinds = {k for k, _, _ in parsed}
            local = [i for _, i, _ in parsed]
            if len(kinds) != 1 or local != list(_builtins.range(local[0], local[0] +
                                                                len(local))):
                raise ValueError(f"MirroredStrategy(devices={list(devices)}): consecutive "
                                 f"local devices of one type, in increasing order")
            kind, first, count = kinds.pop(), local[0], len(local)
        super().__init__(device_type=kind, first_device=first, num_devices=count)
        if cross_device_ops is not None:
            if not isinstance(cross_device_ops, CrossDeviceOps):
                raise TypeError(f"cross_device_ops must be a CrossDeviceOps, got "
                                f"{type(cross_device_ops).__name__}")
            set_collective_algorithm(self.mesh, _algorithm_for(self.mesh,
                                                               cross_device_ops._algorithm))
        self.cross_device_ops = cross_device_ops


def _algorithm_for(mesh, algorithm):
    """NCCL is a hint, as TensorFlow takes it: on CPU devices the ring instead."""
    return "ring" if algorithm == "nccl" and mesh.device_type() == "CPU" else algorithm


class CommunicationImplementation:
    """tf.distribute.experimental.CommunicationImplementation (also under its TensorFlow 2.0
    name, CollectiveCommunication)."""

    AUTO = "auto"
    RING = "ring"
    NCCL = "nccl"


CollectiveCommunication = CommunicationImplementation


class CommunicationOptions:
    """tf.distribute.experimental.CommunicationOptions: ``implementation`` picks the
    collective algorithm of the strategy's mesh; ``timeout_seconds`` is the runtime's
    (DTENSOR_TIMEOUT, set at initialisation) and ``bytes_per_pack`` is not used."""

    def __init__(self, bytes_per_pack=0, timeout_seconds=None,
                 implementation=CommunicationImplementation.AUTO):
        impl = str(getattr(implementation, "value", implementation)).lower().split(".")[-1]
        if impl not in ("auto", "ring", "nccl"):
            raise ValueError(f"implementation must be AUTO, RING or NCCL, got "
                             f"{implementation!r}")
        self.bytes_per_pack, self.timeout_seconds, self.implementation = \
            bytes_per_pack, timeout_seconds, impl


class MultiWorkerMirroredStrategy(Strategy):
    """Replicas on every device of every client; the cluster comes from TF_CONFIG (one worker
    or chief task per client, checked against the ranks) as in TensorFlow."""

    _kind = _c.STRATEGY_MULTI_WORKER_MIRRORED

    def __init__(self, cluster_resolver=None, communication_options=None, communication=None):
        if communication is not None:  # TensorFlow 2.0-2.3's argument
            if communication_options is not None:
                raise ValueError("MultiWorkerMirroredStrategy: pass communication_options or "
                                 "the older communication, not both")
            communication_options = CommunicationOptions(implementation=communication)
        if communication_options is not None and \
                not isinstance(communication_options, CommunicationOptions):
            raise TypeError(f"communication_options must be a CommunicationOptions, got "
                            f"{type(communication_options).__name__}")
        super().__init__()
        if communication_options is not None:
            set_collective_algorithm(self.mesh, _algorithm_for(
                self.mesh, communication_options.implementation))
        self.communication_options = communication_options
        self._resolver = cluster_resolver

    @property
    def cluster_resolver(self):
        """The cluster resolver (TensorFlow's): the one passed in, else TF_CONFIG's, with this
        client's ``task_type`` and ``task_id`` and ``cluster_spec()``; without TF_CONFIG the
        clients are the workers (a single client's task_type is None, as TensorFlow's)."""
        if self._resolver is not None:
            return self._resolver
        import os
        r = TFConfigClusterResolver()
        c = self._cluster
        r.num_workers = c["workers"] + c["chief"]
        if not os.environ.get("TF_CONFIG"):  # the runtime's cluster (the ranks' tasks)
            r._cluster = {}
            if num_clients() > 1:
                if c["chief"]:
                    r._cluster["chief"] = ["rank:0"]
                r._cluster["worker"] = [f"rank:{c['chief'] + i}"
                                        for i in _builtins.range(c["workers"])]
            r.task_type = c["task_type"] if num_clients() > 1 else None
        r.task_id = c["task_index"]
        return r


class CentralStorageStrategy(Strategy):
    _kind = _c.STRATEGY_CENTRAL_STORAGE


class FixedShardsPartitioner:
    """tf.distribute.experimental.partitioners.FixedShardsPartitioner: num_shards shards
    (at most one per row)."""

    def __init__(self, num_shards):
        if int(num_shards) < 1:
            raise ValueError(f"num_shards must be at least 1, got {num_shards}")
        self._c_args = {"fixed_shards": int(num_shards)}

    def __call__(self, shape, dtype):
        return [min(self._c_args["fixed_shards"], int(shape[0]))] + [1] * (len(shape) - 1)


class MinSizePartitioner:
    """As many shards as keep each at least min_shard_bytes, at most max_shards (TF's)."""

    def __init__(self, min_shard_bytes=256 << 10, max_shards=1, bytes_per_string=16):
        if int(min_shard_bytes) < 1 or int(max_shards) < 1:
            raise ValueError(f"min_shard_bytes ({min_shard_bytes}) and max_shards ({max_shards}) "
                             f"must be positive")
        self._c_args = {"min_shard_bytes": int(min_shard_bytes), "max_shards": int(max_shards)}

    def __call__(self, shape, dtype):
        total = int(np.prod(shape)) * np.dtype(dtype).itemsize
        n = min(self._c_args["max_shards"], total // self._c_args["min_shard_bytes"],
                int(shape[0]))
        return [max(1, n)] + [1] * (len(shape) - 1)


class MaxSizePartitioner:
    """As few shards as keep each at most max_shard_bytes, at most max_shards (TF's)."""

    def __init__(self, max_shard_bytes, max_shards=None, bytes_per_string=16):
        if int(max_shard_bytes) < 1 or (max_shards is not None and int(max_shards) < 1):
            raise ValueError(f"max_shard_bytes ({max_shard_bytes}) and max_shards ({max_shards}) "
                             f"must be positive")
        self._c_args = {"max_shard_bytes": int(max_shard_bytes),
                        "max_shards": int(max_shards or 0)}

    def __call__(self, shape, dtype):
        total = int(np.prod(shape)) * np.dtype(dtype).itemsize
        n = -(-total // self._c_args["max_shard_bytes"])
        if self._c_args["max_shards"]:
            n = min(n, self._c_args["max_shards"])
        return [max(1, min(n, int(shape[0])))] + [1] * (len(shape) - 1)


class ClusterSpec:
    """tf.train.ClusterSpec: the tasks of each job (``as_dict()``, ``jobs``, ``num_tasks``,
    ``task_address``, ``job_tasks``); equal to another ClusterSpec or dict of the same jobs."""

    def __init__(self, cluster):
        if isinstance(cluster, ClusterSpec):
            cluster = cluster.as_dict()
        if not isinstance(cluster, dict):
            raise TypeError(f"ClusterSpec needs a dict of job name -> task addresses, got "
                            f"{type(cluster).__name__}")
        self._cluster = {str(k): list(v.values()) if isinstance(v, dict) else list(v)
                         for k, v in cluster.items()}

    def as_dict(self):
        return {k: list(v) for k, v in self._cluster.items()}

    @property
    def jobs(self):
        return list(self._cluster)

    def num_tasks(self, job_name):
        return len(self.job_tasks(job_name))

    def job_tasks(self, job_name):
        if job_name not in self._cluster:
            raise ValueError(f"no such job in the cluster: {job_name!r}")
        return list(self._cluster[job_name])

    def task_address(self, job_name, task_index):
        tasks = self.job_tasks(job_name)
        if not 0 <= task_index < len(tasks):
            raise ValueError(f"job {job_name!r} has no task {task_index}")
        return tasks[task_index]

    def __eq__(self, other):
        if isinstance(other, dict):
            other = ClusterSpec(other)
        return isinstance(other, ClusterSpec) and other._cluster == self._cluster

    def __bool__(self):
        return bool(self._cluster)

    def __repr__(self):
        return f"ClusterSpec({self._cluster})"


class TFConfigClusterResolver:
    """tf.distribute.cluster_resolver.TFConfigClusterResolver over the TF_CONFIG environment
    variable: cluster_spec(), task_type, task_id, rpc_layer, num_accelerators()."""

    def __init__(self, task_type=None, task_id=None, rpc_layer=None):
        import os
        config = _json.loads(os.environ.get("TF_CONFIG") or "{}")
        task = config.get("task", {})
        self._cluster = {k: list(v) for k, v in config.get("cluster", {}).items()}
        self.task_type = task_type if task_type is not None else task.get("type")
        self.task_id = task_id if task_id is not None else task.get("index")
        self.rpc_layer = rpc_layer if rpc_layer is not None else config.get("rpc_layer")

    def cluster_spec(self):
        return ClusterSpec(self._cluster)

    def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
        return {"GPU": num_local_devices("GPU")} if num_local_devices("GPU") else {}


class ParameterServerStrategy(Strategy):
    """Variables created in its scope live on the ps tasks, split by ``variable_partitioner``,
    and the workers update them asynchronously; a ClusterCoordinator schedules functions onto
    the workers. The cluster comes from TF_CONFIG or DTENSOR_CLUSTER (ranks take the tasks in
    the order chief, worker, ps, evaluator); every client runs the same program. An evaluator
    task takes part in creation, join and shutdown and otherwise waits: side-car evaluation
    of checkpoints is not supported (dtensor has no checkpoints yet)."""

    _kind = _c.STRATEGY_PARAMETER_SERVER

    def __init__(self, cluster_resolver=None, variable_partitioner=None):
        if variable_partitioner is not None and not hasattr(variable_partitioner, "_c_args"):
            raise TypeError(f"variable_partitioner must be a FixedShardsPartitioner, "
                            f"MinSizePartitioner or MaxSizePartitioner, got "
                            f"{type(variable_partitioner).__name__}")
        args = dict(variable_partitioner._c_args) if variable_partitioner else {}
        self._max_shard_bytes = args.pop("max_shard_bytes", 0)
        self._ps_variables = []  # weak references, in creation order (the same everywhere)
        self._optimizers = []  # made in this scope: they keep slots of the ps variables
        super().__init__(**args)
        error = None
        if cluster_resolver is not None and cluster_resolver.task_type is not None and \
                (cluster_resolver.task_type, cluster_resolver.task_id) != \
                (self.task_type, self.task_index):
            error = ValueError(f"the cluster resolver says task {cluster_resolver.task_type}:"
                               f"{cluster_resolver.task_id}, this client is "
                               f"{self.task_type}:{self.task_index}")
        _agree(error)
        self.cluster_resolver = cluster_resolver

    def _create(self, *args):
        return _c.strategy_create(*args, int(self._max_shard_bytes))

    @property
    def task_type(self):
        return self._cluster["task_type"]

    @property
    def task_index(self):
        return self._cluster["task_index"]

    def pull(self, model):
        """Copy the ps tasks' current values into the model's local variables."""
        _c.ps_pull(self._handle, model._handle)


class _Shard:
    """One shard of a variable on the ps tasks (as a ShardedVariable's variables)."""

    def __init__(self, ps_task, row0, rows, shape):
        self.ps_task, self.offset = ps_task, row0
        self.shape = (rows,) + tuple(shape[1:])
        self.device = f"/job:ps/replica:0/task:{ps_task}/device:CPU:0"

    def __repr__(self):
        return f"<shard rows {self.offset}..{self.offset + self.shape[0]} on {self.device}>"


class PSVariable(DVariable):
    """A variable on the ps tasks (what DVariable(...) makes inside a ParameterServerStrategy
    scope): its shards live in MPI windows on the ps tasks; any client reads the whole value
    and adds to it one-sidedly (assign_add is an MPI accumulate, so the workers' updates do not
    wait for each other). Creation is collective."""

    def __init__(self, initial_value, trainable=True, name=None, dtype=None, layout=None,
                 _slot=False):
        strategy = _current_strategy()
        if not isinstance(strategy, ParameterServerStrategy):
            raise errors.FailedPreconditionError(
                "PSVariable: create it in a ParameterServerStrategy's scope (dtensor.Variable "
                "there makes one)")
        if callable(initial_value):
            initial_value = initial_value()
        # Python values as TensorFlow converts them (0 is int32, 0. float32)
        a = _host_array(initial_value, dtype, "Variable: initial_value")
        init = dtensor_from_array(a, Layout.replicated(strategy.mesh, a.ndim))
        self._handle = _c.ps_variable_create(strategy._handle, init._handle)
        self._layout, self._shape, self._dtype = init.layout, TensorShape(a.shape), a.dtype
        self.trainable, self.name = trainable, name or "Variable"
        self._version, self._replicas, self._strategy = 0, {}, strategy
        self._scope = strategy
        _live.add(self, keep=True)
        if not _slot:  # the optimizers made in this scope keep slots for it on the ps tasks
            strategy._ps_variables.append(weakref.ref(self))
            for opt in strategy._optimizers:
                opt._add_ps_slots(self)

    def _host(self):
        """The current value, read one-sidedly."""
        host = np.empty(self._shape, dtype=self._dtype)
        _c.ps_variable_io(self._handle, host, False)
        return host

    def _add_host(self, delta):
        """Add a host array of the variable's shape, one-sidedly."""
        _c.ps_variable_io(self._handle, np.ascontiguousarray(delta, dtype=self._dtype), True)
        self._version += 1

    @property
    def device(self):
        """The device of its first shard's ps task, as TensorFlow names it."""
        return self.variables[0].device

    def __repr__(self):
        """TensorFlow's form with the current value (read one-sidedly, never collective)."""
        host = np.empty(self._shape, dtype=self._dtype)
        _c.ps_variable_io(self._handle, host, False)
        return self._describe(self.name, host)

    __str__ = __repr__

    def read_value(self):
        """The whole current value, read from the ps tasks, on this client's devices."""
        if _tracing() is not None:
            return _tracing().variable(self)
        host = np.empty(self._shape, dtype=self._dtype)
        _c.ps_variable_io(self._handle, host, False)
        ctx = _replicas.current()  # inside strategy.run: on the replica's device
        t = ctx.strategy._replica_tensor(host, ctx._local) if ctx is not None else \
            dtensor_from_array(host, self._layout)
        if _tape._tapes():
            _tape.note_read(self, t)
        return t

    value = read_value

    def _assign(self, value, mode):
        _no_trace(f"assigning variable {self.name!r}")
        x = _host_array(value, self._dtype, f"variable {self.name!r}: value")
        try:
            x = np.broadcast_to(x, self._shape)
        except ValueError:
            raise ValueError(f"variable {self.name!r} of shape {self._shape}: a value of shape "
                             f"{x.shape} does not fit") from None
        if mode == 0:  # assign: add the difference to what is there now
            current = np.empty(self._shape, dtype=self._dtype)
            _c.ps_variable_io(self._handle, current, False)
            x = x - current
        delta = np.array(-x if mode == 2 else x, dtype=self._dtype, order="C")
        _c.ps_variable_io(self._handle, delta, True)
        self._version += 1
        return self

    @property
    def variables(self):
        """The shards, in row order."""
        return [_Shard(t, r0, n, self._shape) for t, r0, n in _c.ps_variable_shards(self._handle)]


def _new_variable(cls, *args, **kwargs):
    """DVariable(...) in a ParameterServerStrategy scope makes a PSVariable."""
    if cls is DVariable and isinstance(_current_strategy(), ParameterServerStrategy):
        cls = PSVariable
    return object.__new__(cls)


DVariable.__new__ = _new_variable
Variable = DVariable


class RemoteValue:
    """The result of a scheduled function (a number; None gives NaN), as TensorFlow's
    RemoteValue: ``fetch()`` (``get()``) gives it on every client. After a join every client
    knows it at once; before one, fetch is collective (every client calls it, as every client
    runs the program): it waits, as a join does, for every function scheduled so far. A
    function that raised makes fetch raise its error."""

    def __init__(self, coordinator, step, handle):
        self._coordinator, self._step, self._handle = coordinator, step, handle
        self._known, self._value, self._error = False, None, None
        self.worker = self.attempts = None

    def fetch(self):
        if not self._known:
            self._coordinator._sync()
        if self._error is not None:
            self._coordinator._unreported.pop(self._step, None)  # reported here
            raise _error_of(*self._error, self._step)
        return self._value

    get = fetch


def _error_of(kind, message, step):
    """The exception a failed scheduled function's error is raised as: TensorFlow's class of
    that name, else Python's, else DTensorError."""
    cls = getattr(errors, kind, None) or getattr(_builtins, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = DTensorError
    return cls(f"scheduled function {step} raised {kind}: {message}")


class _SharedIterator:
    """An iterator shared by the cluster's workers, as the iterator a scheduled function
    gets: each worker iterates its own copy of the data (``make()``, built on first use), and
    a counter on the ps tasks (dt_ps_variable_fetch_add) deals out the positions, so each
    element goes to exactly one ``next`` call, whichever worker makes it. Creation is
    collective (every client runs the same program)."""

    def __init__(self, strategy, make):
        self._make, self._it, self._at = make, None, 0
        zero = dtensor_from_array(np.zeros((1,), np.int64), Layout.replicated(strategy.mesh, 1))
        self._handle = _c.ps_variable_create(strategy._handle, zero._handle)
        _live.add(self, keep=True)  # its window is released collectively, at shutdown

    def __iter__(self):
        return self

    def __next__(self):
        one, old = np.ones((1,), np.int64), np.empty((1,), np.int64)
        _c.ps_variable_fetch_add(self._handle, one, old)
        if self._it is None:
            self._it = iter(self._make())
        while self._at < int(old[0]):  # the elements other workers took
            next(self._it)
            self._at += 1
        self._at += 1
        return next(self._it)

    get_next = __next__


class _SharedCounter:
    """An int64 counter on the ps tasks every worker adds to atomically (dt_ps_variable_
    fetch_add). Creation is collective."""

    def __init__(self, strategy):
        zero = dtensor_from_array(np.zeros((1,), np.int64), Layout.replicated(strategy.mesh, 1))
        self._handle = _c.ps_variable_create(strategy._handle, zero._handle)
        _live.add(self, keep=True)  # its window is released collectively, at shutdown

    def fetch_add(self, n):
        """Add n; the value before."""
        old = np.empty((1,), np.int64)
        _c.ps_variable_fetch_add(self._handle, np.full((1,), n, np.int64), old)
        return int(old[0])


class PerWorkerDataset:
    """create_per_worker_dataset: each worker builds its own copy of the data with
    dataset_fn() (when it first needs it); iter() gives the iterator to pass to scheduled
    functions: it yields the dataset's elements in order, each to one call, whichever worker
    runs it (so five scheduled additions of the elements of [1, 2, 3, 4, 5] give 15, as in
    TensorFlow's talk). Collective: every client calls iter() alike."""

    def __init__(self, strategy, dataset_fn):
        if not callable(dataset_fn):
            raise TypeError(f"create_per_worker_dataset: dataset_fn must be callable, got "
                            f"{type(dataset_fn).__name__}")
        self._strategy, self._fn = strategy, dataset_fn

    def __iter__(self):
        return _SharedIterator(self._strategy, self._fn)


class ClusterCoordinator:
    """Schedules functions onto the workers (tf.distribute.coordinator.ClusterCoordinator).

    Every client runs the same program: ``schedule(fn, args)`` records the call on every
    client (the k-th scheduled call is the same on all) and on the chief queues it; a worker
    runs the k-th call of its own record when the chief hands it step k, which happens while
    it is in ``join()`` or ``shutdown()``. A function that raises is rescheduled on another
    worker. ``join()`` (every client) returns once every scheduled function is done, with its
    updates to ps variables visible everywhere; ``shutdown()`` (every client) ends it. A
    per-worker iterator passed as an argument is the running worker's own."""

    def __init__(self, strategy):
        if not isinstance(strategy, ParameterServerStrategy):
            raise TypeError(f"ClusterCoordinator needs a ParameterServerStrategy, got "
                            f"{type(strategy).__name__}")
        self._strategy = strategy
        self._closures = []
        self._failed = {}  # step -> (class name, message): this worker's failed functions
        self._pending = []  # RemoteValues whose results are not shared yet
        self._unreported = {}  # step -> (class name, message): errors join has not raised
        self._shared = {}  # id(local iterator) -> (it, its cluster-wide iterator)
        self._step = self._run  # the C coordinator borrows it: kept alive here
        self._handle = _c.ps_coordinator_create(strategy._handle, self._step)
        _live.add(self, keep=True)
        c = strategy._cluster
        self._chief = c["task_type"] == "chief" or (
            c["chief"] == 0 and c["task_type"] == "worker" and c["task_index"] == 0)

    def _run(self, step):
        if step >= len(self._closures):
            raise DTensorError(f"scheduled function {step} was never scheduled on this worker: "
                               f"every client must run the same program")
        fn, args, kwargs = self._closures[step]
        try:
            r = fn(*args, **kwargs)
        except StopIteration:  # an exhausted iterator: TensorFlow's end of sequence
            self._failed[step] = ("OutOfRangeError", "End of sequence")
            raise errors.OutOfRangeError("End of sequence") from None
        except Exception as e:
            self._failed[step] = (type(e).__name__, str(e))
            raise
        if isinstance(r, _replicas.PerReplica) and len(r.values) == 1:
            r = r.values[0]
        if r is None:
            return float("nan")
        return float(r.read_value() if isinstance(r, DVariable) else r)

    def schedule(self, fn, args=(), kwargs=None):
        """Queue fn(*args, **kwargs) for a worker; returns a RemoteValue (chief)."""
        if not callable(fn):
            raise TypeError(f"schedule: fn must be callable, got {type(fn).__name__}")
        k = len(self._closures)
        args, kwargs = tuple(args), dict(kwargs or {})
        self._closures.append((fn, tuple(self._sharing(a) for a in args),
                               {key: self._sharing(a) for key, a in kwargs.items()}))
        rv = RemoteValue(self, k, _c.ps_schedule(self._handle, k) if self._chief else None)
        self._pending.append(rv)
        return rv

    def _sync(self):
        """Every client: wait for every scheduled function (workers run them), then share
        their results: the chief's values, the workers' errors. Collective."""
        _c.ps_join_all(self._handle)
        results = []
        if self._chief:
            for rv in self._pending:
                try:
                    value, rv.worker, rv.attempts = _c.remote_fetch(rv._handle)
                    results.append([rv._step, value, None])
                except DTensorError as e:
                    results.append([rv._step, None, str(e)])
        shared = _allgather_json([results if self._chief else None,
                                  sorted(self._failed.items())])
        results = next((r for r, _ in shared if r is not None), [])
        failures = {step: tuple(f) for _, fs in shared for step, f in fs}
        self._failed = {}
        by_step = {rv._step: rv for rv in self._pending}
        for step, value, error in results:
            rv = by_step[step]
            rv._known, rv._value = True, value
            if error is not None:
                rv._error = failures.get(step, ("DTensorError", error))
                self._unreported[step] = rv._error
        self._pending = []

    def join(self):
        """Every client: wait until every scheduled function is done (workers run them). A
        function that raised makes join raise, on every client, the error of the first such
        function (by schedule order) not yet raised, as TensorFlow's coordinator raises the
        first error it saw; the others are dropped. Collective."""
        self._sync()
        if self._unreported:
            step = min(self._unreported)
            kind, message = self._unreported[step]
            self._unreported = {}
            raise _error_of(kind, message, step)

    def done(self):
        """Chief: whether every scheduled function has finished (without waiting)."""
        if not self._chief:
            raise DTensorError("ClusterCoordinator.done: only the chief tracks its functions")
        return _c.ps_pending(self._handle) == 0

    def fetch(self, values):
        """The values of RemoteValues (nested lists and tuples kept)."""
        if isinstance(values, RemoteValue):
            return values.fetch()
        return type(values)(self.fetch(v) for v in values)

    def _sharing(self, value):
        """A dataset iterator made on the coordinator becomes one iterator for the cluster
        (its elements each go to one call), as TensorFlow's functions share the coordinator's
        iterator; the same local iterator is shared once (collective: schedule runs alike on
        every client)."""
        if not isinstance(value, data.DatasetIterator):
            return value
        kept = self._shared.get(id(value))
        if kept is None:
            kept = self._shared[id(value)] = (value, _SharedIterator(self._strategy,
                                                                     lambda: value))
        return kept[1]

    def create_per_worker_dataset(self, dataset_fn):
        """The dataset of dataset_fn() on each worker; iterate it for the iterator to pass to
        scheduled functions (see PerWorkerDataset)."""
        return PerWorkerDataset(self._strategy, dataset_fn)

    def shutdown(self):
        """Every client: release the workers and ps tasks (they run and serve until then)."""
        _c.ps_shutdown(self._handle)


_default_strategy = None


def get_strategy():
    """The strategy in scope on this thread, else the default strategy."""
    global _default_strategy
    current = _current_strategy()
    if current is not None:
        return current
    if _default_strategy is None:
        _default_strategy = Strategy()
    return _default_strategy


GradientTape = _tape.GradientTape
PerReplica = _replicas.PerReplica
ReplicaContext = _replicas.ReplicaContext
InputContext = _replicas.InputContext


def get_replica_context():
    """The ReplicaContext inside ``strategy.run``; None in cross-replica context (in a
    strategy's scope, outside run); outside any scope the default replica context, as
    TensorFlow's."""
    ctx = _replicas.current()
    if ctx is not None:
        return ctx
    strategy = _current_strategy()
    if strategy is None or strategy._kind == _c.STRATEGY_DEFAULT:
        return _replicas.DefaultReplicaContext(get_strategy())
    return None


def in_cross_replica_context():
    """True in a (non-default) strategy's scope outside ``strategy.run``, as TensorFlow's."""
    return get_replica_context() is None


def compute_average_loss(per_example_loss, sample_weight=None, global_batch_size=None):
    """tf.nn.compute_average_loss: sum(per_example_loss * sample_weight) / global_batch_size.
    Without ``global_batch_size``, TensorFlow's default: the per-replica batch (the loss's
    first extent) times the replicas in sync inside ``strategy.run``; outside it (a global
    batch, the SPMD form) the first extent."""
    loss = _as_tensor(per_example_loss, "compute_average_loss: per_example_loss")
    if sample_weight is not None:
        loss = loss * _as_dtensor(sample_weight, loss, "compute_average_loss: sample_weight")
    if global_batch_size is None:
        ctx = get_replica_context()
        replicas = ctx.num_replicas_in_sync if ctx is not None else 1
        global_batch_size = (loss.shape[0] if loss.ndim else 1) * replicas
    n = _number(global_batch_size, "compute_average_loss: global_batch_size")
    if isinstance(n, bool) or not n > 0:
        raise ValueError(f"compute_average_loss: global_batch_size {global_batch_size!r} must "
                         f"be positive")
    return reduce_sum(loss) / float(n)  # a Python float takes the loss's dtype


def scale_regularization_loss(regularization_loss):
    """tf.nn.scale_regularization_loss: the sum of the regularization losses divided by the
    replicas in sync (inside ``strategy.run``), so that summing over replicas counts it once."""
    if isinstance(regularization_loss, (list, tuple)):
        regularization_loss = add_n(regularization_loss)
    loss = reduce_sum(_as_tensor(regularization_loss, "scale_regularization_loss"))
    ctx = get_replica_context()
    replicas = ctx.num_replicas_in_sync if ctx is not None else 1
    return loss / float(replicas)


def add_n(inputs):
    """tf.math.add_n: the elementwise sum of a list of tensors of one shape and dtype."""
    if isinstance(inputs, (DTensor, DVariable)) or not isinstance(inputs, (list, tuple)):
        raise TypeError(f"add_n: expected a list of tensors, got {type(inputs).__name__}")
    if not inputs:
        raise ValueError("add_n: the list of inputs is empty")
    total = _as_tensor(inputs[0], "add_n: inputs[0]")
    for i, x in enumerate(inputs[1:], 1):
        x = _as_dtensor(x, total, f"add_n: inputs[{i}]")
        if x.shape != total.shape:
            raise ValueError(f"add_n: inputs[{i}] has shape {x.shape}, inputs[0] {total.shape}")
        total = total + x
    return total


def softmax_cross_entropy_with_logits(labels, logits, axis=-1):
    """tf.nn.softmax_cross_entropy_with_logits: -sum(labels * log_softmax(logits)) along
    ``axis``, one value per row."""
    logits = _as_tensor(logits, "softmax_cross_entropy_with_logits: logits")
    labels = _as_dtensor(labels, logits, "softmax_cross_entropy_with_logits: labels")
    return -reduce_sum(labels * log_softmax(logits, axis=axis), axis=axis)


def sparse_softmax_cross_entropy_with_logits(labels, logits):
    """tf.nn.sparse_softmax_cross_entropy_with_logits: the same with integer class labels."""
    logits = _as_tensor(logits, "sparse_softmax_cross_entropy_with_logits: logits")
    if logits.ndim < 1:
        raise ValueError("sparse_softmax_cross_entropy_with_logits: logits must have a class "
                         "axis (rank >= 1)")
    ids = _int_dtensor(labels, logits, "sparse_softmax_cross_entropy_with_logits: labels")
    onehot = one_hot(ids, logits.shape[-1], dtype=logits.dtype)
    return -reduce_sum(onehot * log_softmax(logits, axis=-1), axis=-1)


# ---- convolution, pooling and batch statistics (tf.nn) ------------------------------------------
# Composed of the ops above, so they run under every layout and differentiate through
# GradientTape: a kh x kw convolution is kh*kw strided windows of the (padded) input
# concatenated along the channels (im2col) and one einsum with the kernel; pooling takes the
# elementwise maximum (or the mean) of the windows. NHWC, as Keras's default.

def _hw(value, what):
    """(h, w) of an int or a list of 1, 2 or 4 (NHWC) positive integers."""
    v = [value] if isinstance(value, (int, np.integer)) else list(np.asarray(value).reshape(-1))
    if len(v) == 4:
        if int(v[0]) != 1 or int(v[3]) != 1:
            raise ValueError(f"{what}: {value!r} moves along the batch or channels (NHWC: "
                             f"the first and last entries must be 1)")
        v = v[1:3]
    if len(v) == 1:
        v = v * 2
    if len(v) != 2 or any(isinstance(d, (bool, np.bool_)) or int(d) != d or int(d) < 1
                          for d in v):
        raise ValueError(f"{what}: {value!r} is not 1, 2 or 4 positive integers")
    return int(v[0]), int(v[1])


def _strided(x, axis, start, count, step):
    """``count`` elements of ``axis`` from ``start``, ``step`` apart (a slice; for step > 1 the
    slice of count * step elements, padded at the end as needed, split into (count, step) and
    its first column kept)."""
    begin, size = [0] * x.ndim, list(x.shape)
    if step == 1 or count <= 1:
        begin[axis], size[axis] = start, count
        return slice(x, begin, size)
    over = start + count * step - x.shape[axis]
    if over > 0:
        paddings = [[0, 0]] * x.ndim
        paddings[axis] = [0, over]
        x = pad(x, paddings)
    begin[axis], size[axis] = start, count * step
    x = slice(x, begin, size)
    shape = list(x.shape)
    shape[axis:axis + 1] = [count, step]
    x = reshape(x, shape)
    size = list(x.shape)
    size[axis + 1] = 1
    x = slice(x, [0] * x.ndim, size)
    return reshape(x, shape[:axis + 1] + shape[axis + 2:])


def _windows(x, kh, kw, strides, padding, dilations, fill, what):
    """The kh * kw windows of x (NHWC) as tensors of shape (N, out_h, out_w, C), and the
    padding (top, bottom, left, right) that was added."""
    if x.ndim != 4:
        raise ValueError(f"{what}: input must be NHWC (rank 4), its shape is {x.shape}")
    sh, sw = _hw(strides, f"{what}: strides")
    dh, dw = _hw(dilations, f"{what}: dilations")
    n, h, w, c = x.shape
    span_h, span_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    if isinstance(padding, str):
        mode = padding.upper()
        if mode not in ("VALID", "SAME"):
            raise ValueError(f"{what}: padding {padding!r} is not 'VALID' or 'SAME'")
        if mode == "VALID":
            top = bottom = left = right = 0
        else:  # TensorFlow's SAME: ceil(n / stride) outputs, the odd padding at the end
            ph = max((-(-h // sh) - 1) * sh + span_h - h, 0)
            pw = max((-(-w // sw) - 1) * sw + span_w - w, 0)
            top, bottom, left, right = ph // 2, ph - ph // 2, pw // 2, pw - pw // 2
    else:
        p = np.asarray(padding).reshape(-1).tolist()
        if len(p) != 8 or p[:2] != [0, 0] or p[6:] != [0, 0] or min(p) < 0:
            raise ValueError(f"{what}: explicit padding {padding!r} must be [[0, 0], [top, "
                             f"bottom], [left, right], [0, 0]] of non-negative integers")
        top, bottom, left, right = (int(v) for v in p[2:6])
    oh = (h + top + bottom - span_h) // sh + 1
    ow = (w + left + right - span_w) // sw + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"{what}: a {kh}x{kw} window does not fit the input {h}x{w} (padding "
                         f"{padding!r})")
    if top or bottom or left or right:
        x = pad(x, [[0, 0], [top, bottom], [left, right], [0, 0]], constant_values=fill)
    out = []
    for i in _builtins.range(kh):
        rows = _strided(x, 1, i * dh, oh, sh)
        out.extend(_strided(rows, 2, j * dw, ow, sw) for j in _builtins.range(kw))
    return out, (top, bottom, left, right)


def _nhwc(data_format, what):
    if str(data_format).upper() not in ("NHWC", "CHANNELS_LAST"):
        raise errors.UnimplementedError(f"{what}: data_format {data_format!r} (only NHWC)")


def conv2d(input, filters, strides=1, padding="VALID", data_format="NHWC",  # noqa: A002
           dilations=None, name=None):
    """tf.nn.conv2d: input (N, H, W, C) with filters (kh, kw, C, F), VALID, SAME or explicit
    padding, strides and dilations; NHWC."""
    _nhwc(data_format, "conv2d")
    x = _as_tensor(input, "conv2d: input")
    f = _as_dtensor(filters, x, "conv2d: filters")
    if f.ndim != 4 or x.ndim != 4 or f.shape[2] != x.shape[3]:
        raise ValueError(f"conv2d: input {x.shape} (NHWC) and filters {f.shape} (kh, kw, C, F) "
                         f"do not fit")
    kh, kw, ci, co = f.shape
    wins, _ = _windows(x, kh, kw, strides, padding, 1 if dilations is None else dilations, 0.0,
                       "conv2d")
    cols = wins[0] if len(wins) == 1 else concat(wins, 3)  # (N, oh, ow, kh * kw * C)
    return einsum("nhwk,kf->nhwf", cols, reshape(f, [kh * kw * ci, co]))


def max_pool2d(input, ksize, strides, padding="VALID", data_format="NHWC", name=None):  # noqa
    """tf.nn.max_pool2d: the maximum of each ksize window (NHWC; SAME padding never wins)."""
    _nhwc(data_format, "max_pool2d")
    x = _as_tensor(input, "max_pool2d: input")
    kh, kw = _hw(ksize, "max_pool2d: ksize")
    wins, _ = _windows(x, kh, kw, strides, padding, 1, -np.inf, "max_pool2d")
    out = wins[0]
    for w in wins[1:]:
        out = maximum(out, w)
    return out


def avg_pool2d(input, ksize, strides, padding="VALID", data_format="NHWC", name=None):  # noqa
    """tf.nn.avg_pool2d: the mean of each ksize window (NHWC; with SAME padding the mean of
    the window's elements inside the input, as TensorFlow's)."""
    _nhwc(data_format, "avg_pool2d")
    x = _as_tensor(input, "avg_pool2d: input")
    kh, kw = _hw(ksize, "avg_pool2d: ksize")
    wins, (top, bottom, left, right) = _windows(x, kh, kw, strides, padding, 1, 0.0,
                                                "avg_pool2d")
    total = add_n(wins)
    if not (top or bottom or left or right):
        return total / float(kh * kw)
    # the count of real elements in each window: the same windows of a ones image
    ones = np.pad(np.ones((1,) + tuple(x.shape[1:3]) + (1,), dtype=x.dtype),
                  [(0, 0), (top, bottom), (left, right), (0, 0)])
    sh, sw = _hw(strides, "avg_pool2d: strides")
    oh, ow = total.shape[1:3]
    count = sum(ones[:, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw, :]
                for i in _builtins.range(kh) for j in _builtins.range(kw))
    return total / _as_dtensor(count, total, "avg_pool2d")


def moments(x, axes, shift=None, keepdims=False, name=None):
    """tf.nn.moments: (mean, variance) of x over ``axes``."""
    x = _as_tensor(x, "moments: x")
    axes = [int(a) for a in (axes if isinstance(axes, (list, tuple)) else [axes])]
    mean = reduce_mean(x, axes, keepdims=True)
    variance = reduce_mean(square(x - mean), axes, keepdims=True)
    if not keepdims:
        mean, variance = squeeze(mean, axes), squeeze(variance, axes)
    return mean, variance


def batch_normalization(x, mean, variance, offset, scale, variance_epsilon, name=None):
    """tf.nn.batch_normalization: (x - mean) / sqrt(variance + epsilon) * scale + offset
    (scale and offset may be None)."""
    x = _as_tensor(x, "batch_normalization: x")
    inv = rsqrt(_as_dtensor(variance, x, "batch_normalization: variance") +
                float(variance_epsilon))
    if scale is not None:
        inv = inv * _as_dtensor(scale, x, "batch_normalization: scale")
    y = (x - _as_dtensor(mean, x, "batch_normalization: mean")) * inv
    return y + _as_dtensor(offset, x, "batch_normalization: offset") if offset is not None \
        else y


# ---- tf.nn and tf.math: the names above under TensorFlow's module paths -----------------------

nn = _types.SimpleNamespace(
    relu=relu, sigmoid=sigmoid, tanh=tanh, gelu=gelu, silu=silu, swish=swish,
    compute_average_loss=compute_average_loss,
    scale_regularization_loss=scale_regularization_loss,
    softmax_cross_entropy_with_logits=softmax_cross_entropy_with_logits,
    sparse_softmax_cross_entropy_with_logits=sparse_softmax_cross_entropy_with_logits,
    softmax=softmax, log_softmax=log_softmax, layer_norm=layer_norm, rms_norm=rms_norm,
    embedding_lookup=embedding_lookup, conv2d=conv2d, convolution=conv2d, max_pool2d=max_pool2d,
    max_pool=max_pool2d, avg_pool2d=avg_pool2d, avg_pool=avg_pool2d, moments=moments,
    batch_normalization=batch_normalization)
math = _types.SimpleNamespace(
    add=add, subtract=subtract, multiply=multiply, divide=divide, truediv=truediv,
    floordiv=floordiv, floormod=floormod, mod=mod, maximum=maximum, minimum=minimum, pow=pow,
    equal=equal, not_equal=not_equal, less=less, less_equal=less_equal, greater=greater,
    greater_equal=greater_equal, logical_and=logical_and, logical_or=logical_or,
    logical_xor=logical_xor, logical_not=logical_not, negative=negative, abs=abs, exp=exp,
    log=log, sqrt=sqrt, rsqrt=rsqrt, square=square, sin=sin, cos=cos, tanh=tanh, erf=erf,
    sigmoid=sigmoid, reduce_sum=reduce_sum, reduce_mean=reduce_mean, reduce_max=reduce_max,
    reduce_min=reduce_min, reduce_prod=reduce_prod, add_n=add_n,
    softmax=softmax, log_softmax=log_softmax, reduce_logsumexp=reduce_logsumexp, argmax=argmax,
    argmin=argmin, cumsum=cumsum, unsorted_segment_sum=unsorted_segment_sum)

def _install_symbolic():
    """Every op of the tf.math and tf.nn namespaces, and the array ops, builds a Keras
    functional node when an operand is symbolic (a KerasTensor), as TensorFlow's ops do."""
    g = globals()
    names = {n for ns in (nn, math) for n, f in vars(ns).items() if callable(f)}
    names |= {"cast", "reshape", "transpose", "concat", "stack", "matmul", "einsum", "where",
              "expand_dims", "squeeze", "gather_rows", "take", "one_hot", "slice", "split",
              "tile", "pad", "broadcast_to", "identity", "zeros_like", "ones_like", "relu",
              "conv2d", "max_pool2d", "avg_pool2d", "moments", "batch_normalization"}
    wrapped = {}
    for name in sorted(names):
        f = g.get(name)
        if callable(f) and not isinstance(f, type) and not hasattr(f, "__wrapped__"):
            wrapped[f] = g[name] = _symbolic_aware(f)
    for ns in (nn, math):
        for n, f in list(vars(ns).items()):
            if f in wrapped:
                setattr(ns, n, wrapped[f])


_install_symbolic()


# ---- tf.Module, tf.nest, tf.io.gfile, tf.dtypes: what TensorFlow programs use around the ops ----

class Module:
    """tf.Module: a container whose variables are found in its attributes (nested modules,
    lists, tuples and dicts of them), each once, in attribute order."""

    def __init__(self, name=None):
        self._name = name or _re.sub(r"(?<!^)(?=[A-Z])", "_", type(self).__name__).lower()

    @property
    def name(self):
        return self._name

    def _walk(self, seen):
        for key, value in sorted(vars(self).items()):
            if key.startswith("_"):
                continue
            yield from _module_items(value, seen)

    @property
    def variables(self):
        return tuple(v for v in self._walk(set()) if isinstance(v, DVariable))

    @property
    def trainable_variables(self):
        return tuple(v for v in self.variables if v.trainable)

    @property
    def submodules(self):
        seen, out = set(), []

        def visit(m):
            for key, value in sorted(vars(m).items()):
                for x in _flat_values(value):
                    if isinstance(x, Module) and id(x) not in seen:
                        seen.add(id(x))
                        out.append(x)
                        visit(x)
        visit(self)
        return tuple(out)

    @_contextlib.contextmanager
    def name_scope(self):
        yield self._name


def _flat_values(value):
    if isinstance(value, (list, tuple)):
        return [y for v in value for y in _flat_values(v)]
    if isinstance(value, dict):
        return [y for k in sorted(value, key=str) for y in _flat_values(value[k])]
    return [value]


def _module_items(value, seen):
    """The variables under an attribute value (modules walked), each once."""
    for x in _flat_values(value):
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, DVariable):
            yield x
        elif isinstance(x, Module):
            yield from x._walk(seen)
        elif hasattr(x, "variables") and hasattr(x, "trainable_variables") and \
                not isinstance(x, type):  # a Keras layer or model inside a module
            yield from (v for v in x.variables if id(v) not in seen and not seen.add(id(v)))


def _nest_flatten(structure):
    """tf.nest.flatten: the leaves, dicts by sorted key."""
    if isinstance(structure, (list, tuple)):
        return [y for v in structure for y in _nest_flatten(v)]
    if isinstance(structure, dict):
        return [y for k in sorted(structure) for y in _nest_flatten(structure[k])]
    return [structure]


def _nest_map_structure(func, *structures):
    """tf.nest.map_structure: func on the leaves of structures of one shape."""
    first = structures[0]
    if isinstance(first, (list, tuple)):
        items = [_nest_map_structure(func, *parts) for parts in zip(*structures)]
        return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)
    if isinstance(first, dict):
        return {k: _nest_map_structure(func, *(s[k] for s in structures)) for k in first}
    return func(*structures)


def _nest_pack_sequence_as(structure, flat_sequence):
    flat = list(flat_sequence)
    at = [0]

    def build(x):
        if isinstance(x, (list, tuple)):
            items = [build(v) for v in x]
            return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
        if isinstance(x, dict):
            return {k: build(x[k]) for k in sorted(x)}
        at[0] += 1
        return flat[at[0] - 1]
    return build(structure)


nest = _types.SimpleNamespace(flatten=_nest_flatten, map_structure=_nest_map_structure,
                              pack_sequence_as=_nest_pack_sequence_as)


def _makedirs(path):
    import os  # noqa: PLC0415
    os.makedirs(path, exist_ok=True)


def _rmtree(path):
    import shutil  # noqa: PLC0415
    shutil.rmtree(path)


def _gfile():
    import glob as _glob  # noqa: PLC0415
    import os  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    return _types.SimpleNamespace(
        makedirs=_makedirs, mkdir=os.mkdir, rmtree=_rmtree, exists=os.path.exists,
        isdir=os.path.isdir, listdir=os.listdir, glob=_glob.glob, remove=os.remove,
        rename=lambda src, dst, overwrite=False: os.replace(src, dst) if overwrite or
        not os.path.exists(dst) else (_ for _ in ()).throw(
            errors.AlreadyExistsError(f"rename: {dst} exists")),
        copy=lambda src, dst, overwrite=False: shutil.copyfile(src, dst), GFile=open,
        walk=os.walk)


#: tf.io: the file-system calls TensorFlow programs make (tf.io.gfile), on the local file system
io = _types.SimpleNamespace(gfile=_gfile())

#: tf.string: the dtype of Keras inputs of text (numpy's object arrays of str here)
string = np.dtype(object)
#: tf.dtypes: the dtypes under TensorFlow's module path
dtypes = _types.SimpleNamespace(
    float16=float16, bfloat16=bfloat16, float32=float32, float64=float64, int8=int8,
    uint8=uint8, int32=int32, int64=int64, bool=bool_, string=string,
    as_dtype=lambda d: string if d in ("string", str) else np.dtype(d))

_global_generator = None


def _global_rng():
    global _global_generator
    if _global_generator is None:
        _global_generator = Generator(0)
    return _global_generator


def _set_seed(seed):
    """tf.random.set_seed: the global generator restarts from ``seed``."""
    _global_rng().reset_from_seed(int(seed))


def _random_uniform(shape, minval=0, maxval=None, dtype=np.float32, seed=None, name=None):
    """tf.random.uniform: the next draw of the global generator (the same on every client:
    its stream depends on the seed and the draws made, never on the client)."""
    g = Generator(seed) if seed is not None else _global_rng()
    return g.uniform(shape, minval, maxval, dtype)


def _random_normal(shape, mean=0.0, stddev=1.0, dtype=np.float32, seed=None, name=None):
    g = Generator(seed) if seed is not None else _global_rng()
    return g.normal(shape, mean, stddev, dtype)


_Random.uniform = staticmethod(_random_uniform)
_Random.normal = staticmethod(_random_normal)
_Random.set_seed = staticmethod(_set_seed)


# ---- input pipelines and Keras-style models (modules built on the names above) --------------

from . import data, keras, train  # noqa: E402 (they import the names defined above)
from . import attention, presets  # noqa: E402
from . import distribute, experimental  # noqa: E402
from .presets import (DataParallelStrategy, FullyShardedStrategy,  # noqa: E402
                      FullyShardedTensorParallelStrategy, TensorParallelStrategy)
nn.scaled_dot_product_attention = _symbolic_aware(attention.scaled_dot_product_attention)

stop_gradient = keras.stop_gradient  # tf.stop_gradient
from .train import Checkpoint, CheckpointManager  # noqa: E402
