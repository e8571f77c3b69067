"""Keras-style models over DTensors: layers, Sequential and Model with compile, fit, evaluate,
predict and summary, losses, metrics, optimizers and callbacks (tf.keras's names).

Variables are DVariables created in the layout of the strategy in scope when a layer is
built (replicated on its mesh; the default strategy's otherwise). ``fit``/``evaluate``/
``predict`` run SPMD steps: each global batch (the same on every client) becomes one DTensor
split over the replicas (uneven when it does not divide), the loss is the sum of per-example
losses over the global batch divided by its size, the gradients (GradientTape, differentiated
by the C autodiff) come out all-reduced, and the optimizer updates the variables once. The
same model also runs inside ``strategy.run`` (per replica) for custom training loops.
Every method that computes is collective: every client calls it with the same data.
"""

import csv as _csv
import functools as _functools
import inspect as _inspect
import json as _json
import os as _os
import struct as _struct
import tempfile as _tempfile
import time as _time
import types as _types
import zipfile as _zipfile

import numpy as np

from . import (DTensor, DVariable, GradientTape, Layout, SGD, Adam, AdamW, Optimizer, RMSprop,
               _replicas, _tape, client_id, get_strategy, unpack)
from . import _dtensor as _c
from . import data as _data
from ._dtypes import _host_array
from ._nn import _hw, _nhwc
from ._ops import _Symbolic, _as_tensor, _host_mesh, _shape_arg, _value
from ._runtime import _allgather_json
from ._tensor import _from_components
from ._utilities import _nest_flatten

# ---- ops the losses and layers need, in terms of dtensor's differentiable ops --------------


def _train():
    from . import train  # noqa: PLC0415 (dtensor.train imports this module)

    return train


def _d():
    import dtensor
    return dtensor


def stop_gradient(x):
    """The value of x, which no tape differentiates through (tf.stop_gradient)."""
    tapes = _tape._tapes()
    paused = [t for t in tapes if t._recording]
    for t in paused:
        t._recording = False
    try:
        return _d().multiply(_value(x), 1)
    finally:
        for t in paused:
            t._recording = True


def _one_hot_like(labels, depth, dtype):
    """One-hot rows of integer labels ([batch] or [batch, 1]), laid out as the labels' batch
    axis, built on each device from its own component (no communication)."""
    labels = _value(labels)
    if labels.ndim == 2 and labels.shape[1] == 1:
        spec = labels.layout.sharding_specs[:1]
    elif labels.ndim == 1:
        spec = labels.layout.sharding_specs
    else:
        raise ValueError(f"sparse labels must have shape [batch] or [batch, 1], got "
                         f"{labels.shape}")
    comps = []
    for c in unpack(labels):
        ids = c.reshape(-1).astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= depth):
            raise ValueError(f"labels must be in 0..{depth - 1}, found {ids.min()}..{ids.max()}")
        comps.append(np.eye(depth, dtype=dtype)[ids])
    layout = Layout(list(spec) + ["unsharded"], labels.layout.mesh, labels.layout.partial)
    return _from_components(comps, layout, [labels.shape[0], depth], np.dtype(dtype))


def _log_softmax(logits):
    return _d().log_softmax(logits, axis=-1)


def softmax(x):
    """Keras' softmax activation: over the last axis (one op, stable; a sharded last axis
    all-reduces only the per-row maximum and sum)."""
    return _d().softmax(x, axis=-1)


def _linear(x):
    return x


def _activation(name):
    if callable(name):
        return name
    d = _d()
    table = {None: _linear, "linear": _linear, "relu": d.relu, "tanh": d.tanh,
             "sigmoid": d.sigmoid, "softmax": softmax, "exponential": d.exp}
    if name not in table:
        raise ValueError(f"unknown activation {name!r}; one of "
                         f"{sorted(k for k in table if k)}")
    return table[name]


# ---- configs (what Model.save writes) ---------------------------------------------------------

def _serialize(v, what):
    """A constructor argument as JSON: numbers, strings, None, lists; regularizers, losses,
    metrics and optimizers as {"class_name", "config"}; numpy dtypes by name."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (np.integer, np.floating)):
        return v.item()
    if isinstance(v, np.dtype) or (isinstance(v, type) and issubclass(v, np.generic)):
        return {"class_name": "dtype", "config": np.dtype(v).name}
    if isinstance(v, (list, tuple)):
        return [_serialize(x, what) for x in v]
    if hasattr(v, "get_config"):
        return {"class_name": type(v).__name__, "config": v.get_config()}
    raise ValueError(f"{what}: {v!r} cannot be saved (give it by name, e.g. activation='relu')")


def _deserialize(v):
    if isinstance(v, list):
        return [_deserialize(x) for x in v]
    if isinstance(v, dict) and "class_name" in v:
        if v["class_name"] == "dtype":
            return np.dtype(v["config"])
        cls = _SAVEABLE.get(v["class_name"])
        if cls is None:
            raise ValueError(f"load_model: unknown class {v['class_name']!r}")
        return cls.from_config(v["config"]) if hasattr(cls, "from_config") else \
            cls(**{k: _deserialize(x) for k, x in v["config"].items()})
    return v


def _recording(init):
    """Wrap a layer class's __init__ so that the outermost call records its arguments (the
    layer's config, which Model.save writes and load_model passes back)."""
    sig = _inspect.signature(init)

    @_functools.wraps(init)
    def wrapped(self, *args, **kwargs):
        if "_config_args" not in vars(self):
            bound = sig.bind(self, *args, **kwargs)
            self._config_args = {k: v for k, v in bound.arguments.items()
                                 if k != "self" and sig.parameters[k].kind not in
                                 (_inspect.Parameter.VAR_POSITIONAL,
                                  _inspect.Parameter.VAR_KEYWORD)}
        init(self, *args, **kwargs)
    return wrapped


class _Configurable:
    """Classes whose constructor arguments are their config (Keras's get_config and
    from_config): every subclass's __init__ records them."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in vars(cls):
            cls.__init__ = _recording(cls.__init__)

    def get_config(self):
        """The constructor arguments as JSON values; raises for one that is not (a callable
        activation, say), which a saved model cannot hold."""
        return {k: _serialize(v, f"{type(self).__name__}: argument {k}")
                for k, v in getattr(self, "_config_args", {}).items()}

    @classmethod
    def from_config(cls, config):
        return cls(**{k: _deserialize(v) for k, v in config.items()})


# ---- losses ---------------------------------------------------------------------------------

class Loss(_Configurable):
    """A loss: per-example values from ``per_example(y_true, y_pred)``, reduced by
    ``reduction``: "sum_over_batch_size" (sum / batch size, the default), "sum" or "none"."""

    def __init__(self, reduction="sum_over_batch_size", name=None):
        reduction = str(getattr(reduction, "value", reduction)).lower()
        if reduction == "auto":
            reduction = "sum_over_batch_size"
        if reduction not in ("sum_over_batch_size", "sum", "none"):
            raise ValueError(f"reduction must be 'sum_over_batch_size', 'sum' or 'none', got "
                             f"{reduction!r}")
        self.reduction = reduction
        self.name = name or type(self).__name__

    def __call__(self, y_true, y_pred, sample_weight=None):
        d = _d()
        y_pred = _value(y_pred)
        y_true = _as_like(y_true, y_pred)
        if isinstance(y_true, DTensor) and np.issubdtype(y_pred.dtype, np.floating) and \
                y_true.dtype != y_pred.dtype:
            y_true = d.cast(y_true, y_pred.dtype)  # as Keras casts the targets
        if isinstance(y_true, DTensor):
            y_true, y_pred = _same_rank(y_true, y_pred)
        losses = self.per_example(y_true, y_pred)
        if sample_weight is not None:
            losses = losses * _as_like(sample_weight, losses)
        if self.reduction == "none":
            return losses
        total = d.reduce_sum(losses)
        if self.reduction == "sum":
            return total
        return total / float(max(losses.shape[0] if losses.ndim else 1, 1))


def _same_rank(y_true, y_pred):
    """Keras's squeeze_or_expand_to_same_rank: ranks one apart meet by squeezing a last axis of
    extent 1 from the higher one, else giving the lower one a last axis of extent 1."""
    d = _d()
    if y_true.ndim == y_pred.ndim - 1:
        if y_pred.shape[-1] == 1:
            return y_true, d.squeeze(y_pred, [-1])
        return d.expand_dims(y_true, -1), y_pred
    if y_pred.ndim == y_true.ndim - 1:
        if y_true.shape[-1] == 1:
            return d.squeeze(y_true, [-1]), y_pred
        return y_true, d.expand_dims(y_pred, -1)
    return y_true, y_pred


class MeanSquaredError(Loss):
    def per_example(self, y_true, y_pred):
        d = _d()
        return d.reduce_mean(d.square(y_true - y_pred), axis=-1)


class MeanAbsoluteError(Loss):
    def per_example(self, y_true, y_pred):
        d = _d()
        return d.reduce_mean(d.abs(y_true - y_pred), axis=-1)


class CategoricalCrossentropy(Loss):
    def __init__(self, from_logits=False, reduction="sum_over_batch_size", name=None):
        super().__init__(reduction, name)
        self.from_logits = from_logits

    def per_example(self, y_true, y_pred):
        d = _d()
        logp = _log_softmax(y_pred) if self.from_logits else \
            d.log(d.maximum(y_pred / d.reduce_sum(y_pred, axis=-1, keepdims=True), 1e-7))
        return -d.reduce_sum(y_true * logp, axis=-1)


class SparseCategoricalCrossentropy(CategoricalCrossentropy):
    def __call__(self, y_true, y_pred, sample_weight=None):
        y_pred = _value(y_pred)
        onehot = _one_hot_like(y_true, y_pred.shape[-1], y_pred.dtype)
        return super().__call__(onehot, y_pred, sample_weight)


class BinaryCrossentropy(Loss):
    def __init__(self, from_logits=False, reduction="sum_over_batch_size", name=None):
        super().__init__(reduction, name)
        self.from_logits = from_logits

    def per_example(self, y_true, y_pred):
        d = _d()
        if self.from_logits:  # max(z, 0) - z y + log(1 + exp(-|z|)), stable for any z
            z = y_pred
            e = d.maximum(z, 0.0) - z * y_true + d.log(d.exp(-d.abs(z)) + 1.0)
        else:
            p = d.minimum(d.maximum(y_pred, 1e-7), 1.0 - 1e-7)
            e = -(y_true * d.log(p) + (1.0 - y_true) * d.log(1.0 - p))
        return d.reduce_mean(e, axis=-1)


_LOSSES = {"mean_squared_error": MeanSquaredError, "mse": MeanSquaredError,
           "mean_absolute_error": MeanAbsoluteError, "mae": MeanAbsoluteError,
           "categorical_crossentropy": CategoricalCrossentropy,
           "sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
           "binary_crossentropy": BinaryCrossentropy}


def _get_loss(loss):
    if isinstance(loss, Loss) or (callable(loss) and not isinstance(loss, str)):
        return loss
    if loss not in _LOSSES:
        raise ValueError(f"unknown loss {loss!r}; one of {sorted(_LOSSES)}")
    return _LOSSES[loss]()


def _as_like(value, like):
    """A numpy value or number next to a DTensor: a DTensor in its layout's batch split."""
    if isinstance(value, (DTensor, DVariable)):
        return _value(value)
    a = np.asarray(value, dtype=like.dtype)
    d = _d()
    if a.ndim == 0:
        return a.item()
    return d.dtensor_from_array(a, like.layout if a.shape == like.shape else
                                Layout.replicated(like.layout.mesh, a.ndim))


losses = _types.SimpleNamespace(
    Loss=Loss, MeanSquaredError=MeanSquaredError, MeanAbsoluteError=MeanAbsoluteError,
    CategoricalCrossentropy=CategoricalCrossentropy,
    SparseCategoricalCrossentropy=SparseCategoricalCrossentropy,
    BinaryCrossentropy=BinaryCrossentropy,
    Reduction=_types.SimpleNamespace(AUTO="auto", NONE="none", SUM="sum",
                                     SUM_OVER_BATCH_SIZE="sum_over_batch_size"))


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


# ---- layers ---------------------------------------------------------------------------------

def _glorot_uniform(shape, rng, dtype):
    receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1  # a conv kernel's window
    fan_in = (shape[-2] if len(shape) > 1 else shape[0]) * receptive
    fan_out = shape[-1] * receptive
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=shape).astype(dtype)


_INITIALIZERS = {
    "glorot_uniform": _glorot_uniform,
    "uniform": lambda shape, rng, dtype: rng.uniform(-0.05, 0.05, size=shape).astype(dtype),
    "zeros": lambda shape, rng, dtype: np.zeros(shape, dtype),
    "ones": lambda shape, rng, dtype: np.ones(shape, dtype),
    "random_normal": lambda shape, rng, dtype: rng.normal(0.0, 0.05, size=shape).astype(dtype),
}


class KerasTensor(_Symbolic):
    """A symbolic tensor of Keras's functional API: its shape (None for the batch), dtype and
    the call (a layer's, or an op's) that makes it from other KerasTensors. Layers and
    dtensor ops given one return another; ``keras.Model(inputs, outputs)`` runs the calls."""

    def __init__(self, shape, dtype, name=None, node=None):
        self.shape = _d().TensorShape(shape)
        self.dtype = dtype
        self.name = name
        self._node = node  # (callable, args, kwargs), or None for an Input

    @property
    def ndim(self):
        return len(self.shape)

    def _make_node(self, fn, args, kwargs):
        return _symbolic_call(fn, args, kwargs)

    def __repr__(self):
        return (f"<KerasTensor shape={tuple(self.shape)}, dtype={np.dtype(self.dtype).name}, "
                f"name={self.name}>")


def _is_symbolic(x):
    if isinstance(x, KerasTensor):
        return True
    if isinstance(x, (list, tuple)):
        return any(_is_symbolic(v) for v in x)
    if isinstance(x, dict):
        return any(_is_symbolic(v) for v in x.values())
    return False


def _map_nested(fn, x):
    if isinstance(x, (list, tuple)):
        return type(x)(_map_nested(fn, v) for v in x)
    if isinstance(x, dict):
        return {k: _map_nested(fn, v) for k, v in x.items()}
    return fn(x)


def _placeholder(kt):
    """A value standing for a KerasTensor (a batch of one) to run a call on."""
    shape = [1 if d is None else d for d in kt.shape]
    if np.dtype(kt.dtype) == np.dtype(object):
        return np.full(shape, "", dtype=object)
    return np.zeros(shape, dtype=np.dtype(kt.dtype))


def _symbolic_call(fn, args, kwargs):
    """The KerasTensor of fn(*args, **kwargs) with KerasTensors among the arguments: fn runs
    once on placeholders (a batch of one: it builds the layers it calls), which gives the
    result's shape and dtype; a leading extent of one under an unknown batch is the batch."""
    value = fn(*_map_nested(lambda v: _placeholder(v) if isinstance(v, KerasTensor) else v,
                            list(args)),
               **_map_nested(lambda v: _placeholder(v) if isinstance(v, KerasTensor) else v,
                             kwargs))
    batch = any(isinstance(v, KerasTensor) and v.shape and v.shape[0] is None
                for v in _nest_flatten([list(args), kwargs]))
    node = (fn, args, kwargs)

    def wrap(v):
        a = v if isinstance(v, (DTensor, DVariable)) else np.asarray(v)
        shape = list(a.shape)
        if batch and shape and shape[0] == 1:
            shape[0] = None
        return KerasTensor(shape, a.dtype, node=node)
    if isinstance(value, (list, tuple)):  # one node, several outputs
        outs = [wrap(v) for v in value]
        for k, o in enumerate(outs):
            o._node = (lambda *a, _k=k, **kw: fn(*a, **kw)[_k], args, kwargs)
        return type(value)(outs)
    return wrap(value)


def _node_layers(outputs):
    """The layers the calls behind some KerasTensors use, in call order, each once."""
    seen, order = set(), []

    def visit(x):
        if isinstance(x, (list, tuple)):
            for v in x:
                visit(v)
        elif isinstance(x, dict):
            for v in x.values():
                visit(v)
        elif isinstance(x, KerasTensor) and x._node is not None and id(x) not in seen:
            seen.add(id(x))
            fn, args, kwargs = x._node
            visit(list(args))
            visit(kwargs)
            layer = getattr(fn, "_layer", None)
            if layer is not None and layer not in order:
                order.append(layer)
    visit(outputs)
    return order


def _evaluate(kt, feed, memo):
    """The value of a KerasTensor given the inputs' values (feed: id -> value)."""
    key = id(kt)
    if key in feed:
        return feed[key]
    if key not in memo:
        if kt._node is None:
            raise ValueError(f"the model's outputs need the input {kt.name or kt!r}, which was "
                             f"not given")
        fn, args, kwargs = kt._node

        def value(v):
            return _evaluate(v, feed, memo) if isinstance(v, KerasTensor) else v
        memo[key] = fn(*_map_nested(value, list(args)), **_map_nested(value, kwargs))
    return memo[key]


class Layer(_Configurable):
    """A layer: ``build(input_shape)`` makes its variables on first call."""

    _count = 0

    def __init__(self, name=None, dtype=np.float32):
        Layer._count += 1
        self._index = Layer._count  # the same on every client: layers are made in one order
        self.name = name or f"{type(self).__name__.lower()}_{Layer._count}"
        self.dtype = np.dtype(dtype)
        self.built = False
        self._variables = []
        self._regularized = []  # (regularizer, variable)
        self._seed = 0
        self._strategy = get_strategy()  # the scope the layer was made in places its weights

    def add_weight(self, name, shape, initializer="glorot_uniform", trainable=True,
                   regularizer=None):
        """A DVariable in the variable layout of the strategy in scope (or the default's);
        ``regularizer(variable)`` adds to ``losses``."""
        if not isinstance(initializer, str) or initializer not in _INITIALIZERS:
            raise ValueError(f"unknown initializer {initializer!r}; one of "
                             f"{sorted(_INITIALIZERS)}")
        shape = _shape_arg(shape, f"{self.name}.add_weight")
        if initializer == "glorot_uniform" and not shape:
            raise ValueError(f"{self.name}.add_weight: glorot_uniform needs a weight of rank "
                             f">= 1, the shape is {shape}")
        rng = np.random.default_rng([self._seed, len(self._variables), self._index])
        value = _INITIALIZERS[initializer](tuple(shape), rng, self.dtype)
        v = DVariable(value, trainable=trainable, name=f"{self.name}/{name}",
                      layout=self._strategy.variable_layout(len(shape)))
        v._strategy = self._strategy  # a mirrored strategy's variables print per replica
        self._variables.append(v)
        if regularizer is not None:
            self._regularized.append((regularizer, v))
        return v

    @property
    def losses(self):
        """The regularization losses of the layer's weights (``regularizer(weight)`` each),
        computed from the weights' current values when asked for, as Keras does; inside
        strategy.run from the replica's copies, and recorded by an active GradientTape."""
        return [r(v.read_value()) for r, v in self._regularized]

    def _input(self, x):
        """x as a DTensor this layer computes on: an array or Python value is the global batch
        (split over the strategy's replicas, or on the replica's device inside strategy.run);
        floating inputs are cast to the layer's dtype, as Keras casts them."""
        if not isinstance(x, (DTensor, DVariable)):
            a = _host_array(x, what=f"{self.name}: inputs")
            ctx = _replicas.current()
            x = _as_tensor(a) if ctx is not None else self._strategy.distribute_batch(a)
        x = _value(x)
        if np.issubdtype(x.dtype, np.floating) and np.issubdtype(self.dtype, np.floating) and \
                x.dtype != self.dtype:
            x = _d().cast(x, self.dtype)
        return x

    def __call__(self, x, training=None, mask=None, **kwargs):
        """The layer on x. ``training`` goes to a ``call`` that takes it, as Keras passes it
        (no built-in layer here behaves differently in training); ``mask`` is accepted. On a
        KerasTensor (the functional API) it gives the KerasTensor of its output."""
        if _is_symbolic(x):
            def call(v):
                return self(v, training=training, **kwargs)
            call._layer = self  # the functional model's layers
            return _symbolic_call(call, (x,), {})
        x = self._input(x)
        if not self.built:
            self.build(x.shape)
            self.built = True
            for ck, path in getattr(self, "_deferred", ()):  # a restore made before the build
                ck.read(path)
            self._deferred = []
        if training is not None and "training" in _inspect.signature(self.call).parameters:
            return self.call(x, training=training, **kwargs)
        return self.call(x, **kwargs)

    @property
    def variables(self):
        return list(self._variables)

    @property
    def trainable_variables(self):
        return [v for v in self._variables if v.trainable]

    @property
    def weights(self):
        """The variables; a parameter-server variable split over ps tasks counts as its shards
        (each with ``shape`` and ``device``), as TensorFlow lists a ShardedVariable's."""
        out = []
        for v in self.variables:
            shards = v.variables if isinstance(v, _d().PSVariable) else None
            out.extend(shards if shards and len(shards) > 1 else [v])
        return out

    def count_params(self):
        return int(sum(np.prod(v.shape) for v in self._variables))


class Regularizer(_Configurable):
    """A weight regularizer (keras.regularizers): ``regularizer(weight)`` is a scalar loss."""

    def __call__(self, x):
        raise NotImplementedError


class L1L2(Regularizer):
    """keras.regularizers.L1L2: l1 * sum(|x|) + l2 * sum(x^2)."""

    def __init__(self, l1=0.0, l2=0.0):
        self.l1, self.l2 = float(l1), float(l2)
        if self.l1 < 0 or self.l2 < 0:
            raise ValueError(f"regularization factors must be non-negative, got l1={l1}, "
                             f"l2={l2}")

    def __call__(self, x):
        d = _d()
        x = _value(x)
        loss = None
        if self.l1:
            loss = d.reduce_sum(d.abs(x)) * self.l1
        if self.l2:
            term = d.reduce_sum(d.square(x)) * self.l2
            loss = term if loss is None else loss + term
        return loss if loss is not None else d.reduce_sum(x * 0.0)


class L1(L1L2):
    """keras.regularizers.L1: l1 * sum(|x|) (Keras's default factor 0.01)."""

    def __init__(self, l1=0.01):
        super().__init__(l1=l1)


class L2(L1L2):
    """keras.regularizers.L2: l2 * sum(x^2) (Keras's default factor 0.01)."""

    def __init__(self, l2=0.01):
        super().__init__(l2=l2)


def _regularizer(r):
    if r is None or isinstance(r, Regularizer) or (callable(r) and not isinstance(r, str)):
        return r
    table = {"l1": L1, "l2": L2, "l1_l2": lambda: L1L2(0.01, 0.01)}
    if r not in table:
        raise ValueError(f"unknown regularizer {r!r}; one of {sorted(table)}")
    return table[r]()


regularizers = _types.SimpleNamespace(Regularizer=Regularizer, L1=L1, L2=L2, L1L2=L1L2, l1=L1,
                                      l2=L2, l1_l2=L1L2, get=_regularizer)


def _beside(variable, x):
    """A variable's value on x's mesh: central storage keeps variables on a mesh of their own,
    copied (replicated) to the computation's mesh for each use, and the tape sends their
    gradients back the same way."""
    v = _value(variable)
    if v.layout.mesh is x.layout.mesh or x.layout.mesh._local:
        return v  # x a regular tensor: the op brings it to the variable's mesh
    return _d().copy_to_mesh(v, Layout.replicated(x.layout.mesh, v.ndim))


class Dense(Layer):
    """activation(x @ kernel + bias), x of shape [batch, features]."""

    def __init__(self, units, activation=None, use_bias=True, kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", kernel_regularizer=None, bias_regularizer=None,
                 input_shape=None, name=None, dtype=np.float32):
        super().__init__(name, dtype)
        if isinstance(units, bool) or not isinstance(units, (int, np.integer)):
            raise TypeError(f"Dense: units must be an integer, got {units!r}")
        self.units = int(units)
        if self.units < 1:
            raise ValueError(f"Dense: units {units} must be at least 1")
        self.activation = _activation(activation)
        self.use_bias = use_bias
        self.kernel_initializer, self.bias_initializer = kernel_initializer, bias_initializer
        self.kernel_regularizer = _regularizer(kernel_regularizer)
        self.bias_regularizer = _regularizer(bias_regularizer)
        self.input_shape = None if input_shape is None else tuple(input_shape)

    def build(self, input_shape):
        self.kernel = self.add_weight("kernel", [input_shape[-1], self.units],
                                      self.kernel_initializer,
                                      regularizer=self.kernel_regularizer)
        self.bias = self.add_weight("bias", [self.units], self.bias_initializer,
                                    regularizer=self.bias_regularizer) \
            if self.use_bias else None

    def call(self, x):
        y = _d().matmul(x, _beside(self.kernel, x))
        if self.bias is not None:
            y = y + _beside(self.bias, x)
        return self.activation(y)

    def output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)


class Activation(Layer):
    def __init__(self, activation, name=None):
        super().__init__(name)
        self.activation = _activation(activation)

    def build(self, input_shape):
        pass

    def call(self, x):
        return self.activation(x)

    def output_shape(self, input_shape):
        return tuple(input_shape)


class Flatten(Layer):
    def build(self, input_shape):
        pass

    def call(self, x):
        return _d().reshape(x, [x.shape[0], int(np.prod(x.shape[1:]))])

    def output_shape(self, input_shape):
        return (input_shape[0], int(np.prod(input_shape[1:])))


class Conv2D(Layer):
    """activation(conv2d(x, kernel) + bias), x of shape [batch, height, width, channels]
    (channels last), kernel [kh, kw, channels, filters]: tf.nn.conv2d, composed of windows
    and one einsum (see dtensor.conv2d)."""

    def __init__(self, filters, kernel_size, strides=(1, 1), padding="valid",
                 data_format=None, dilation_rate=(1, 1), activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None, input_shape=None, name=None,
                 dtype=np.float32):
        super().__init__(name, dtype)
        if isinstance(filters, bool) or not isinstance(filters, (int, np.integer)) or \
                filters < 1:
            raise ValueError(f"Conv2D: filters must be a positive integer, got {filters!r}")
        d = _d()
        self.filters = int(filters)
        self.kernel_size = _hw(kernel_size, "Conv2D: kernel_size")
        self.strides = _hw(strides, "Conv2D: strides")
        self.dilation_rate = _hw(dilation_rate, "Conv2D: dilation_rate")
        if str(padding).lower() not in ("valid", "same"):
            raise ValueError(f"Conv2D: padding {padding!r} is not 'valid' or 'same'")
        self.padding = str(padding).lower()
        _nhwc(data_format or "NHWC", "Conv2D")
        self.activation = _activation(activation)
        self.use_bias = use_bias
        self.kernel_initializer, self.bias_initializer = kernel_initializer, bias_initializer
        self.kernel_regularizer = _regularizer(kernel_regularizer)
        self.bias_regularizer = _regularizer(bias_regularizer)
        self.input_shape = None if input_shape is None else tuple(input_shape)

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(f"{self.name}: Conv2D takes [batch, height, width, channels] "
                             f"inputs, got shape {tuple(input_shape)}")
        self.kernel = self.add_weight("kernel", list(self.kernel_size) +
                                      [input_shape[-1], self.filters], self.kernel_initializer,
                                      regularizer=self.kernel_regularizer)
        self.bias = self.add_weight("bias", [self.filters], self.bias_initializer,
                                    regularizer=self.bias_regularizer) if self.use_bias else None

    def call(self, x):
        y = _d().conv2d(x, _beside(self.kernel, x), self.strides, self.padding.upper(),
                        dilations=self.dilation_rate)
        if self.bias is not None:
            y = y + _beside(self.bias, x)
        return self.activation(y)

    def output_shape(self, input_shape):
        return (input_shape[0],) + _pooled(input_shape[1:3], self.kernel_size, self.strides,
                                           self.padding, self.dilation_rate) + (self.filters,)


def _pooled(hw, window, strides, padding, dilation=(1, 1)):
    """The spatial extents after a window op (Keras's conv_output_length)."""
    out = []
    for n, k, s, d in zip(hw, window, strides, dilation):
        span = (k - 1) * d + 1
        out.append(None if n is None else (-(-n // s) if padding == "same" else
                                           (n - span) // s + 1))
    return tuple(out)


class _Pooling2D(Layer):
    _op = None

    def __init__(self, pool_size=(2, 2), strides=None, padding="valid", data_format=None,
                 name=None, dtype=np.float32):
        super().__init__(name, dtype)
        d = _d()
        self.pool_size = _hw(pool_size, f"{type(self).__name__}: pool_size")
        self.strides = self.pool_size if strides is None else \
            _hw(strides, f"{type(self).__name__}: strides")
        if str(padding).lower() not in ("valid", "same"):
            raise ValueError(f"{type(self).__name__}: padding {padding!r} is not 'valid' or "
                             f"'same'")
        self.padding = str(padding).lower()
        _nhwc(data_format or "NHWC", type(self).__name__)

    def build(self, input_shape):
        pass

    def call(self, x):
        return getattr(_d(), self._op)(x, self.pool_size, self.strides, self.padding.upper())

    def output_shape(self, input_shape):
        return (input_shape[0],) + _pooled(input_shape[1:3], self.pool_size, self.strides,
                                           self.padding) + (input_shape[3],)


class MaxPooling2D(_Pooling2D):
    """The maximum of each pool_size window (tf.nn.max_pool2d)."""
    _op = "max_pool2d"


class AveragePooling2D(_Pooling2D):
    """The mean of each pool_size window (tf.nn.avg_pool2d)."""
    _op = "avg_pool2d"


class Reshape(Layer):
    """Each example reshaped to ``target_shape`` (one extent may be -1)."""

    def __init__(self, target_shape, name=None, dtype=np.float32, input_shape=None):
        super().__init__(name, dtype)
        self.target_shape = tuple(int(d) for d in target_shape)
        self.input_shape = None if input_shape is None else tuple(input_shape)

    def build(self, input_shape):
        pass

    def call(self, x):
        return _d().reshape(x, [x.shape[0]] + list(self.output_shape(x.shape)[1:]))

    def output_shape(self, input_shape):
        shape = list(self.target_shape)
        if -1 in shape:
            size = int(np.prod(input_shape[1:]))
            known = int(np.prod([d for d in shape if d != -1]))
            shape[shape.index(-1)] = size // known
        return (input_shape[0],) + tuple(shape)


class InputLayer(Layer):
    """The input of a model: its shape (without the batch axis) and dtype (keras.Input)."""

    def __init__(self, shape=None, batch_size=None, dtype=None, name=None, input_shape=None):
        super().__init__(name, np.float32)
        shape = shape if shape is not None else input_shape
        if shape is None:
            raise ValueError("Input: shape is required")
        self.input_shape = tuple(shape)
        self.input_dtype = dtype
        self.built = True

    def build(self, input_shape):
        pass

    def _input(self, x):
        return x if isinstance(x, (DTensor, DVariable)) else np.asarray(x)

    def call(self, x):
        return x

    def output_shape(self, input_shape):
        return tuple(input_shape)


def Input(shape=None, batch_size=None, name=None, dtype=None, **kwargs):  # noqa: N802 (Keras)
    """keras.Input: a KerasTensor of the batch's shape (the functional API's input; the first
    element of a Sequential too)."""
    layer = InputLayer(shape, batch_size, dtype, name)
    kt = KerasTensor([batch_size] + list(layer.input_shape),
                     np.float32 if dtype is None else dtype, name=name)
    kt._input_layer = layer
    return kt


class StringLookup(Layer):
    """Strings to integer ids by a vocabulary (keras.layers.StringLookup): with
    ``num_oov_indices`` n (1 by default) ids 0..n-1 are for strings outside the vocabulary
    (hashed among them) and vocabulary[i] is n + i; a ``mask_token`` takes id 0 before them.
    A preprocessing layer: it maps numpy arrays of strings to int64 arrays on the host (as in
    a dataset's map)."""

    def __init__(self, max_tokens=None, num_oov_indices=1, mask_token=None,
                 oov_token="[UNK]", vocabulary=None, invert=False, output_mode="int",
                 name=None, **kwargs):
        super().__init__(name)
        if invert or output_mode != "int":
            raise errors().UnimplementedError("StringLookup: only output_mode='int' lookups")
        if vocabulary is None:
            raise ValueError("StringLookup: a vocabulary is required (adapt is not supported)")
        self.num_oov_indices, self.mask_token, self.oov_token = \
            int(num_oov_indices), mask_token, oov_token
        self._vocab = [str(v) for v in vocabulary]
        first = (1 if mask_token is not None else 0) + self.num_oov_indices
        self._index = {v: first + i for i, v in enumerate(self._vocab)}
        self.built = True

    def get_vocabulary(self):
        return ([self.mask_token] if self.mask_token is not None else []) + \
            [self.oov_token] * self.num_oov_indices + list(self._vocab)

    def vocabulary_size(self):
        return len(self.get_vocabulary())

    def _input(self, x):
        return np.asarray(x.numpy() if isinstance(x, DTensor) else x)

    def build(self, input_shape):
        pass

    def call(self, x):
        x = np.asarray(x)
        masked = 1 if self.mask_token is not None else 0
        out = np.empty(x.shape, dtype=np.int64)
        for pos, s in np.ndenumerate(x):
            s = s.decode() if isinstance(s, bytes) else str(s)
            if self.mask_token is not None and s == self.mask_token:
                out[pos] = 0
            elif s in self._index:
                out[pos] = self._index[s]
            elif self.num_oov_indices:
                out[pos] = masked + (hash(s) % self.num_oov_indices if
                                     self.num_oov_indices > 1 else 0)
            else:
                out[pos] = -1
        return out

    def output_shape(self, input_shape):
        return tuple(input_shape)


class Embedding(Layer):
    """Rows of a trainable [input_dim, output_dim] table by integer ids (tf.nn.
    embedding_lookup); in a parameter-server strategy's scope the table is split over the ps
    tasks by its partitioner, as TensorFlow's."""

    def __init__(self, input_dim, output_dim, embeddings_initializer="uniform",
                 embeddings_regularizer=None, input_length=None, name=None, dtype=np.float32,
                 **kwargs):
        super().__init__(name, dtype)
        self.input_dim, self.output_dim = int(input_dim), int(output_dim)
        if self.input_dim < 1 or self.output_dim < 1:
            raise ValueError(f"Embedding: input_dim {input_dim} and output_dim {output_dim} "
                             f"must be positive")
        self.embeddings_initializer = embeddings_initializer
        self.embeddings_regularizer = _regularizer(embeddings_regularizer)

    def _input(self, x):
        """Integer ids stay integers (no cast to the layer's dtype)."""
        if isinstance(x, (DTensor, DVariable)):
            return _value(x)
        a = np.asarray(x)
        ctx = _replicas.current()
        return _as_tensor(a) if ctx is not None else self._strategy.distribute_batch(a)

    def build(self, input_shape):
        self.embeddings = self.add_weight("embeddings", [self.input_dim, self.output_dim],
                                          self.embeddings_initializer,
                                          regularizer=self.embeddings_regularizer)

    def call(self, x):
        return _d().embedding_lookup(_beside(self.embeddings, x), x)

    def output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)


class LayerNormalization(Layer):
    """Keras' LayerNormalization over the last axis: (x - mean) / sqrt(var + epsilon) * gamma +
    beta with trainable gamma (ones) and beta (zeros) of shape [features], one fused op
    (dtensor.layer_norm); center / scale False leave beta / gamma out."""

    def __init__(self, axis=-1, epsilon=1e-3, center=True, scale=True, beta_initializer="zeros",
                 gamma_initializer="ones", name=None, dtype=np.float32):
        super().__init__(name, dtype)
        if axis not in (-1, [-1], (-1,)):
            raise ValueError(f"LayerNormalization: axis {axis!r}; only the last axis (-1) is "
                             f"supported")
        self.epsilon, self.center, self.scale = float(epsilon), bool(center), bool(scale)
        self.beta_initializer, self.gamma_initializer = beta_initializer, gamma_initializer
        self.gamma = self.beta = None

    def build(self, input_shape):
        if self.scale:
            self.gamma = self.add_weight("gamma", [input_shape[-1]], self.gamma_initializer)
        if self.center:
            self.beta = self.add_weight("beta", [input_shape[-1]], self.beta_initializer)

    def call(self, x):
        g = _beside(self.gamma, x) if self.gamma is not None else None
        b = _beside(self.beta, x) if self.beta is not None else None
        return _d().layer_norm(x, g, b, self.epsilon)

    def output_shape(self, input_shape):
        return tuple(input_shape)


layers = _types.SimpleNamespace(Layer=Layer, Dense=Dense, Activation=Activation, Flatten=Flatten,
                                LayerNormalization=LayerNormalization, Conv2D=Conv2D,
                                Convolution2D=Conv2D, MaxPooling2D=MaxPooling2D,
                                MaxPool2D=MaxPooling2D, AveragePooling2D=AveragePooling2D,
                                AvgPool2D=AveragePooling2D, Reshape=Reshape,
                                InputLayer=InputLayer, Input=Input,
                                StringLookup=StringLookup, Embedding=Embedding)


# ---- callbacks ------------------------------------------------------------------------------

class Callback:
    """Hooks fit calls with the epoch's or batch's logs (a dict of floats)."""

    def set_model(self, model):
        self.model = model

    def on_train_begin(self, logs=None):
        pass

    def on_train_end(self, logs=None):
        pass

    def on_epoch_begin(self, epoch, logs=None):
        pass

    def on_epoch_end(self, epoch, logs=None):
        pass

    def on_train_batch_begin(self, batch, logs=None):
        pass

    def on_train_batch_end(self, batch, logs=None):
        pass


class History(Callback):
    """``history[name]``: the value of each log at the end of every epoch."""

    def on_train_begin(self, logs=None):
        self.history = {}
        self.epoch = []

    def on_epoch_end(self, epoch, logs=None):
        self.epoch.append(epoch)
        for k, v in (logs or {}).items():
            self.history.setdefault(k, []).append(v)


class LambdaCallback(Callback):
    def __init__(self, on_epoch_begin=None, on_epoch_end=None, on_train_batch_begin=None,
                 on_train_batch_end=None, on_train_begin=None, on_train_end=None):
        for name, fn in list(locals().items()):
            if name != "self" and fn is not None:
                setattr(self, name, fn)


class CSVLogger(Callback):
    """One row per epoch (client 0 writes the file)."""

    def __init__(self, filename, separator=",", append=False):
        self.filename, self.separator, self.append = filename, separator, append
        self._header = None

    def on_epoch_end(self, epoch, logs=None):
        if client_id() != 0:
            return
        logs = logs or {}
        keys = ["epoch"] + sorted(logs)
        mode = "a" if self.append or self._header else "w"
        with open(self.filename, mode, newline="") as f:
            w = _csv.writer(f, delimiter=self.separator)
            if self._header is None and not (self.append and f.tell()):
                w.writerow(keys)
            self._header = keys
            w.writerow([epoch] + [logs[k] for k in sorted(logs)])


class ModelCheckpoint(Callback):
    """``model.save_weights(filepath)`` at the end of each epoch (``filepath`` may contain
    ``{epoch}`` and log names, as Keras's); ``save_best_only`` keeps the best ``monitor``.
    With ``save_weights_only=False`` the optimizer's state is saved too (a dtensor checkpoint
    of ``model`` and ``optimizer``, read back with ``dtensor.train.Checkpoint``)."""

    def __init__(self, filepath, monitor="loss", save_best_only=False, mode="min",
                 save_weights_only=True, verbose=0, save_freq="epoch"):
        self.filepath, self.monitor, self.save_best_only = filepath, monitor, save_best_only
        self.save_weights_only = save_weights_only
        self.mode = mode
        self.best = None

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        value = logs.get(self.monitor)
        if self.save_best_only:
            if value is None:
                raise ValueError(f"ModelCheckpoint: monitor {self.monitor!r} is not among the "
                                 f"logs {sorted(logs)}")
            better = self.best is None or (value < self.best if self.mode == "min"
                                           else value > self.best)
            if not better:
                return
            self.best = value
        path = self.filepath.format(epoch=epoch + 1, **logs)
        if _os.path.dirname(path):
            _os.makedirs(_os.path.dirname(path), exist_ok=True)
        if self.save_weights_only or self.model.optimizer is None:
            self.model.save_weights(path)
        else:  # the training state too: resume with Checkpoint(model=, optimizer=).read
            _train().Checkpoint(model=self.model, optimizer=self.model.optimizer).write(path)


class _Progress(Callback):
    """The progress line of verbose fit, on client 0."""

    def __init__(self, epochs, steps):
        self.epochs, self.steps = epochs, steps

    def on_epoch_begin(self, epoch, logs=None):
        self.start = _time.perf_counter()
        if client_id() == 0:
            print(f"Epoch {epoch + 1}/{self.epochs}", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        if client_id() == 0:
            took = _time.perf_counter() - self.start
            parts = [f"{k}: {v:.4f}" for k, v in (logs or {}).items()]
            print(f"{self.steps}/{self.steps} - {took:.2f}s - " + " - ".join(parts), flush=True)


class LearningRateScheduler(Callback):
    """Sets the optimizer's learning rate at the start of each epoch to ``schedule(epoch)`` or
    ``schedule(epoch, lr)`` (Keras's); the epoch's logs get ``learning_rate``."""

    def __init__(self, schedule, verbose=0):
        if not callable(schedule):
            raise TypeError(f"LearningRateScheduler: schedule must be callable, got "
                            f"{type(schedule).__name__}")
        self.schedule, self.verbose = schedule, verbose

    def on_epoch_begin(self, epoch, logs=None):
        opt = self.model.optimizer
        try:
            two = len(_inspect.signature(self.schedule).parameters) >= 2
        except (TypeError, ValueError):
            two = True
        lr = self.schedule(epoch, float(opt.learning_rate)) if two else self.schedule(epoch)
        opt.learning_rate = float(lr)
        if self.verbose and client_id() == 0:
            print(f"\nEpoch {epoch + 1}: LearningRateScheduler setting learning rate to "
                  f"{float(lr)}.", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = float(self.model.optimizer.learning_rate)


def _masked_crc32c(data):
    """TFRecord's masked CRC-32C (Castagnoli) of bytes."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


_CRC32C = []
for _n in range(256):
    _c32 = _n
    for _ in range(8):
        _c32 = (_c32 >> 1) ^ 0x82F63B78 if _c32 & 1 else _c32 >> 1
    _CRC32C.append(_c32)


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, wire, payload):
    return _varint(number << 3 | wire) + payload


def _bytes_field(number, data):
    return _field(number, 2, _varint(len(data)) + data)


class _EventFile:
    """A TensorBoard event file (TFRecord of tensorflow.Event protos) with scalar summaries."""

    def __init__(self, logdir):
        _os.makedirs(logdir, exist_ok=True)
        self.path = _os.path.join(logdir, f"events.out.tfevents.{int(_time.time())}."
                                          f"{_os.uname().nodename}.{_os.getpid()}.dtensor")
        self._write(_field(1, 1, _struct.pack("<d", _time.time())) +
                    _bytes_field(3, b"brain.Event:2"))  # file_version

    def _write(self, event):
        header = _struct.pack("<Q", len(event))
        with open(self.path, "ab") as f:
            f.write(header + _struct.pack("<I", _masked_crc32c(header)) + event +
                    _struct.pack("<I", _masked_crc32c(event)))

    def scalar(self, tag, value, step):
        value_msg = _bytes_field(1, tag.encode()) + _field(2, 5, _struct.pack("<f", value))
        summary = _bytes_field(1, value_msg)
        self._write(_field(1, 1, _struct.pack("<d", _time.time())) +
                    _field(2, 0, _varint(int(step))) + _bytes_field(5, summary))


class TensorBoard(Callback):
    """Writes the epoch logs as TensorBoard scalars (``epoch_loss``, ``epoch_accuracy``, ...)
    to ``log_dir/train`` and ``log_dir/validation`` (client 0 writes)."""

    def __init__(self, log_dir="logs", **kwargs):
        self.log_dir = _os.fspath(log_dir)
        self._writers = {}

    def _writer(self, kind):
        if kind not in self._writers:
            self._writers[kind] = _EventFile(_os.path.join(self.log_dir, kind))
        return self._writers[kind]

    def on_epoch_end(self, epoch, logs=None):
        if client_id() != 0:
            return
        for k, v in (logs or {}).items():
            kind, name = ("validation", k[4:]) if k.startswith("val_") else ("train", k)
            self._writer(kind).scalar(f"epoch_{name}", float(v), epoch)


class BackupAndRestore(Callback):
    """Backs the model and its optimizer up at the end of each epoch to ``backup_dir``; a fit
    interrupted and started again resumes from the epoch after the last backup. The backup is
    deleted when fit ends (``delete_checkpoint``)."""

    def __init__(self, backup_dir, save_freq="epoch", delete_checkpoint=True):
        if save_freq != "epoch":
            raise errors().UnimplementedError(f"BackupAndRestore: save_freq {save_freq!r} "
                                              f"(only 'epoch')")
        self.backup_dir = _os.fspath(backup_dir)
        self.delete_checkpoint = delete_checkpoint

    def _path(self):
        return _os.path.join(self.backup_dir, "backup.h5")

    def _checkpoint(self):
        return _train().Checkpoint(model=self.model, optimizer=self.model.optimizer)

    def on_train_begin(self, logs=None):
        if _os.path.isfile(self._path()):
            ck = self._checkpoint()
            ck.read(self._path())
            self.model._initial_epoch = int(ck.metadata.get("epoch", -1)) + 1

    def on_epoch_end(self, epoch, logs=None):
        _os.makedirs(self.backup_dir, exist_ok=True)
        ck = self._checkpoint()
        ck.metadata = {"epoch": epoch}
        ck.write(self._path())

    def on_train_end(self, logs=None):
        if self.delete_checkpoint:
            _d().barrier()
            if client_id() == 0:
                import shutil  # noqa: PLC0415
                shutil.rmtree(self.backup_dir, ignore_errors=True)
            _d().barrier()  # gone for every client when fit returns


def errors():
    return _d().errors


callbacks = _types.SimpleNamespace(Callback=Callback, History=History,
                                   LambdaCallback=LambdaCallback, CSVLogger=CSVLogger,
                                   ModelCheckpoint=ModelCheckpoint,
                                   LearningRateScheduler=LearningRateScheduler,
                                   TensorBoard=TensorBoard, BackupAndRestore=BackupAndRestore)

optimizers = _types.SimpleNamespace(Optimizer=Optimizer, SGD=SGD, Adam=Adam, AdamW=AdamW,
                                    RMSprop=RMSprop)
# TensorFlow 2.11-2.15's tf.keras.optimizers.legacy: the same optimizers (Keras semantics)
optimizers.legacy = _types.SimpleNamespace(Optimizer=Optimizer, SGD=SGD, Adam=Adam,
                                           RMSprop=RMSprop)


def _get_optimizer(o):
    if isinstance(o, Optimizer):
        return o
    table = {"sgd": SGD, "adam": Adam, "adamw": AdamW, "rmsprop": RMSprop}
    if str(o).lower() not in table:
        raise ValueError(f"unknown optimizer {o!r}; one of {sorted(table)}")
    return table[str(o).lower()]()


# ---- models ---------------------------------------------------------------------------------

class Model(Layer):
    """Subclass with ``call(x)`` (layers as attributes) or use Sequential; then ``compile``
    and ``fit``. Variables are found in the model's layer attributes."""

    def __init__(self, inputs=None, outputs=None, name=None):
        """``Model(inputs, outputs)``: the functional API's model of KerasTensors (inputs a
        KerasTensor, a list or a dict of them; outputs likewise); ``Model()`` in a subclass
        with ``call``."""
        if isinstance(inputs, str) and outputs is None and name is None:
            inputs, name = None, inputs  # Model("name"), as before
        super().__init__(name)
        self.optimizer = self.loss = None
        self.compiled_metrics = []
        self.stop_training = False
        self._graph = None
        if inputs is not None or outputs is not None:
            if not _is_symbolic(inputs) or not _is_symbolic(outputs):
                raise TypeError("Model(inputs, outputs): both must be KerasTensors (from "
                                "keras.Input and the layers called on them)")
            self._graph = (inputs, outputs)
            self._functional_layers = _node_layers(outputs)
            self.built = True

    def build(self, input_shape):
        pass

    def _layers(self):
        if self._graph is not None:
            return list(self._functional_layers)
        return [v for v in vars(self).values() if isinstance(v, Layer) and v is not self]

    def __call__(self, x, training=None, mask=None, **kwargs):
        if self._graph is None:
            return Layer.__call__(self, x, training=training, mask=mask, **kwargs)
        if _is_symbolic(x):
            def call(v):
                return self(v, training=training)
            call._layer = self
            return _symbolic_call(call, (x,), {})
        inputs, outputs = self._graph
        feed = {}

        def bind(kt, value):
            feed[id(kt)] = value
        flat = _nest_flatten(inputs)
        if len(flat) == 1 and not isinstance(x, (dict, list, tuple)):
            bind(flat[0], x)  # one input: the value itself, in whatever structure it was named
        elif isinstance(inputs, dict):
            if not isinstance(x, dict):
                raise TypeError(f"{self.name}: the model takes a dict with keys "
                                f"{sorted(inputs)}, got {type(x).__name__}")
            missing = sorted(set(inputs) - set(x))
            if missing:
                raise ValueError(f"{self.name}: the inputs {missing} are missing")
            for k, kt in inputs.items():
                bind(kt, x[k])
        elif isinstance(inputs, (list, tuple)):
            if not isinstance(x, (list, tuple)) or len(x) != len(inputs):
                raise ValueError(f"{self.name}: the model takes {len(inputs)} inputs")
            for kt, v in zip(inputs, x):
                bind(kt, v)
        else:
            bind(inputs, x)
        memo = {}
        return _map_nested(lambda kt: _evaluate(kt, feed, memo), outputs)

    @property
    def layers(self):
        return self._layers()

    @property
    def variables(self):
        out = list(self._variables)
        for layer in self._layers():
            out.extend(layer.variables)
        return out

    @property
    def trainable_variables(self):
        return [v for v in self.variables if v.trainable]

    @property
    def losses(self):
        """The regularization losses of every layer's weights (see Layer.losses)."""
        out = list(Layer.losses.fget(self))
        for layer in self._layers():
            out.extend(layer.losses)
        return out

    def _total_loss(self, y, pred):
        """The compiled loss plus the regularization losses, as Keras's compiled loss."""
        loss = self.loss(y, pred)
        mesh = loss.layout.mesh
        reg = [r if r.layout.mesh is mesh else  # central storage: from the variables' device
               _d().copy_to_mesh(r, Layout.replicated(mesh, r.ndim)) for r in self.losses]
        return loss + _d().add_n(reg) if reg else loss

    def compile(self, optimizer="sgd", loss=None, metrics=None, loss_weights=None,
                weighted_metrics=None, run_eagerly=False, steps_per_execution=1,
                jit_compile="auto"):
        """Keras's compile. ``steps_per_execution``, ``run_eagerly`` and ``jit_compile`` are
        how Keras groups steps into compiled calls: here each step runs as it is, with the same
        results."""
        if loss_weights is not None or weighted_metrics is not None:
            raise errors().UnimplementedError("compile: loss_weights and weighted_metrics "
                                              "(one output models only)")
        self._compile_config = {"optimizer": optimizer, "loss": loss, "metrics": metrics}
        self.optimizer = _get_optimizer(optimizer)
        self.loss = _get_loss(loss) if loss is not None else None
        self.compiled_metrics = [_get_metric(m, self.loss) for m in (metrics or [])]
        for m in self.compiled_metrics:
            m._local = self._strategy._client_local

    # ---- steps (override to customise, as in Keras) ----

    def train_step(self, data):
        x, y = data
        with GradientTape() as tape:
            pred = self(x, training=True)
            loss = self._total_loss(y, pred)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        for m in self.compiled_metrics:
            m.update_state(y, pred)
        return loss

    def test_step(self, data):
        x, y = data
        pred = self(x)
        loss = self._total_loss(y, pred)
        for m in self.compiled_metrics:
            m.update_state(y, pred)
        return loss

    # ---- loops ----

    def _batches(self, x, y, batch_size, shuffle, seed=0):
        if isinstance(x, _data.Dataset) or (y is None and not isinstance(x, np.ndarray)):
            return x
        if batch_size is None:
            batch_size = 32
        ds = _data.Dataset.from_tensor_slices((x, y) if y is not None else x)
        if shuffle:
            ds = ds.shuffle(len(ds), seed=seed)
        return ds.batch(batch_size)

    def _distribute(self, batch):
        s = self._strategy
        return tuple(s.distribute_batch(np.asarray(b)) for b in batch) \
            if isinstance(batch, (tuple, list)) else s.distribute_batch(np.asarray(batch))

    def _loss_metric(self):
        m = Mean("loss")
        m._local = self._strategy._client_local
        return m

    def _require_compiled(self, what):
        if self.optimizer is None or self.loss is None:
            raise _d().errors.FailedPreconditionError(
                f"{what}: call compile(optimizer, loss) first")

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose=1, callbacks=None,
            shuffle=True, steps_per_epoch=None, initial_epoch=0, validation_data=None,
            seed=0):
        """Train for ``epochs`` epochs of ``steps_per_epoch`` batches (all of them by
        default; a dataset that runs out is restarted). Returns a History. Collective."""
        self._require_compiled("fit")
        if _replicas.current() is not None:
            raise _d().errors.FailedPreconditionError(
                "fit: call it in cross-replica context, not inside strategy.run")
        data = self._batches(x, y, batch_size, shuffle, seed)
        history = History()
        cbs = list(callbacks or []) + [history]  # History last: it sees what the others log
        steps = steps_per_epoch
        if steps is None:
            steps = len(data)
        if verbose:
            cbs.append(_Progress(epochs, steps))
        self._initial_epoch = initial_epoch
        for cb in cbs:
            cb.set_model(self)
            cb.on_train_begin()
        it = iter(data)
        self.stop_training = False
        for epoch in range(self._initial_epoch, epochs):  # BackupAndRestore may move it on
            loss_metric = self._loss_metric()
            for m in self.compiled_metrics:
                m.reset_state()
            for cb in cbs:
                cb.on_epoch_begin(epoch)
            if steps_per_epoch is None:
                it = iter(data)
            for step in range(steps):
                try:
                    batch = next(it)
                except StopIteration:
                    it = iter(data)
                    batch = next(it)
                for cb in cbs:
                    cb.on_train_batch_begin(step)
                dist = self._distribute(batch)
                loss = self.train_step(dist)
                n = _d().gather(loss).item() if isinstance(loss, DTensor) else float(loss)
                rows = np.asarray(batch[0] if isinstance(batch, (tuple, list)) else batch)
                if loss_metric._local or client_id() == 0:  # the same on every client
                    loss_metric._add(n * len(rows), len(rows))
                for cb in cbs:
                    cb.on_train_batch_end(step, {"loss": n})
            logs = {"loss": loss_metric._value()}
            logs.update({m.name: m._value() for m in self.compiled_metrics})
            if validation_data is not None:
                val = self.evaluate(*validation_data, verbose=0, return_dict=True)
                logs.update({f"val_{k}": v for k, v in val.items()})
            for cb in cbs:
                cb.on_epoch_end(epoch, logs)
            if self.stop_training:
                break
        for cb in cbs:
            cb.on_train_end()
        self.history = history
        return history

    def evaluate(self, x=None, y=None, batch_size=None, verbose=1, return_dict=False,
                 steps=None):
        """The loss (weighted by batch size) and metrics over the data. Collective."""
        self._require_compiled("evaluate")
        data = self._batches(x, y, batch_size, shuffle=False)
        loss_metric = self._loss_metric()
        for m in self.compiled_metrics:
            m.reset_state()
        for k, batch in enumerate(data):
            if steps is not None and k >= steps:
                break
            loss = self.test_step(self._distribute(batch))
            n = _d().gather(loss).item() if isinstance(loss, DTensor) else float(loss)
            rows = len(np.asarray(batch[0] if isinstance(batch, (tuple, list)) else batch))
            if loss_metric._local or client_id() == 0:
                loss_metric._add(n * rows, rows)
        logs = {"loss": loss_metric._value()}
        logs.update({m.name: m._value() for m in self.compiled_metrics})
        if verbose and client_id() == 0:
            print(" - ".join(f"{k}: {v:.4f}" for k, v in logs.items()), flush=True)
        if return_dict:
            return logs
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

    def predict(self, x, batch_size=None, verbose=0):
        """The model's outputs for x (numpy, gathered: the caller asked for them). Collective."""
        data = x if isinstance(x, _data.Dataset) else \
            _data.Dataset.from_tensor_slices(np.asarray(x)).batch(batch_size or 32)
        out = []
        for batch in data:
            b = batch[0] if isinstance(batch, (tuple, list)) else batch
            out.append(_d().gather(self(self._strategy.distribute_batch(np.asarray(b)))))
        return np.concatenate(out) if out else np.zeros((0,))

    def summary(self, print_fn=None):
        """Layers, output shapes and parameter counts (client 0 prints)."""
        print_fn = print_fn or (lambda s: print(s) if client_id() == 0 else None)
        rows = [(f"{layer.name} ({type(layer).__name__})", layer.count_params())
                for layer in self._layers_in_order()]
        width = max([len(r[0]) for r in rows] + [20])
        print_fn(f'Model: "{self.name}"')
        print_fn(f"{'Layer (type)':<{width}}  {'Param #':>10}")
        for name, n in rows:
            print_fn(f"{name:<{width}}  {n:>10}")
        total = sum(int(np.prod(v.shape)) for v in self.variables)
        trainable = sum(int(np.prod(v.shape)) for v in self.trainable_variables)
        print_fn(f"Total params: {total}")
        print_fn(f"Trainable params: {trainable}")
        print_fn(f"Non-trainable params: {total - trainable}")

    def _layers_in_order(self):
        return self._layers()

    def get_weights(self):
        """Every variable's value as a numpy array (gathered: collective)."""
        return [_d().gather(v.read_value()) for v in self.variables]

    def set_weights(self, weights):
        vs = self.variables
        if len(weights) != len(vs):
            raise ValueError(f"set_weights: {len(weights)} arrays for {len(vs)} variables")
        for v, w in zip(vs, weights):
            w = np.asarray(w)
            if tuple(w.shape) != tuple(v.shape):
                raise ValueError(f"set_weights: {v.name} has shape {v.shape}, got {w.shape}")
        for v, w in zip(vs, weights):
            v.assign(np.asarray(w, dtype=v.dtype))

    def save_weights(self, filepath, overwrite=True, save_format=None):
        """Every variable written to ``filepath`` as a dtensor checkpoint: one HDF5 file, as
        Keras's ``.h5`` weights, that h5py reads (``variables/model/layer_with_weights-0/
        kernel`` ...). Nothing is gathered: each client writes the blocks of its own devices.
        Collective."""
        if not isinstance(filepath, (str, _os.PathLike)):
            raise TypeError(f"save_weights: expected a path, got {type(filepath).__name__}")
        if not overwrite and _os.path.exists(filepath):
            raise _d().errors.AlreadyExistsError(
                f"save_weights: {filepath} exists (overwrite=False)")
        _train().Checkpoint(model=self).write(filepath)

    def load_weights(self, filepath):
        """Weights written by save_weights, read into the variables' layouts (any mesh or
        client count); a variable of another shape or dtype raises naming it. Files of the
        earlier .npz form are still read. Collective."""
        if not isinstance(filepath, (str, _os.PathLike)):
            raise TypeError(f"load_weights: expected a path, got {type(filepath).__name__}")
        if not _os.path.isfile(filepath):
            raise _d().errors.NotFoundError(f"load_weights: no weights file {filepath!r}")
        with open(filepath, "rb") as f:
            legacy = f.read(2) == b"PK"
        if not legacy:
            _train().Checkpoint(model=self).read(filepath)
            return
        with np.load(filepath) as z:
            names = sorted(z.files, key=lambda k: int(k.split(":", 1)[0]))
            ours = [f"{i}:{v.name}" for i, v in enumerate(self.variables)]
            if names != ours:
                raise ValueError(f"load_weights: {filepath} holds {names}, the model {ours}")
            self.set_weights([z[k] for k in names])


class Sequential(Model):
    """Layers applied in order; built on the first call (or from the first layer's
    ``input_shape``)."""

    def __init__(self, layers=None, name=None):
        super().__init__(name)
        self._stack = []
        self._input_layer = None  # a keras.Input given first
        self._shape = None  # the output shape so far, once the input shape is known
        for layer in layers or []:
            self.add(layer)

    def add(self, layer):
        if isinstance(layer, KerasTensor) and getattr(layer, "_input_layer", None) is not None:
            layer = layer._input_layer  # keras.Input(...) first
        if not isinstance(layer, Layer):
            raise TypeError(f"Sequential.add: {layer!r} is not a layer")
        if isinstance(layer, InputLayer):  # keras.Input: the input shape, not a layer
            if self._stack:
                raise ValueError("Sequential.add: an Input must come first")
            self._shape = (None,) + tuple(layer.input_shape)
            self._input_layer = layer
            return
        self._stack.append(layer)
        if len(self._stack) == 1 and getattr(layer, "input_shape", None) is not None:
            self._shape = (None,) + tuple(layer.input_shape)
        if self._shape is not None:  # the input shape is known: build as layers come
            if not layer.built:
                layer.build(self._shape)
                layer.built = True
            self._shape = layer.output_shape(self._shape)
            self.built = True

    def _layers(self):
        return list(self._stack)

    def _layers_in_order(self):
        return list(self._stack)

    def call(self, x):
        for layer in self._stack:
            x = layer(x)
        return x

    def build(self, input_shape):
        """Build every layer from the input shape (a restore waiting for the variables then
        runs before the first computation, as TensorFlow's delayed restoration)."""
        shape = tuple(input_shape)
        for layer in self._stack:
            if not layer.built:
                layer.build(shape)
                layer.built = True
            shape = layer.output_shape(shape)

    def get_config(self):
        shape = None if self._input_layer is None else list(self._input_layer.input_shape)
        if shape is None and self._stack and getattr(self._stack[0], "input_shape", None):
            shape = list(self._stack[0].input_shape)
        if shape is None and self._stack and self._stack[0].built:
            shape = list(self._built_shape[1:]) if hasattr(self, "_built_shape") else None
        return {"name": self.name, "input_shape": shape,
                "layers": [{"class_name": type(layer).__name__, "config": layer.get_config()}
                           for layer in self._stack]}

    @classmethod
    def from_config(cls, config):
        layers_ = [_deserialize(layer) for layer in config["layers"]]
        model = cls(name=config.get("name"))
        if config.get("input_shape") is not None:
            model.add(InputLayer(config["input_shape"]))
        for layer in layers_:
            model.add(layer)
        return model


# ---- saving whole models (Keras's .keras files) ---------------------------------------------

def _save_model(model, filepath, overwrite=True):
    """model.save: a zip holding config.json (the architecture, and how it was compiled) and
    model.weights.h5 (a dtensor checkpoint of the weights, written without gathering), as
    Keras's .keras format is laid out. Collective."""
    filepath = _os.fspath(filepath)
    if not filepath.endswith(".keras"):
        raise ValueError(f"save: {filepath!r}: a model is saved to a .keras file "
                         f"(save_weights writes the weights alone)")
    if not overwrite and _os.path.exists(filepath):
        raise errors().AlreadyExistsError(f"save: {filepath} exists (overwrite=False)")
    config = {"class_name": type(model).__name__, "config": model.get_config()}
    compiled = getattr(model, "_compile_config", None)
    if compiled is not None:
        config["compile_config"] = {k: _serialize(v, f"save: compile's {k}")
                                    for k, v in compiled.items()}
    weights = filepath + ".weights.h5"
    model.save_weights(weights)
    error = None
    if client_id() == 0:
        try:
            with _zipfile.ZipFile(filepath, "w") as z:
                z.writestr("config.json", _json.dumps(config))
                z.writestr("metadata.json", _json.dumps({"keras_version": "dtensor",
                                                         "date_saved": _time.ctime()}))
                z.write(weights, "model.weights.h5")
        except OSError as e:
            error = f"save: cannot write {filepath}: {e}"
        _os.unlink(weights)
    for e in _allgather_json(error):
        if e:
            raise errors().UnknownError(e)


def load_model(filepath, custom_objects=None, compile=True):  # noqa: A002 (Keras's name)
    """keras.models.load_model of a file Model.save wrote: the model rebuilt in the strategy
    in scope (its variables in that strategy's layout), its weights read back, compiled again
    as it was when ``compile``. Collective."""
    filepath = _os.fspath(filepath)
    if not _os.path.isfile(filepath):
        raise errors().NotFoundError(f"load_model: no file {filepath!r}")
    with _zipfile.ZipFile(filepath) as z:
        config = _json.loads(z.read("config.json"))
        data = z.read("model.weights.h5")
    for name, cls in (custom_objects or {}).items():
        _SAVEABLE[name] = cls
    model = _deserialize(config)
    with _tempfile.NamedTemporaryFile(suffix=".h5", delete=False) as f:
        f.write(data)
    try:
        if not model.built:
            shape = config["config"].get("input_shape")
            if shape is None:
                raise ValueError(f"load_model: {filepath} does not say the model's input shape")
            model(np.zeros([1] + list(shape), np.float32))
        model.load_weights(f.name)
    finally:
        _os.unlink(f.name)
    cc = config.get("compile_config")
    if compile and cc is not None:
        model.compile(**{k: _deserialize(v) for k, v in cc.items()})
    return model


Model.save = _save_model


class Progbar:
    """keras.utils.Progbar: ``update(current, values)`` tracks the step and (name, value)
    pairs, averaged over the steps unless named in ``stateful_metrics``; the line is printed
    when the target is reached or ``finalize`` (client 0 prints)."""

    def __init__(self, target, width=30, verbose=1, interval=0.05, stateful_metrics=None,
                 unit_name="step"):
        self.target, self.width, self.verbose = target, width, verbose
        self.stateful = set(stateful_metrics or [])
        self.unit_name = unit_name
        self._values, self._seen, self._start = {}, 0, _time.perf_counter()

    def update(self, current, values=None, finalize=None):
        for name, v in values or []:
            v = float(v)
            if name in self.stateful:
                self._values[name] = [v, 1]
            else:
                steps = max(current - self._seen, 1)
                total = self._values.setdefault(name, [0.0, 0])
                total[0] += v * steps
                total[1] += steps
        self._seen = current
        if finalize is None:
            finalize = self.target is not None and current >= self.target
        if finalize and self.verbose and client_id() == 0:
            parts = [f"{k}: {t / max(n, 1):.4f}" for k, (t, n) in self._values.items()]
            took = _time.perf_counter() - self._start
            print(f"{current}/{self.target} - {took:.0f}s - " + " - ".join(parts), flush=True)

    def add(self, n, values=None):
        self.update(self._seen + n, values)


utils = _types.SimpleNamespace(Progbar=Progbar)
models = _types.SimpleNamespace(Sequential=Sequential, Model=Model, load_model=load_model)


# the classes a saved model's config names
_SAVEABLE = {c.__name__: c for c in (
    Sequential, Dense, Activation, Flatten, LayerNormalization, Conv2D, MaxPooling2D,
    AveragePooling2D, Reshape, InputLayer, StringLookup, Embedding, L1L2, L1, L2, SGD, Adam,
    AdamW, RMSprop,
    MeanSquaredError, MeanAbsoluteError, CategoricalCrossentropy, SparseCategoricalCrossentropy,
    BinaryCrossentropy, Mean, Sum, SparseCategoricalAccuracy, CategoricalAccuracy,
    BinaryAccuracy, Accuracy, MeanSquaredErrorMetric, MeanAbsoluteErrorMetric)}

__all__ = ["Model", "Sequential", "layers", "losses", "metrics", "optimizers", "callbacks",
           "regularizers", "stop_gradient", "softmax", "Input", "models", "utils"]
