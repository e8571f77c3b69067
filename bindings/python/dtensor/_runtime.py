"""The runtime: starting and stopping it, tf.config's devices, clients and their agreement, and
the strategy in scope on this thread."""

import atexit
import builtins as _builtins
import json as _json
import threading as _threading
import types as _types

import numpy as np

from . import _dtensor as _c
from . import errors
from ._dtensor import DTensorError
from ._dtypes import _live

# ---- runtime ---------------------------------------------------------------------------------


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
    from . import _ops, _strategies  # noqa: PLC0415 (later modules)
    _strategies._default_strategy = _ops._host = None  # made anew after a restart
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


# ---- the strategy in scope on this thread (a strategy's scope pushes it: _strategies.py) -----

_strategy_stack = _threading.local()


def _current_strategy():
    stack = getattr(_strategy_stack, "items", [])
    return stack[-1] if stack else None
