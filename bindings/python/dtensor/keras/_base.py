"""What the Keras modules share: the ops and activations the losses and layers need, in terms of
dtensor's differentiable ops, and the configs that Model.save writes."""

import functools as _functools
import inspect as _inspect

import numpy as np

from .. import _tape
from .._tensor import _value

# ---- ops the losses and layers need, in terms of dtensor's differentiable ops --------------


def _train():
    from .. import train  # noqa: PLC0415 (dtensor.train imports this package)

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


def _log_softmax(logits):
    return _d().log_softmax(logits, axis=-1)


def softmax(x):
    """Keras' softmax activation: over the last axis (one op, stable; a sharded last axis
    all-reduces only the per-row maximum and sum). The result keeps its logits, as Keras's
    does, so that a sparse cross-entropy of it reads the logits (one fused op)."""
    out = _d().softmax(x, axis=-1)
    out._keras_logits = x
    return out


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
    from ._models import _SAVEABLE  # noqa: PLC0415 (a later module)
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


def errors():
    return _d().errors
