"""tf.experimental's names: ``from dtensor.experimental import dtensor`` is TensorFlow's
``from tensorflow.experimental import dtensor`` (it is this package)."""

import sys as _sys
import types as _types

from ._tensor import _from_dlpack_capsule, _to_dlpack

dtensor = _sys.modules[__package__]

#: tf.experimental.dlpack: a tensor with one component on this client lent as a DLPack
#: capsule, and a capsule (or a ``__dlpack__`` object) taken as a regular tensor, no copies
dlpack = _types.SimpleNamespace(to_dlpack=_to_dlpack, from_dlpack=_from_dlpack_capsule)

__all__ = ["dtensor", "dlpack"]
