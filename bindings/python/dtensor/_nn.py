"""tf.nn: losses, convolution, pooling and batch statistics (composed of the ops of _math_ops and
_array_ops), and the tf.nn and tf.math namespaces, whose ops accept symbolic operands."""

import builtins as _builtins
import sys as _sys
import types as _types

import numpy as np

from . import errors
from ._tensor import DTensor, _number
from ._dtypes import int8, int32, uint8
from ._ops import _apply, _as_dtensor, _as_tensor, _symbolic_aware, cast, identity, ones_like, zeros_like
from ._math_ops import (abs, add, argmax, argmin, concat, cos, cumsum, divide, equal, erf, exp,
                        floordiv, floormod, gelu, greater, greater_equal, layer_norm, less,
                        less_equal, log, log_softmax, logical_and, logical_not, logical_or,
                        logical_xor, matmul, maximum, minimum, mod, multiply, negative, not_equal,
                        pow, reduce_logsumexp, reduce_max, reduce_mean, reduce_min, reduce_prod,
                        reduce_sum, relu, reshape, rms_norm, rsqrt, sigmoid, silu, sin, slice,
                        softmax, sqrt, square, subtract, swish, tanh, transpose, truediv, where)
from ._array_ops import (_int_dtensor, broadcast_to, einsum, embedding_lookup, expand_dims,
                         gather_rows, one_hot, pad, split, squeeze, stack, take, tile,
                         unsorted_segment_sum)
from ._variables import DVariable
from ._strategies import get_replica_context


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
    """tf.nn.sparse_softmax_cross_entropy_with_logits: the same with integer class labels, one
    fused op (its gradient one pass over the logits, no one-hot tensor; a class axis sharded
    over a mesh axis costs two small all-reduces). A label outside [0, classes) gives NaN for
    its row, as TensorFlow's GPU kernel."""
    logits = _as_tensor(logits, "sparse_softmax_cross_entropy_with_logits: logits")
    if logits.ndim < 1:
        raise ValueError("sparse_softmax_cross_entropy_with_logits: logits must have a class "
                         "axis (rank >= 1)")
    ids = _int_dtensor(labels, logits, "sparse_softmax_cross_entropy_with_logits: labels")
    if ids.dtype in (uint8, int8):
        ids = cast(ids, int32)
    return _apply("sparse_xent", [ids, logits])


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
    functional node when an operand is symbolic (a KerasTensor), as TensorFlow's ops do: each
    is replaced by its wrapper wherever the package and its modules hold it."""
    ops = {f for ns in (nn, math) for f in vars(ns).values() if callable(f)}
    ops |= {cast, reshape, transpose, concat, stack, matmul, einsum, where, expand_dims, squeeze,
            gather_rows, take, one_hot, slice, split, tile, pad, broadcast_to, identity,
            zeros_like, ones_like, relu, conv2d, max_pool2d, avg_pool2d, moments,
            batch_normalization}
    wrapped = {id(f): _symbolic_aware(f) for f in ops
               if not isinstance(f, type) and not hasattr(f, "__wrapped__")}
    package = __name__.rpartition(".")[0]
    holders = [m for name, m in list(_sys.modules.items())
               if name == package or name.startswith(package + ".")]
    for holder in holders + [nn, math]:
        for name, f in list(vars(holder).items()):
            if id(f) in wrapped:
                setattr(holder, name, wrapped[id(f)])


_install_symbolic()
