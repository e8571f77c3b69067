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
import inspect as _inspect
import os as _os
import time as _time
import types as _types

import numpy as np

from . import (DTensor, DVariable, GradientTape, Layout, SGD, Adam, AdamW, Optimizer,
               _allgather_json, _from_components, _replicas, _tape, _value, client_id,
               get_strategy, unpack)
from . import data as _data

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


# ---- losses ---------------------------------------------------------------------------------

class Loss:
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
        losses = self.per_example(y_true, y_pred)
        if sample_weight is not None:
            losses = losses * _as_like(sample_weight, losses)
        if self.reduction == "none":
            return losses
        total = d.reduce_sum(losses)
        if self.reduction == "sum":
            return total
        return total / float(max(losses.shape[0] if losses.ndim else 1, 1))


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


class Metric:
    """A streaming metric: ``update_state`` adds this client's blocks' totals on the host,
    ``result()`` sums every client's (collective), ``reset_state()`` clears."""

    def __init__(self, name=None):
        self.name = name or type(self).__name__.lower()
        # a metric of a client-local strategy (mirrored on several clients) counts this
        # client's examples alone
        self._local = getattr(get_strategy(), "_client_local", False)
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

    def result(self):
        sums = self._gather([self._total, self._count])
        total, count = sum(s[0] for s in sums), sum(s[1] for s in sums)
        return total / count if count else 0.0


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

    def result(self):
        return sum(s[0] for s in self._gather([self._total, 0]))


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


metrics = _types.SimpleNamespace(
    Metric=Metric, Mean=Mean, Sum=Sum, SparseCategoricalAccuracy=SparseCategoricalAccuracy,
    CategoricalAccuracy=CategoricalAccuracy, BinaryAccuracy=BinaryAccuracy, Accuracy=Accuracy,
    MeanSquaredError=MeanSquaredErrorMetric)


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
             "mse": MeanSquaredErrorMetric, "mean_squared_error": MeanSquaredErrorMetric}
    if m not in table:
        raise ValueError(f"unknown metric {m!r}; one of {sorted(table)} or 'accuracy'")
    return table[m]()


# ---- layers ---------------------------------------------------------------------------------

def _glorot_uniform(shape, rng, dtype):
    fan_in, fan_out = shape[0], shape[-1]
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=shape).astype(dtype)


_INITIALIZERS = {
    "glorot_uniform": _glorot_uniform,
    "zeros": lambda shape, rng, dtype: np.zeros(shape, dtype),
    "ones": lambda shape, rng, dtype: np.ones(shape, dtype),
    "random_normal": lambda shape, rng, dtype: rng.normal(0.0, 0.05, size=shape).astype(dtype),
}


class Layer:
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
        shape = _d()._shape_arg(shape, f"{self.name}.add_weight")
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
            a = _d()._host_array(x, what=f"{self.name}: inputs")
            ctx = _replicas.current()
            x = _d()._as_tensor(a) if ctx is not None else self._strategy.distribute_batch(a)
        x = _value(x)
        if np.issubdtype(x.dtype, np.floating) and np.issubdtype(self.dtype, np.floating) and \
                x.dtype != self.dtype:
            x = _d().cast(x, self.dtype)
        return x

    def __call__(self, x, training=None, mask=None, **kwargs):
        """The layer on x. ``training`` goes to a ``call`` that takes it, as Keras passes it
        (no built-in layer here behaves differently in training); ``mask`` is accepted."""
        x = self._input(x)
        if not self.built:
            self.build(x.shape)
            self.built = True
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
        return self.variables

    def count_params(self):
        return int(sum(np.prod(v.shape) for v in self._variables))


class Regularizer:
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

    def get_config(self):
        return {"l1": self.l1, "l2": self.l2}


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
                                LayerNormalization=LayerNormalization)


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
                 save_weights_only=True):
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


callbacks = _types.SimpleNamespace(Callback=Callback, History=History,
                                   LambdaCallback=LambdaCallback, CSVLogger=CSVLogger,
                                   ModelCheckpoint=ModelCheckpoint)

optimizers = _types.SimpleNamespace(Optimizer=Optimizer, SGD=SGD, Adam=Adam, AdamW=AdamW)


def _get_optimizer(o):
    if isinstance(o, Optimizer):
        return o
    table = {"sgd": SGD, "adam": Adam, "adamw": AdamW}
    if str(o).lower() not in table:
        raise ValueError(f"unknown optimizer {o!r}; one of {sorted(table)}")
    return table[str(o).lower()]()


# ---- models ---------------------------------------------------------------------------------

class Model(Layer):
    """Subclass with ``call(x)`` (layers as attributes) or use Sequential; then ``compile``
    and ``fit``. Variables are found in the model's layer attributes."""

    def __init__(self, name=None):
        super().__init__(name)
        self.optimizer = self.loss = None
        self.compiled_metrics = []
        self.stop_training = False

    def build(self, input_shape):
        pass

    def _layers(self):
        return [v for v in vars(self).values() if isinstance(v, Layer) and v is not self]

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

    def compile(self, optimizer="sgd", loss=None, metrics=None):
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
        cbs = [history] + list(callbacks or [])
        steps = steps_per_epoch
        if steps is None:
            steps = len(data)
        if verbose:
            cbs.append(_Progress(epochs, steps))
        for cb in cbs:
            cb.set_model(self)
            cb.on_train_begin()
        it = iter(data)
        self.stop_training = False
        for epoch in range(initial_epoch, epochs):
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
            logs = {"loss": loss_metric.result()}
            logs.update({m.name: m.result() for m in self.compiled_metrics})
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
        logs = {"loss": loss_metric.result()}
        logs.update({m.name: m.result() for m in self.compiled_metrics})
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
        self._shape = None  # the output shape so far, once the input shape is known
        for layer in layers or []:
            self.add(layer)

    def add(self, layer):
        if not isinstance(layer, Layer):
            raise TypeError(f"Sequential.add: {layer!r} is not a layer")
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


__all__ = ["Model", "Sequential", "layers", "losses", "metrics", "optimizers", "callbacks",
           "regularizers", "stop_gradient", "softmax"]
