"""tf.distribute's strategies: the default, one-device, mirrored, multi-worker and central
storage ones, cross-device ops and communication options, and replica contexts."""

import builtins as _builtins
import contextlib as _contextlib
import re as _re

import numpy as np

from . import _dtensor as _c
from . import _replicas, _tape, data
from ._dtensor import DTensorError
from ._dtypes import _live, _raw
from ._runtime import (_DEVICE_TYPES, _allgather_json, _current_strategy, _device_name,
                       _ensure_init, _strategy_stack, client_id, num_clients, num_local_devices)
from ._mesh import Layout, Mesh, _layout_of, _rank_arg, set_collective_algorithm
from ._tensor import DTensor, _host_array, _mesh_device, _value, dtensor_from_array, gather
from ._ops import _as_tensor
from ._variables import DVariable

# ---- strategies (tf.distribute) --------------------------------------------------------------


class ReduceOp:
    SUM = "SUM"
    MEAN = "MEAN"


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
        from ._ps import PSVariable  # noqa: PLC0415 (a later module)
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
        from ._ps import TFConfigClusterResolver  # noqa: PLC0415 (a later module)
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
