"""tf.distribute's replica contract on top of the SPMD layer.

A strategy's replicas are the devices of its mesh "batch"; a client's local replicas are its
devices of that mesh. ``strategy.run(fn, args)`` calls ``fn`` once per local replica, with
that replica's values: each replica computes on a client-local mesh over its own device
(``dt_mesh_create_local``), so its ops involve no other client and no other device. A
``PerReplica`` holds one value per local replica. Variables read inside ``fn`` give the
replica's copy (its component of the mirrored value). Cross-replica steps (``all_reduce``,
``merge_call``, ``optimizer.apply_gradients``) synchronise the replicas as TensorFlow's
``merge_call`` does: every local replica reaches it, the calling thread runs it once over the
global mesh (one collective for all clients' replicas) and hands each replica its part.

Local replicas run one at a time, in order, each in a thread of its own (a baton passes from
replica to replica and to the calling thread at each synchronisation point), so every
client issues the same collectives in the same order and no two replicas race on the C
runtime. The SPMD form of the same step (one call on the global batch, as ``Model.fit``
does) is the fast path; this one gives TensorFlow's per-replica semantics.
"""

import threading

import numpy as np

from . import _dtensor as _c
from . import errors

_local = threading.local()
_MAIN = -1


class PerReplica:
    """One value per local replica (tf.distribute's PerReplica / DistributedValues)."""

    def __init__(self, values):
        self.values = tuple(values)

    def __repr__(self):
        return "PerReplica:{" + ", ".join(f"{i}: {v!r}" for i, v in enumerate(self.values)) + "}"


class ReplicaContext:
    """The context ``fn`` runs in under ``strategy.run`` (tf.distribute.ReplicaContext)."""

    def __init__(self, strategy, runner, local_index):
        self.strategy = strategy
        self._runner = runner
        self._local = local_index

    @property
    def num_replicas_in_sync(self):
        return self.strategy.num_replicas_in_sync

    @property
    def replica_id_in_sync_group(self):
        """This replica's global index (the clients' replicas in client order)."""
        return self.strategy._first_replica + self._local

    def merge_call(self, merge_fn, args=(), kwargs=None):
        """Call ``merge_fn(strategy, *args, **kwargs)`` once, in cross-replica context, with
        PerReplica values holding every local replica's arguments; every replica gets its
        result (a PerReplica result gives each replica its own value)."""
        def merge(payloads):
            per = [PerReplica(vals) for vals in zip(*[p[0] for p in payloads])]
            kw = {k: PerReplica([p[1][k] for p in payloads]) for k in payloads[0][1]}
            result = merge_fn(self.strategy, *per, **kw)
            if isinstance(result, PerReplica):
                return list(result.values)
            return [result] * len(payloads)
        kind = ("merge_call", getattr(merge_fn, "__qualname__", type(merge_fn).__name__))
        return self._runner.sync(self._local, kind, merge,
                                 (tuple(args), dict(kwargs or {})))

    def all_reduce(self, reduce_op, value):
        """The SUM or MEAN of ``value`` (a DTensor or nested list of them) over every replica of
        every client, given back to each replica on its own device."""
        from . import _tape
        flat, rebuild = _tape._flatten_with(value)
        op = _reduce_op(reduce_op)

        def merge(payloads):
            reduced = [_sum_replicas(self.strategy, [p[j] for p in payloads], op)
                       for j in range(len(flat))]
            return [rebuild([self.strategy._to_replica(r, i) for r in reduced])
                    for i in range(len(payloads))]
        return self._runner.sync(self._local, ("all_reduce", op), merge, flat)

    def all_gather(self, value, axis):
        """``value`` (a DTensor or nested list of them) of every replica of every client,
        concatenated along ``axis`` in replica order, given back to each replica on its own
        device (tf.distribute.ReplicaContext.all_gather)."""
        from . import _tape
        flat, rebuild = _tape._flatten_with(value)

        def merge(payloads):
            gathered = [_gather_replicas(self.strategy, [p[j] for p in payloads], axis)
                        for j in range(len(flat))]
            return [rebuild([self.strategy._replica_tensor(g, i) for g in gathered])
                    for i in range(len(payloads))]
        return self._runner.sync(self._local, ("all_gather", axis), merge, flat)


def current():
    """The ReplicaContext of this thread, or None in cross-replica context."""
    return getattr(_local, "context", None)


def _reduce_op(reduce_op):
    op = str(getattr(reduce_op, "value", reduce_op)).upper().split(".")[-1]
    if op not in ("SUM", "MEAN"):
        raise ValueError(f"reduce_op must be ReduceOp.SUM or ReduceOp.MEAN, got {reduce_op!r}")
    return op


def _host(value):
    from . import DTensor, DVariable, unpack
    from ._tensor import _value
    if isinstance(value, (DTensor, DVariable)):
        t = _value(value)
        comps = unpack(t)
        if len(comps) != 1:
            raise ValueError(f"a per-replica value must live on its replica's device; this "
                             f"one has layout {t.layout._text!r} on {t.layout.mesh}")
        return comps[0]
    return np.asarray(value)


def _sum_replicas(strategy, values, op, axis=None):
    """Every replica's value (this client's local ones in ``values``) summed over all replicas
    of all clients: a replicated DTensor on the strategy's mesh. ``axis`` first sums each
    value along that axis (and MEAN divides by the total extent along it)."""
    from . import DTensorError, Layout, cast, dtensor_from_array, relayout
    from ._runtime import _agree
    from ._tensor import _from_components
    arrays = [_host(v) for v in values]
    if strategy.num_replicas_in_sync == 1:  # every client computed the one replica's value
        a = arrays[0].sum(axis=axis) if axis is not None else arrays[0]
        if op == "MEAN" and axis is not None:
            a = a / max(arrays[0].shape[axis], 1)
        return dtensor_from_array(a, Layout.replicated(strategy.mesh, a.ndim))
    error, shapes, count = None, set(), 0
    try:
        if axis is not None:
            for a in arrays:
                if not -a.ndim <= axis < a.ndim:
                    raise ValueError(f"reduce: axis {axis} is out of range for a per-replica "
                                     f"value of shape {a.shape}")
            count = sum(a.shape[axis] for a in arrays)
            arrays = [a.sum(axis=axis) for a in arrays]
        shapes = {(str(a.dtype), a.shape) for a in arrays}
        if len(shapes) > 1:
            raise ValueError(f"reduce: the replicas' values differ in dtype or shape: "
                             f"{sorted(shapes)}")
    except ValueError as e:
        error = e
    if strategy._client_local:  # this client's replicas are all there is
        if error is not None:
            raise error
        verdicts = [[sorted(shapes), count]]
    else:
        verdicts = _agree(error, [sorted(shapes), count])
    kinds = {(d, tuple(sh)) for s, _ in verdicts for d, sh in s}
    if len(kinds) > 1:
        raise DTensorError("reduce: the clients' replicas hold values of different dtypes or "
                           "shapes: " + ", ".join(f"client {c} {s}" for c, (s, _) in
                                                  enumerate(verdicts)))
    dtype, shape = kinds.pop() if kinds else (str(np.float32), ())
    mesh = strategy.mesh
    partial = Layout([_unsharded()] * len(shape), mesh, partial={mesh.dim_names[0]: "sum"})
    total = relayout(_from_components(arrays, partial, list(shape), dtype),
                     Layout.replicated(mesh, len(shape)))
    if op == "MEAN":
        n = sum(c for _, c in verdicts) if axis is not None else strategy.num_replicas_in_sync
        # TensorFlow divides the sum by the count with truediv: integers give float64
        total = total / float(max(n, 1)) if not np.issubdtype(np.dtype(dtype), np.integer) \
            else cast(total, np.float64) / float(max(n, 1))
    return total


def _gather_replicas(strategy, values, axis):
    """Every replica's value (this client's local ones in ``values``) of every client,
    concatenated along ``axis`` in replica order: a numpy array on every client (collective
    when the strategy's replicas span clients). The values' shapes may differ along ``axis``
    only."""
    from . import DTensorError, Layout, relayout
    from ._runtime import _agree, _allgather_json
    from ._tensor import _from_components
    arrays = [_host(v) for v in values]
    error = None
    try:
        for a in arrays:
            if a.ndim == 0:
                raise ValueError("gather: a per-replica value must have rank >= 1 (use "
                                 "expand_dims first)")
            if not -a.ndim <= axis < a.ndim:
                raise ValueError(f"gather: axis {axis} is out of range for a per-replica value "
                                 f"of shape {a.shape}")
    except ValueError as e:
        error = e
    if strategy._client_local or strategy.num_replicas_in_sync == len(arrays):
        if error is not None:
            raise error
        return np.concatenate(arrays, axis=axis)
    _agree(error)
    axis = axis % arrays[0].ndim
    kinds = _allgather_json([[str(a.dtype), [d for k, d in enumerate(a.shape) if k != axis],
                              a.shape[axis]] for a in arrays])
    flat = [k for client in kinds for k in client]
    if len({(d, tuple(rest)) for d, rest, _ in flat}) > 1:
        raise DTensorError("gather: the replicas' values differ in dtype or in their shapes off "
                           "the gathered axis: " + ", ".join(f"{d}{rest}" for d, rest, _ in flat))
    extents = [n for _, _, n in flat]
    most = max(extents)
    # each replica's value padded to the longest along axis, one shard per replica, gathered
    padded = [np.pad(a, [(0, most - a.shape[axis]) if k == axis else (0, 0)
                         for k in range(a.ndim)]) for a in arrays]
    specs = [_unsharded()] * arrays[0].ndim
    specs[axis] = strategy.mesh.dim_names[0]
    shape = list(padded[0].shape)
    shape[axis] = most * len(extents)
    whole = relayout(_from_components(padded, Layout(specs, strategy.mesh), shape,
                                      str(arrays[0].dtype)),
                     Layout.replicated(strategy.mesh, len(shape))).numpy()
    parts = np.split(whole, len(extents), axis=axis)
    return np.concatenate([np.take(p, range(n), axis=axis) for p, n in zip(parts, extents)],
                          axis=axis)


def _unsharded():
    from . import UNSHARDED
    return UNSHARDED


def reduce(strategy, reduce_op, value, axis):
    """strategy.reduce: see Strategy.reduce."""
    from . import DTensor, DVariable, reduce_mean, reduce_sum
    from ._tensor import _value
    op = _reduce_op(reduce_op)
    if isinstance(value, PerReplica):
        if len(value.values) != strategy._local_replicas:
            raise ValueError(f"reduce: the value has {len(value.values)} per-replica parts, "
                             f"this client has {strategy._local_replicas} replicas")
        return _sum_replicas(strategy, value.values, op, axis)
    if isinstance(value, (DTensor, DVariable)):
        t = _value(value)
        if axis is not None:  # a distributed global value: reduce along the axis
            return (reduce_sum if op == "SUM" else reduce_mean)(t, axis)
        if not t.layout.is_fully_replicated() and t.layout.mesh is strategy.mesh:
            raise ValueError(f"reduce: a sharded DTensor (layout {t.layout._text!r}) with "
                             f"axis=None: pass axis= to reduce along it, or reduce the "
                             f"PerReplica values strategy.run returned")
        value = t
    # a value that is the same on every replica, as TensorFlow's reduce_non_distributed_value
    if op == "MEAN" or strategy.num_replicas_in_sync == 1:
        return value
    raise ValueError(f"reduce: a non-distributed value cannot be reduced with SUM over "
                     f"{strategy.num_replicas_in_sync} replicas (it is the same on each)")


class _Inline:
    """One local replica: fn runs on the calling thread and each sync point at once."""

    def sync(self, i, kind, merge, payload):
        return merge([payload])[0]


class _Baton:
    """Several local replicas: one thread each, run one at a time in replica order."""

    def __init__(self, n):
        self.cond = threading.Condition()
        self.n = n
        self.turn = _MAIN
        self.done = [False] * n
        self.waiting = {}  # replica -> (kind, merge, payload)
        self.answers = {}  # replica -> (ok, value)

    def _pass(self, i):
        """Called holding the lock by replica i when it stops: the next replica that is
        neither done nor waiting runs, or the calling thread when none is left."""
        nxt = [j for j in range(i + 1, self.n) if not self.done[j] and j not in self.waiting]
        self.turn = nxt[0] if nxt else _MAIN
        self.cond.notify_all()

    def sync(self, i, kind, merge, payload):
        with self.cond:
            self.waiting[i] = (kind, merge, payload)
            self._pass(i)
            self.cond.wait_for(lambda: i in self.answers and self.turn == i)
            ok, value = self.answers.pop(i)
        if not ok:
            raise value
        return value

    def replica(self, i, body):
        with self.cond:
            self.cond.wait_for(lambda: self.turn == i)
        try:
            body()
        finally:
            with self.cond:
                self.done[i] = True
                self._pass(i)

    def drive(self):
        """The calling thread: run the sync points the replicas reach, until all are done."""
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.turn == _MAIN)
                if all(self.done):
                    return
                waiting = dict(self.waiting)
                self.waiting.clear()
            kinds = {repr(w[0]) for w in waiting.values()}
            answers = {}
            if len(waiting) != self.n - sum(self.done) or any(self.done) or len(kinds) > 1:
                error = errors.FailedPreconditionError(
                    "strategy.run: the replicas reached different synchronisation points ("
                    + ", ".join(f"replica {i}: {waiting[i][0][0]}" if i in waiting else
                                f"replica {i}: returned" for i in range(self.n))
                    + "); every replica must make the same all_reduce, merge_call and "
                      "apply_gradients calls")
                answers = {i: (False, error) for i in waiting}
            else:
                order = sorted(waiting)
                merge = waiting[order[0]][1]
                try:
                    results = merge([waiting[i][2] for i in order])
                    answers = {i: (True, r) for i, r in zip(order, results)}
                except BaseException as e:  # every replica raises it
                    answers = {i: (False, e) for i in order}
            with self.cond:
                self.answers.update(answers)
                self.turn = min(answers)
                self.cond.notify_all()


class DefaultReplicaContext:
    """The replica context outside any strategy's scope, and inside the default strategy's
    run (TensorFlow's default replica context): one replica; all_reduce gives the value back,
    merge_call calls merge_fn with the arguments as they are."""

    num_replicas_in_sync = 1
    replica_id_in_sync_group = 0

    def __init__(self, strategy):
        self.strategy = strategy

    def all_reduce(self, reduce_op, value):
        _reduce_op(reduce_op)
        return value

    def merge_call(self, merge_fn, args=(), kwargs=None):
        return merge_fn(self.strategy, *args, **(kwargs or {}))


def run(strategy, fn, args, kwargs):
    """strategy.run: fn once per local replica (see the module's doc); the default strategy
    calls fn itself and gives its result back as it is, as TensorFlow's."""
    from . import DTensorError, num_clients
    from ._ops import _state
    if strategy._kind == _c.STRATEGY_DEFAULT:
        def unwrap(v):
            return v.values[0] if isinstance(v, PerReplica) else v
        return fn(*_map(unwrap, tuple(args)), **_map(unwrap, dict(kwargs or {})))
    if strategy._run_refusal:
        raise DTensorError(f"strategy.run: {strategy._run_refusal}; use the SPMD form (ops on "
                           f"the global batch, Model.fit) with {num_clients()} clients")
    n = strategy._local_replicas
    results, errors = [None] * n, [None] * n
    parent = {k: v for k, v in vars(_state).items() if k != "trace"}  # a trace is a thread's

    def call(i, runner):
        _local.context = ReplicaContext(strategy, runner, i)
        try:
            a = _map(lambda v: strategy._to_replica(v, i), args)
            kw = _map(lambda v: strategy._to_replica(v, i), kwargs or {})
            with strategy.scope():
                results[i] = fn(*a, **kw)
        except BaseException as e:
            errors[i] = e
        finally:
            _local.context = None

    if n == 1:
        call(0, _Inline())
    else:
        baton = _Baton(n)

        def body(i):
            vars(_state).update(parent)
            baton.replica(i, lambda: call(i, baton))
        threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        with baton.cond:
            baton.turn = 0
            baton.cond.notify_all()
        baton.drive()
        for t in threads:
            t.join()
    for e in errors:
        if e is not None:
            raise e
    if strategy._kind == _c.STRATEGY_ONE_DEVICE:  # one replica: its value itself, as TF's
        return results[0]
    return _regroup(results)


def _map(fn, x):
    if isinstance(x, PerReplica):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map(fn, v) for v in x)
    if isinstance(x, dict):
        return {k: _map(fn, v) for k, v in x.items()}
    return fn(x)


def _holds_per_replica(x):
    if isinstance(x, PerReplica):
        return True
    if isinstance(x, (list, tuple)):
        return any(_holds_per_replica(v) for v in x)
    if isinstance(x, dict):
        return any(_holds_per_replica(v) for v in x.values())
    return False


def _regroup(results):
    """Per-replica results of one structure as that structure of PerReplica values."""
    first = results[0]
    if isinstance(first, (list, tuple)) and not isinstance(first, str):
        return type(first)(_regroup([r[k] for r in results]) for k in range(len(first)))
    if isinstance(first, dict):
        return {k: _regroup([r[k] for r in results]) for k in first}
    if first is None:
        return None
    return PerReplica(results)


class ValueContext:
    """What experimental_distribute_values_from_function's value_fn is told
    (tf.distribute.experimental.ValueContext)."""

    def __init__(self, replica_id_in_sync_group=0, num_replicas_in_sync=1):
        self.replica_id_in_sync_group = replica_id_in_sync_group
        self.num_replicas_in_sync = num_replicas_in_sync


# ---- input: distributed datasets ------------------------------------------------------------

class InputContext:
    """What ``distribute_datasets_from_function``'s dataset_fn is told
    (tf.distribute.InputContext): one input pipeline per client."""

    def __init__(self, num_input_pipelines, input_pipeline_id, num_replicas_in_sync):
        self.num_input_pipelines = num_input_pipelines
        self.input_pipeline_id = input_pipeline_id
        self.num_replicas_in_sync = num_replicas_in_sync

    def get_per_replica_batch_size(self, global_batch_size):
        if global_batch_size % self.num_replicas_in_sync:
            raise ValueError(f"the global batch size {global_batch_size} is not divisible by "
                             f"num_replicas_in_sync {self.num_replicas_in_sync}")
        return global_batch_size // self.num_replicas_in_sync


def split_batch(n, replicas):
    """TensorFlow's rebatching of a global batch of n over the replicas, as even as it gets:
    the first n % replicas replicas take one element more (a short last batch can leave some
    replicas empty). Returns each replica's (start, stop)."""
    q, r = divmod(n, replicas)
    sizes = [q + 1] * r + [q] * (replicas - r)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return [(int(starts[k]), int(starts[k + 1])) for k in range(replicas)]


class DistributedDataset:
    """experimental_distribute_dataset: each element of the dataset is a global batch (every
    client iterates the same dataset); each client keeps only its replicas' rows (auto-sharding
    by data) and each replica gets its consecutive piece, as a DTensor on its own device. A
    last batch that does not divide is split unevenly, some replicas possibly empty."""

    def __init__(self, strategy, dataset):
        self._strategy = strategy
        self._dataset = dataset
        self.element_spec = getattr(dataset, "element_spec", None)

    def __iter__(self):
        s = self._strategy
        if s._kind == _c.STRATEGY_DEFAULT:  # no distribution: the batches as regular tensors
            for batch in self._dataset:
                yield _map_arrays(batch, _regular)
            return
        for batch in self._dataset:
            flat = _flat_arrays(batch)
            n = {a.shape[0] if a.ndim else None for a in flat}
            if len(n) != 1 or None in n:
                raise ValueError(f"experimental_distribute_dataset: the batch's arrays have "
                                 f"leading extents {sorted(map(str, n))}; they must share one")
            pieces = split_batch(n.pop(), s.num_replicas_in_sync)
            mine = pieces[s._first_replica:s._first_replica + s._local_replicas]
            yield _map_arrays(batch, lambda a: PerReplica(
                s._replica_tensor(a[lo:hi], i) for i, (lo, hi) in enumerate(mine)))


class DistributedDatasetFromFunction:
    """distribute_datasets_from_function: dataset_fn(InputContext) runs once per client and
    yields per-replica batches; each step takes one element per local replica."""

    def __init__(self, strategy, dataset_fn):
        self._strategy = strategy
        s = strategy
        ctx = InputContext(s._num_clients_in_sync, s._client_index, s.num_replicas_in_sync)
        self._dataset = dataset_fn(ctx)

    def __iter__(self):
        s = self._strategy
        if s._kind == _c.STRATEGY_DEFAULT:
            for element in self._dataset:
                yield _map_arrays(element, _regular)
            return
        it = iter(self._dataset)
        while True:
            elements = []
            for _ in range(s._local_replicas):
                try:
                    elements.append(next(it))
                except StopIteration:
                    break
            if not elements:
                return
            while len(elements) < s._local_replicas:  # the last step: empty batches
                elements.append(_map_arrays(elements[0], lambda a: a[:0]))
            yield _zip_replicas(s, elements)


def _regular(a):
    """A regular tensor (on the default mesh) of an array."""
    from ._ops import _as_tensor
    return _as_tensor(a)


def _zip_replicas(strategy, elements):
    first = elements[0]
    if isinstance(first, (list, tuple)):
        return type(first)(_zip_replicas(strategy, [e[k] for e in elements])
                           for k in range(len(first)))
    if isinstance(first, dict):
        return {k: _zip_replicas(strategy, [e[k] for e in elements]) for k in first}
    return PerReplica(strategy._replica_tensor(np.asarray(e), i)
                      for i, e in enumerate(elements))


def _flat_arrays(x):
    if isinstance(x, (list, tuple)):
        return [a for v in x for a in _flat_arrays(v)]
    if isinstance(x, dict):
        return [a for k in x for a in _flat_arrays(x[k])]
    return [np.asarray(x)]


def _map_arrays(x, fn):
    if isinstance(x, (list, tuple)):
        return type(x)(_map_arrays(v, fn) for v in x)
    if isinstance(x, dict):
        return {k: _map_arrays(v, fn) for k, v in x.items()}
    return fn(np.asarray(x))
