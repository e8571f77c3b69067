"""Parameter servers: partitioners, the cluster spec and resolver, ParameterServerStrategy and its
sharded variables, and the ClusterCoordinator with its remote values and per-worker datasets."""

import builtins as _builtins
import json as _json
import weakref

import numpy as np

from . import _dtensor as _c
from . import _replicas, _tape, data, errors
from ._dtensor import DTensorError
from ._dtypes import TensorShape, _live
from ._runtime import _agree, _allgather_json, _current_strategy, num_local_devices
from ._mesh import Layout
from ._tensor import _host_array, dtensor_from_array
from ._ops import _no_trace, _tracing
from ._variables import DVariable
from ._strategies import Strategy


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
