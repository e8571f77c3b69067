"""tf.keras.losses: the loss classes, their names, and the reduction over the global batch."""

import types as _types

import numpy as np

from .. import DTensor, DVariable, Layout
from .._ops import _apply
from .._tensor import _value
from ._base import _Configurable, _d, _log_softmax

# ---- losses ---------------------------------------------------------------------------------


class Loss(_Configurable):
    """A loss: per-example values from ``per_example(y_true, y_pred)``, reduced by
    ``reduction``: "sum_over_batch_size" (their sum divided by their count, the batch size
    times any further extents as in Keras; the default), "sum" or "none"."""

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
        return self._reduce(self.per_example(y_true, y_pred), sample_weight)

    def _reduce(self, losses, sample_weight=None, valid=None):
        """Keras's reduction of the per-example losses: times ``sample_weight`` (ranks one
        apart meet as Keras's squeeze_or_expand_to_same_rank has them), then as they are
        ("none"), summed ("sum"), or summed and divided by their count
        ("sum_over_batch_size"); with ``valid`` (a bool tensor of the losses' shape, false
        where ignore_class left an example out: its loss is 0) by the count of the valid ones
        instead, 0 when there is none."""
        d = _d()
        if sample_weight is not None:
            weights = _as_like(sample_weight, losses)
            if isinstance(weights, DTensor):
                weights = d.cast(weights, losses.dtype)
                losses, weights = _to_same_rank(losses, weights)
            losses = losses * weights
        if self.reduction == "none" or losses.ndim == 0:
            return losses
        total = d.reduce_sum(losses)
        if self.reduction == "sum":
            return total
        if valid is not None:
            return total / d.maximum(d.reduce_sum(d.cast(valid, total.dtype)), 1.0)
        return total / float(max(int(np.prod(losses.shape)), 1))


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


def _to_same_rank(losses, weights):
    """Keras's squeeze_or_expand_to_same_rank for losses and their sample weights: when the
    ranks are one apart and the higher one ends in an axis of extent 1, a rank-1 lower one gains
    that axis, else the higher one loses it; otherwise they broadcast as they are."""
    d = _d()
    if losses.ndim == weights.ndim + 1 and losses.shape[-1] == 1:
        if weights.ndim == 1:
            return losses, d.expand_dims(weights, -1)
        return d.squeeze(losses, [-1]), weights
    if weights.ndim == losses.ndim + 1 and weights.shape[-1] == 1:
        if losses.ndim == 1:
            return d.expand_dims(losses, -1), weights
        return losses, d.squeeze(weights, [-1])
    return losses, weights


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


_EPSILON = 1e-7  # keras.backend.epsilon()


def _sparse_xent(y_true, y_pred, from_logits, ignore_class, axis, dtype):
    """Keras's sparse categorical cross-entropy of integer labels ([...] or [..., 1]) and
    logits or probabilities [..., C]: (per-example losses [...], the bool mask of the examples
    ignore_class leaves in, or None). Through the fused sparse cross-entropy op (no one-hot, the
    class axis may be sharded): logits as dtensor.nn.sparse_softmax_cross_entropy_with_logits
    takes them; probabilities in its mode of probabilities, TensorFlow's Keras backend's
    result (the cross-entropy of the logits log(clip(p, 1e-7, 1 - 1e-7))) as
    log(sum(c)) - log(c[label]) of the clipped c: one pass over p, no log per element, a zero
    gradient where the clip is active; the output of Keras's softmax activation by the logits
    it was computed from, as Keras does. 16-bit floats are computed in float32 (the
    loss's dtype in Keras 3, unless ``dtype`` names another)."""
    d = _d()
    if not from_logits and getattr(y_pred, "_keras_logits", None) is not None:
        y_pred, from_logits = y_pred._keras_logits, True
    y_pred = d.convert_to_tensor(_value(y_pred))
    if y_pred.ndim < 1 or axis not in (-1, y_pred.ndim - 1):
        raise ValueError(f"sparse_categorical_crossentropy: only axis=-1 is supported (the "
                         f"classes last), got axis={axis} for y_pred of shape "
                         f"{list(y_pred.shape)}")
    if dtype is None and y_pred.dtype in (d.bfloat16, d.float16):
        dtype = d.float32
    if dtype is not None:
        y_pred = d.cast(y_pred, dtype)
    labels = _sparse_labels(y_true, y_pred, ignore_class)
    valid = None
    if ignore_class is not None:
        valid = d.not_equal(labels, int(ignore_class))
        labels = d.where(valid, labels, 0)  # in range: the op gives NaN outside it
    if from_logits:
        losses = d.nn.sparse_softmax_cross_entropy_with_logits(labels, y_pred)
    else:  # the same op's mode of probabilities: log(sum c) - log c[label], one pass
        losses = _apply("sparse_xent", [labels, y_pred], 1, _EPSILON)
    if valid is not None:
        losses = d.where(valid, losses, 0.0)
    return losses, valid


def _sparse_labels(y_true, y_pred, ignore_class):
    """Integer labels of y_pred's leading shape (a last axis of extent 1 dropped; other dtypes
    than int32 and int64 cast to int32, as Keras casts any to int64), host values laid out as
    y_pred's leading axes. Host labels outside the classes (other than ignore_class) raise
    ValueError; a tensor's give their examples NaN (the fused op's rule)."""
    d = _d()
    rows = list(y_pred.shape[:-1])
    if isinstance(y_true, (DTensor, DVariable)):
        labels = _value(y_true)
        if labels.dtype not in (d.int32, d.int64):  # the op's; Keras casts any to int64
            labels = d.cast(labels, d.int32)
    else:
        a = np.asarray(y_true)
        if not np.issubdtype(a.dtype, np.integer):
            a = a.astype(np.int64)
        a = a.astype(np.int64 if a.dtype == np.int64 else np.int32)
        bad = (a < 0) | (a >= y_pred.shape[-1])
        if ignore_class is not None:
            bad &= a != int(ignore_class)
        if bad.any():
            raise ValueError(f"sparse_categorical_crossentropy: label {a[bad].flat[0]} is "
                             f"outside the {y_pred.shape[-1]} classes [0, "
                             f"{y_pred.shape[-1] - 1}]")
        if a.ndim == len(rows) + 1 and a.shape[-1] == 1:
            a = a.reshape(a.shape[:-1])
        spec = y_pred.layout.sharding_specs[:-1] if list(a.shape) == rows else \
            ["unsharded"] * a.ndim
        labels = d.dtensor_from_array(a, Layout(spec, y_pred.layout.mesh))
    if labels.ndim == len(rows) + 1 and labels.shape[-1] == 1:
        labels = d.squeeze(labels, [-1])
    if list(labels.shape) != rows:
        raise ValueError(f"sparse_categorical_crossentropy: labels of shape "
                         f"{list(labels.shape)} do not match y_pred of shape "
                         f"{list(y_pred.shape)} (expected {rows} or {rows + [1]})")
    return labels


def sparse_categorical_crossentropy(y_true, y_pred, from_logits=False, ignore_class=None,
                                    axis=-1):
    """keras.losses.sparse_categorical_crossentropy: the loss of each example, unreduced (0 for
    the examples whose label is ``ignore_class``); see SparseCategoricalCrossentropy."""
    return _sparse_xent(y_true, y_pred, from_logits, ignore_class, axis, None)[0]


class SparseCategoricalCrossentropy(Loss):
    """Integer labels ([batch, ...] or [batch, ..., 1], int32, int64 or integral floats) against
    logits or probabilities [batch, ..., classes], through the fused
    dtensor.nn.sparse_softmax_cross_entropy_with_logits (no one-hot tensor; classes sharded
    over a mesh axis cost two all-reduces of per-row statistics). ``ignore_class``: examples
    with that label add 0 and "sum_over_batch_size" divides by the count of the others, as
    Keras 3. ``dtype``: the computation's (None: the logits' own, float32 for 16-bit ones)."""

    def __init__(self, from_logits=False, ignore_class=None, reduction="sum_over_batch_size",
                 name=None, axis=-1, dtype=None):
        super().__init__(reduction, name)
        self.from_logits = from_logits
        self.ignore_class = ignore_class
        self.axis = axis
        self.dtype = None if dtype is None else np.dtype(dtype)

    def __call__(self, y_true, y_pred, sample_weight=None):
        losses, valid = _sparse_xent(y_true, y_pred, self.from_logits, self.ignore_class,
                                     self.axis, self.dtype)
        return self._reduce(losses, sample_weight, valid)


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
    sparse_categorical_crossentropy=sparse_categorical_crossentropy,
    Reduction=_types.SimpleNamespace(AUTO="auto", NONE="none", SUM="sum",
                                     SUM_OVER_BATCH_SIZE="sum_over_batch_size"))
