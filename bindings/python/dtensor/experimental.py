"""tf.experimental's names: ``from dtensor.experimental import dtensor`` is TensorFlow's
``from tensorflow.experimental import dtensor`` (it is this package)."""

import sys as _sys

dtensor = _sys.modules[__package__]

__all__ = ["dtensor"]
