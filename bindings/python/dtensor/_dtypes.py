"""Dtypes: the dtypes the C layer takes and their codes, the raw bytes of an array,
TensorShape, and the registry of live objects."""

import weakref

import ml_dtypes
import numpy as np

from . import _dtensor as _c

UNSHARDED = "unsharded"

#: numpy's bfloat16 (from ml_dtypes, as JAX and TensorFlow take it).
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float16, float32, float64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
int8, uint8, int32, int64 = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int32),
                             np.dtype(np.int64))
bool_ = np.dtype(np.bool_)

_DTYPES = {
    float32: _c.DTYPE_F32,
    float64: _c.DTYPE_F64,
    int32: _c.DTYPE_I32,
    int64: _c.DTYPE_I64,
    bfloat16: _c.DTYPE_BF16,
    float16: _c.DTYPE_F16,
    bool_: _c.DTYPE_BOOL,
    uint8: _c.DTYPE_U8,
    int8: _c.DTYPE_I8,
}
_NUMPY = {code: dt for dt, code in _DTYPES.items()}
_DTYPE_NAMES = ", ".join(str(d) for d in _DTYPES)


def _raw(a):
    """The bytes of a numpy array as the C layer takes them: bfloat16 (which the buffer
    protocol cannot describe) as its 16-bit patterns, everything else as it is."""
    return a.view(np.uint16) if a.dtype == bfloat16 else a


class TensorShape(tuple):
    """tf.TensorShape: a tuple of extents (None for an unknown one), ``as_list()``,
    ``rank``, ``num_elements()``."""

    def __new__(cls, dims=()):
        if isinstance(dims, (int, np.integer)):
            dims = [dims]
        return super().__new__(cls, (None if d is None else int(d) for d in (dims or ())))

    @property
    def rank(self):
        return len(self)

    @property
    def ndims(self):
        return len(self)

    @property
    def dims(self):
        return list(self)

    def as_list(self):
        return list(self)

    def num_elements(self):
        return None if None in self else int(np.prod(self, dtype=np.int64))

    def is_fully_defined(self):
        return None not in self

    def __repr__(self):
        return f"TensorShape({list(self)})"

    def __str__(self):
        return "(" + ", ".join("None" if d is None else str(d) for d in self) + \
            ("," if len(self) == 1 else "") + ")"


class _Registry:
    """Live objects in creation order (collective creations happen in the same order on every
    client), so that shutdown releases them in reverse order, alike on every client."""

    def __init__(self):
        self._items = weakref.WeakValueDictionary()
        self._next = 0
        self._kept = []

    def add(self, obj, keep=False):
        """keep: an object whose release is collective (a ps variable's window, a coordinator)
        stays alive until shutdown, since garbage collection frees objects at different times
        on different clients."""
        self._items[self._next] = obj
        self._next += 1
        if keep:
            self._kept.append(obj)

    def newest_first(self):
        return [self._items[k] for k in sorted(self._items.keys(), reverse=True)
                if k in self._items]


_live = _Registry()


def _code(dtype):
    dt = np.dtype(dtype)
    if dt not in _DTYPES:
        raise TypeError(f"dtype {dt} is not one of {_DTYPE_NAMES}")
    return _DTYPES[dt]
