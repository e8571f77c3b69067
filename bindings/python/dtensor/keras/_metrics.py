"""tf.keras.metrics: running means and sums, accuracies and error metrics, summed over every
replica's examples."""

import types as _types

import numpy as np

from .. import DTensor, DVariable, Layout, client_id, get_strategy, unpack
from .. import _dtensor as _c
from .._runtime import _allgather_json
from .._tensor import _value
from .._ops import _host_mesh
from ._base import _Configurable, _d
from ._losses import (BinaryCrossentropy, CategoricalCrossentropy, SparseCategoricalCrossentropy,
                      _as_like)

# ---- metrics --------------------------------------------------------------------------------


def _blocks(t):
    """This client's blocks of a DTensor that no other device holds a copy of with a lower id
    (so that summing every client's blocks counts each element once)."""
    t = _value(t)
    layout = t.layout
    if layout.partial:
        raise ValueError(f"metrics: a tensor with pending sums ({layout._text!r}) cannot be "
                         f"read; relayout it first")
    mesh = layout.mesh
    owner = {}
    for dev in range(mesh.size):
        off = tuple(layout.local_shape(list(t.shape), dev)[1])
        owner.setdefault(off, dev)
    out = []
    for comp, dev in zip(unpack(t), mesh.local_device_ids()):
        off = tuple(layout.local_shape(list(t.shape), dev)[1])
        if owner[off] == dev:
            out.append(comp)
    return out


def _pairs(y_true, y_pred):
    """Matching local blocks of labels and predictions (labels laid out as predictions)."""
    y_pred = _value(y_pred)
    if not isinstance(y_true, (DTensor, DVariable)):
        y_true = _as_like(np.asarray(y_true), y_pred)
    y_true = _value(y_true)
    if y_true.layout.mesh is y_pred.layout.mesh and \
            y_true.layout.sharding_specs[:1] != y_pred.layout.sharding_specs[:1]:
        y_true = _d().relayout(y_true, Layout(
            y_pred.layout.sharding_specs[:1] + ["unsharded"] * (y_true.ndim - 1),
            y_pred.layout.mesh))
    return list(zip(_blocks(y_true), _blocks(y_pred)))


class Metric(_Configurable):
    """A streaming metric: ``update_state`` adds this client's blocks' totals on the host,
    ``result()`` sums every client's (collective), ``reset_state()`` clears."""

    def __init__(self, name=None):
        self.name = name or type(self).__name__.lower()
        # a metric of a client-local strategy (mirrored on several clients) counts this
        # client's examples alone; a parameter-server strategy's adds the workers' updates
        strategy = get_strategy()
        self._local = getattr(strategy, "_client_local", False) and \
            strategy._kind != _c.STRATEGY_PARAMETER_SERVER
        self.reset_state()

    def reset_state(self):
        self._total = 0.0
        self._count = 0.0

    reset_states = reset_state

    def _add(self, total, count):
        self._total += float(total)
        self._count += float(count)

    def _gather(self, pair):
        return [pair] if self._local else _allgather_json(pair)

    def _value(self):
        """The result as a Python float (collective)."""
        sums = self._gather([self._total, self._count])
        total, count = sum(s[0] for s in sums), sum(s[1] for s in sums)
        return total / count if count else 0.0

    def result(self):
        """The metric over every client's updates (collective): a float32 scalar tensor on
        this client (a regular tensor), as Keras's."""
        return _regular_scalar(self._value())

    def __call__(self, *args, **kwargs):
        """update_state, then the result (Keras's metric call)."""
        self.update_state(*args, **kwargs)
        return self.result()


class Mean(Metric):
    def update_state(self, values, sample_weight=None):
        if isinstance(values, (DTensor, DVariable)):
            for b in _blocks(values):
                self._add(b.sum(), b.size)
        else:
            a = np.asarray(values, dtype=np.float64)
            w = np.ones_like(a) if sample_weight is None else np.asarray(sample_weight)
            if self._local or client_id() == 0:
                self._add((a * w).sum(), w.sum())


class Sum(Metric):
    def update_state(self, values):
        for b in _blocks(values):
            self._add(b.sum(), 0)

    def _value(self):
        return sum(s[0] for s in self._gather([self._total, 0]))


def _regular_scalar(value):
    """A float32 scalar tensor on this client's host mesh (no other client takes part)."""
    d = _d()
    return d.dtensor_from_array(np.float32(value), Layout.replicated(_host_mesh(), 0))


class _PairMetric(Metric):
    def update_state(self, y_true, y_pred, sample_weight=None):
        for t, p in _pairs(y_true, y_pred):
            hits = self._score(t, p)
            self._add(hits.sum(), hits.size)


class SparseCategoricalAccuracy(_PairMetric):
    def __init__(self, name="sparse_categorical_accuracy"):
        super().__init__(name)

    def _score(self, t, p):
        return (t.reshape(-1).astype(np.int64) == p.argmax(-1).reshape(-1)).astype(np.float64)


class CategoricalAccuracy(_PairMetric):
    def __init__(self, name="categorical_accuracy"):
        super().__init__(name)

    def _score(self, t, p):
        return (t.argmax(-1) == p.argmax(-1)).astype(np.float64)


class BinaryAccuracy(_PairMetric):
    def __init__(self, name="binary_accuracy", threshold=0.5):
        super().__init__(name)
        self.threshold = threshold

    def _score(self, t, p):
        return ((p > self.threshold) == (t > 0.5)).astype(np.float64)


class Accuracy(_PairMetric):
    def __init__(self, name="accuracy"):
        super().__init__(name)

    def _score(self, t, p):
        return (t == p).astype(np.float64)


class MeanSquaredErrorMetric(_PairMetric):
    def __init__(self, name="mean_squared_error"):
        super().__init__(name)

    def _score(self, t, p):
        return ((t - p) ** 2).mean(axis=-1) if p.ndim > 1 else (t - p) ** 2


class MeanAbsoluteErrorMetric(_PairMetric):
    def __init__(self, name="mean_absolute_error"):
        super().__init__(name)

    def _score(self, t, p):
        return np.abs(t - p).mean(axis=-1) if p.ndim > 1 else np.abs(t - p)


metrics = _types.SimpleNamespace(
    Metric=Metric, Mean=Mean, Sum=Sum, SparseCategoricalAccuracy=SparseCategoricalAccuracy,
    CategoricalAccuracy=CategoricalAccuracy, BinaryAccuracy=BinaryAccuracy, Accuracy=Accuracy,
    MeanSquaredError=MeanSquaredErrorMetric, MeanAbsoluteError=MeanAbsoluteErrorMetric)


def _get_metric(m, loss):
    if isinstance(m, Metric):
        return m
    if m in ("accuracy", "acc"):  # Keras picks the accuracy that fits the loss
        if isinstance(loss, SparseCategoricalCrossentropy):
            return SparseCategoricalAccuracy(name="accuracy")
        if isinstance(loss, CategoricalCrossentropy):
            return CategoricalAccuracy(name="accuracy")
        if isinstance(loss, BinaryCrossentropy):
            return BinaryAccuracy(name="accuracy")
        return Accuracy()
    table = {"sparse_categorical_accuracy": SparseCategoricalAccuracy,
             "categorical_accuracy": CategoricalAccuracy, "binary_accuracy": BinaryAccuracy,
             "mse": MeanSquaredErrorMetric, "mean_squared_error": MeanSquaredErrorMetric,
             "mae": MeanAbsoluteErrorMetric, "mean_absolute_error": MeanAbsoluteErrorMetric}
    if m not in table:
        raise ValueError(f"unknown metric {m!r}; one of {sorted(table)} or 'accuracy'")
    return table[m]()
