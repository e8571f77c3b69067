"""tf.keras.losses: the loss classes, their names, and the reduction over the global batch."""

import types as _types

import numpy as np

from .. import DTensor, DVariable, Layout
from .._tensor import _value
from ._base import _Configurable, _d, _log_softmax, _one_hot_like

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
