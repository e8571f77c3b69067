"""Math ops: matmul, elementwise unary and binary ops, reductions, the row-wise ops (softmax,
normalization, arg reductions, running sums), transpose, reshape, slice and concat."""

import builtins as _builtins

import numpy as np

from . import _dtensor as _c
from . import errors
from ._dtypes import _code, int64
from ._tensor import DTensor, _Variable, _value
from ._ops import _apply, _as_dtensor, _as_tensor, cast


def matmul(a, b, transpose_a=False, transpose_b=False):
    """a @ b with optional transposes of the last two axes; leading batch axes allowed."""
    return _apply("matmul", [a, b], int(bool(transpose_a)), int(bool(transpose_b)))


def _unary(code):
    def op(x):
        return _apply("unary", (x,), code)
    return op


neg = negative = _unary(_c.UNARY_NEG)
abs = _unary(_c.UNARY_ABS)  # noqa: A001 (tf.abs)
exp = _unary(_c.UNARY_EXP)
log = _unary(_c.UNARY_LOG)
sqrt = _unary(_c.UNARY_SQRT)
relu = _unary(_c.UNARY_RELU)
tanh = _unary(_c.UNARY_TANH)
sigmoid = _unary(_c.UNARY_SIGMOID)
square = _unary(_c.UNARY_SQUARE)
sin = _unary(_c.UNARY_SIN)
cos = _unary(_c.UNARY_COS)
erf = _unary(_c.UNARY_ERF)
silu = swish = _unary(_c.UNARY_SILU)
rsqrt = _unary(_c.UNARY_RSQRT)
logical_not = _unary(_c.UNARY_LOGICAL_NOT)
_gelu_erf = _unary(_c.UNARY_GELU)
_gelu_tanh = _unary(_c.UNARY_GELU_TANH)


def gelu(features, approximate=False):
    """tf.nn.gelu: x Phi(x) with the normal distribution's Phi (erf form), or its tanh
    approximation when ``approximate``."""
    return (_gelu_tanh if approximate else _gelu_erf)(features)


def _binary(code):
    def op(a, b):
        if not isinstance(a, (DTensor, _Variable)) and not isinstance(b, (DTensor, _Variable)):
            a = _as_tensor(a, "x")  # two Python values: TensorFlow's conversion
        if type(a) is not DTensor:
            a = _as_dtensor(a, b)
        if type(b) is not DTensor:
            b = _as_dtensor(b, a)
        return _apply("binary", (a, b), code)
    return op


add = _binary(_c.BINARY_ADD)
subtract = _binary(_c.BINARY_SUB)
multiply = _binary(_c.BINARY_MUL)
_divide = _binary(_c.BINARY_DIV)  # integers truncate
floordiv = _binary(_c.BINARY_FLOORDIV)
floormod = mod = _binary(_c.BINARY_FLOORMOD)
maximum = _binary(_c.BINARY_MAX)
minimum = _binary(_c.BINARY_MIN)
pow = _binary(_c.BINARY_POW)  # noqa: A001 (tf.pow)
equal = _binary(_c.BINARY_EQ)
not_equal = _binary(_c.BINARY_NE)
less = _binary(_c.BINARY_LT)
less_equal = _binary(_c.BINARY_LE)
greater = _binary(_c.BINARY_GT)
greater_equal = _binary(_c.BINARY_GE)
logical_and = _binary(_c.BINARY_LOGICAL_AND)
logical_or = _binary(_c.BINARY_LOGICAL_OR)
logical_xor = _binary(_c.BINARY_LOGICAL_XOR)


def where(condition, x=None, y=None):
    """tf.where(condition, x, y): x where the bool condition holds, else y; the three broadcast
    as numpy does and x and y are promoted to one dtype. (The one-argument form, the indices
    of true elements, has a data-dependent shape and is not supported.)"""
    if x is None or y is None:
        raise errors.UnimplementedError("where(condition) without x and y (indices of the true "
                                  "elements) is not supported: its shape depends on the data")
    like = next((v for v in (x, y, condition) if isinstance(v, (DTensor, _Variable))), None)
    if like is None:
        raise TypeError("where: no operand is a DTensor")
    like = _value(like)
    c = condition if isinstance(condition, (DTensor, _Variable)) else \
        _as_dtensor(np.asarray(condition, dtype=bool), like)
    x = x if isinstance(x, (DTensor, _Variable)) else _as_dtensor(x, like)
    y = y if isinstance(y, (DTensor, _Variable)) else _as_dtensor(y, like)
    return _apply("where", (c, x, y))


def _reduce(code):
    def op(input_tensor, axis=None, keepdims=False):
        if axis is None:
            axes = []
        elif isinstance(axis, (list, tuple)):
            axes = [int(a) for a in axis]
        else:
            axes = [int(axis)]
        if axis is not None and not axes:
            raise ValueError("reduce over an empty list of axes")
        return _apply("reduce", [input_tensor], code, axes, int(bool(keepdims)))
    return op


def truediv(x, y):
    """x / y as TensorFlow's truediv: integer operands are converted to float64 first (so
    7 / 2 is 3.5); floats divide in their dtype."""
    if not isinstance(x, (DTensor, _Variable)) and not isinstance(y, (DTensor, _Variable)):
        x = _as_tensor(x, "truediv: x")
    x, y = (v if isinstance(v, (DTensor, _Variable)) else _as_dtensor(v, w)
            for v, w in ((x, y), (y, x)))
    if np.issubdtype(x.dtype, np.integer):
        x, y = cast(x, np.float64), cast(y, np.float64)
    return _divide(x, y)


divide = truediv

reduce_sum = _reduce(_c.REDUCE_SUM)
_reduce_mean = _reduce(_c.REDUCE_MEAN)


def reduce_mean(input_tensor, axis=None, keepdims=False):
    """The mean; of an integer tensor, the integer sum divided by the count, truncated as
    TensorFlow's integer mean."""
    x = _as_tensor(input_tensor, "reduce_mean: input_tensor")
    if not np.issubdtype(x.dtype, np.integer):
        return _reduce_mean(x, axis, keepdims)
    total = reduce_sum(x, axis, keepdims)  # checks the axes
    axes = _builtins.range(x.ndim) if axis is None else \
        (axis if isinstance(axis, (list, tuple)) else [axis])
    count = int(np.prod([x.shape[int(a)] for a in axes], dtype=np.int64))
    return _divide(total, count)


reduce_max = _reduce(_c.REDUCE_MAX)
reduce_min = _reduce(_c.REDUCE_MIN)
reduce_prod = _reduce(_c.REDUCE_PROD)


# ---- row-wise ops: softmax, normalization, arg reductions, running sums ----------------------
# One C op each (spmd/ops/softmax.c, norm.c, arg_reduce.c, cumsum.c): along a sharded axis only
# the per-row statistics cross devices (all-reduces of [rows, 1], an all-gather of (value, index)
# records or of shard totals), never x itself.


def softmax(logits, axis=-1):
    """tf.nn.softmax: exp(x - max) / sum exp(x - max) along ``axis`` (floating x)."""
    return _apply("softmax", [logits], 0, [int(axis)], 0)


def log_softmax(logits, axis=-1):
    """tf.nn.log_softmax: x - max - log sum exp(x - max) along ``axis`` (floating x)."""
    return _apply("softmax", [logits], 1, [int(axis)], 0)


def reduce_logsumexp(input_tensor, axis=None, keepdims=False):
    """tf.math.reduce_logsumexp: log sum exp(x) over ``axis`` (None: every axis), computed as
    max + log sum exp(x - max)."""
    if axis is None:
        axes = []
    elif isinstance(axis, (list, tuple)):
        axes = [int(a) for a in axis]
        if not axes:
            raise ValueError("reduce_logsumexp over an empty list of axes")
    else:
        axes = [int(axis)]
    return _apply("softmax", [input_tensor], 2, axes, int(bool(keepdims)))


def _norm(code, x, params, epsilon):
    x = _as_tensor(x, "layer_norm/rms_norm: x")
    tensors, flag = [x], 0
    for bit, p in params:
        if p is not None:
            tensors.append(p if isinstance(p, (DTensor, _Variable)) else _as_dtensor(p, x))
            flag |= bit
    return _apply("norm", tensors, code, flag, float(epsilon))


def layer_norm(x, gamma=None, beta=None, epsilon=1e-5):
    """Layer normalization over the last axis: (x - mean) / sqrt(var + epsilon) * gamma + beta
    (gamma and beta of shape [last], either may be None). As Keras' LayerNormalization(axis=-1).
    """
    return _norm(0, x, ((1, gamma), (2, beta)), epsilon)


def rms_norm(x, gamma=None, epsilon=1e-6):
    """RMS normalization over the last axis: x / sqrt(mean(x^2) + epsilon) * gamma."""
    return _norm(1, x, ((1, gamma),), epsilon)


def _arg_reduce(code):
    def op(input, axis=None, output_type=int64):  # noqa: A002 (TensorFlow's names)
        axis = 0 if axis is None else int(axis)  # TensorFlow's default axis is 0
        return _apply("arg_reduce", [input], code, [axis, _code(output_type)])
    return op


argmax = _arg_reduce(0)
argmax.__doc__ = """tf.math.argmax: the index of the largest element along ``axis`` (the first on
ties, the first NaN as numpy), as ``output_type`` (int64 or int32); any dtype."""
argmin = _arg_reduce(1)
argmin.__doc__ = """tf.math.argmin: the index of the smallest element along ``axis``."""


def cumsum(x, axis=0, exclusive=False, reverse=False):
    """tf.math.cumsum: running sums along ``axis``; ``exclusive`` leaves each element out of its
    own sum, ``reverse`` sums from the end (numeric dtypes; integers wrap)."""
    return _apply("cumsum", [x], int(axis), int(bool(exclusive)) | (int(bool(reverse)) << 1))


def transpose(a, perm=None):
    a = _as_tensor(a, "transpose: a")
    perm = list(reversed(_builtins.range(a.ndim))) if perm is None else [int(p) for p in perm]
    return _apply("transpose", [a], 0, perm)


def reshape(tensor, shape):
    """tf.reshape; one extent may be -1 (inferred from the others)."""
    shape = [int(d) for d in (np.asarray(shape).reshape(-1).tolist()
                              if isinstance(shape, (np.ndarray, DTensor)) else shape)]
    if -1 in shape:
        t = _as_tensor(tensor, "reshape: tensor")
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        total = int(np.prod(t.shape, dtype=np.int64))
        if shape.count(-1) > 1 or known == 0 or total % known:
            raise ValueError(f"reshape: cannot infer the -1 of {shape} for {total} elements "
                             f"(shape {t.shape})")
        shape[shape.index(-1)] = total // known
        tensor = t
    return _apply("reshape", [tensor], 0, shape)


def slice(input_, begin, size):  # noqa: A001 (tf.slice)
    """input_[begin[i] : begin[i] + size[i]]; size -1 takes the rest of the axis."""
    input_ = _as_tensor(input_, "slice: input_")
    begin, size = [int(b) for b in begin], [int(s) for s in size]
    if len(begin) != input_.ndim or len(size) != input_.ndim:
        raise ValueError(f"slice: begin has {len(begin)} entries and size {len(size)}, the "
                         f"tensor rank {input_.ndim}")
    size = [input_.shape[i] - begin[i] if s == -1 else s for i, s in enumerate(size)]
    return _apply("slice", [input_], 0, begin, size)


def concat(values, axis):
    return _apply("concat", values, int(axis))
