"""Training in C: a traced function's gradient, Dense and Sequential models, and optimizers
(SGD, Adam, AdamW, RMSprop) with their learning rates."""

import builtins as _builtins
import re

import numpy as np

from . import _dtensor as _c
from . import _replicas, errors
from ._dtensor import DTensorError
from ._dtypes import _NUMPY, _code, _live, _raw
from ._runtime import _current_strategy, _ensure_init
from ._tensor import _number, _read, _value
from ._ops import _no_trace, _result
from ._array_ops import copy_to_mesh, relayout
from ._variables import DVariable
from ._function import Function

# ---- training: gradients, models, optimizers -------------------------------------------------


def _function_gradient(self, loss_output, wrt, *args):
    """A Function computing this one's outputs followed by the gradients of the sum of output
    ``loss_output`` with respect to the inputs at positions ``wrt``, each in that input's
    layout (weight gradients of batch-sharded data come out all-reduced by the expansion)."""
    f, _, _, meshes, captures = self._traced(args, "gradient")
    g = _c.function_gradient(f, int(loss_output), [int(i) for i in wrt])
    grad = Function(self._fn)
    n = len(meshes) + len(wrt)
    grad._traces[self._signature(args)] = (g, n, list, meshes + [args[i].layout.mesh
                                                                  for i in wrt], captures)
    return grad


Function.gradient = _function_gradient

_ACTIVATIONS = {None: _c.ACTIVATION_NONE, "linear": _c.ACTIVATION_NONE,
                "relu": _c.ACTIVATION_RELU, "tanh": _c.ACTIVATION_TANH,
                "sigmoid": _c.ACTIVATION_SIGMOID}
_INITIALIZERS = {"zeros": _c.INIT_ZEROS, "ones": _c.INIT_ONES,
                 "glorot_uniform": _c.INIT_GLOROT_UNIFORM, "random_normal": _c.INIT_RANDOM_NORMAL}
_LOSSES = {"mean_squared_error": _c.LOSS_MEAN_SQUARED_ERROR, "mse": _c.LOSS_MEAN_SQUARED_ERROR,
           "softmax_cross_entropy": _c.LOSS_SOFTMAX_CROSS_ENTROPY,
           "categorical_crossentropy": _c.LOSS_SOFTMAX_CROSS_ENTROPY,
           "binary_cross_entropy": _c.LOSS_BINARY_CROSS_ENTROPY,
           "binary_crossentropy": _c.LOSS_BINARY_CROSS_ENTROPY}


def _lookup(table, name, what):
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; one of {sorted(k for k in table if k)}")
    return table[name]


class Dense:
    """A dense layer config (keras.layers.Dense): y = activation(x @ kernel + bias)."""

    def __init__(self, units, activation=None, use_bias=True, kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", kernel_regularizer_l2=0.0):
        self.config = (int(units), _lookup(_ACTIVATIONS, activation, "activation"),
                       _lookup(_INITIALIZERS, kernel_initializer, "initializer"),
                       _lookup(_INITIALIZERS, bias_initializer, "initializer"),
                       0 if use_bias else 1, float(kernel_regularizer_l2))


class Sequential:
    """A sequential model of Dense layers on inputs [batch, input_features]. Created inside a
    strategy's scope, its variables take that strategy's layouts (collective)."""

    def __init__(self, layers, input_features, dtype=np.float32, seed=0):
        if not isinstance(layers, (list, tuple)) or not all(isinstance(l, Dense) for l in layers):
            raise TypeError("Sequential: layers must be a list of dtensor.Dense")
        _ensure_init()
        self._handle = _c.model_create(int(input_features), [l.config for l in layers],
                                       _code(dtype), int(seed))
        self._strategy = _current_strategy()
        self.dtype = np.dtype(dtype)
        _live.add(self)

    @property
    def variable_names(self):
        return _c.model_variables(self._handle)

    def get_weights(self):
        """Every variable's value as a numpy array (collective gather)."""
        out = []
        for i in _builtins.range(len(self.variable_names)):
            h = _c.model_variable_read(self._handle, i)
            dtype, shape, _ = _c.tensor_meta(h)
            a = np.empty(shape, dtype=_NUMPY[dtype])
            _c.tensor_to_host(h, -1, _raw(a))
            h.free()
            out.append(a)
        return out

    def __call__(self, x):
        return _result(_c.model_predict(self._handle, x._handle), x.layout.mesh)

    def evaluate(self, x, y, loss="mean_squared_error"):
        return _c.model_evaluate(self._handle, _lookup(_LOSSES, loss, "loss"), x._handle,
                                 y._handle)

    def train_step(self, x, y, loss, optimizer):
        """One step of the tf.distribute custom training loop (per-replica losses / global
        batch, gradients, optimizer update); returns the step's loss (SUM over replicas)."""
        s = self._strategy._handle if self._strategy else None
        return _c.train_step(s, self._handle, _lookup(_LOSSES, loss, "loss"),
                             optimizer._handle, x._handle, y._handle)


class Optimizer:
    """An optimizer over DVariables (the C dt_optimizer: slots kept per variable in its
    layout). ``apply_gradients(zip(grads, variables))`` updates them; inside
    ``strategy.run`` it first sums every replica's gradients (all-reduce, as TensorFlow's
    MirroredStrategy does), then updates the mirrored variables once.

    Keras's gradient clipping (None: off): ``clipvalue`` clips each element to [-clipvalue,
    clipvalue], ``clipnorm`` scales each gradient to a norm of at most clipnorm,
    ``global_clipnorm`` scales all the gradients of one update by global_clipnorm /
    max(global norm, global_clipnorm), in the C optimizer's fused update (no clipped copy).
    Keras raises when clipnorm and global_clipnorm are both set; with clipvalue as well, Keras
    would ignore clipvalue, dtensor raises InvalidArgumentError."""

    def __init__(self, kind, learning_rate, momentum=0.0, nesterov=False, beta_1=0.0,
                 beta_2=0.0, epsilon=0.0, weight_decay=0.0, rho=0.0, clipnorm=None,
                 clipvalue=None, global_clipnorm=None):
        from ._ps import ParameterServerStrategy, _SharedCounter  # noqa: PLC0415 (a later module)
        kinds = (_c.OPTIMIZER_SGD, _c.OPTIMIZER_ADAM, _c.OPTIMIZER_ADAMW, _c.OPTIMIZER_RMSPROP)
        if isinstance(kind, bool) or kind not in kinds:
            raise ValueError(f"Optimizer: kind {kind!r} is not one of {kinds} (use SGD, Adam, "
                             f"AdamW or RMSprop)")
        if global_clipnorm is not None and clipnorm is not None:
            raise ValueError(f"Only one of `clipnorm` and `global_clipnorm` can be set. "
                             f"Received: clipnorm={clipnorm}, global_clipnorm={global_clipnorm}")
        numbers = [_number(v, f"Optimizer: {n}") for n, v in (
            ("learning_rate", learning_rate), ("momentum", momentum), ("beta_1", beta_1),
            ("beta_2", beta_2), ("epsilon", epsilon), ("weight_decay", weight_decay),
            ("rho", rho), ("clipnorm", clipnorm or 0.0),
            ("global_clipnorm", global_clipnorm or 0.0), ("clipvalue", clipvalue or 0.0))]
        self._lr = float(numbers[0])
        self._handle = _c.optimizer_create(kind, self._lr, float(numbers[1]),
                                           bool(nesterov), *[float(v) for v in numbers[2:]])
        self.clipnorm, self.clipvalue, self.global_clipnorm = clipnorm, clipvalue, global_clipnorm
        self._clips = {"clipnorm": clipnorm, "clipvalue": clipvalue,
                       "global_clipnorm": global_clipnorm}
        self._no_decay = []  # exclude_from_weight_decay's var_list
        self._no_decay_pattern = None  # and its var_names
        self._no_decay_told = {}  # id -> the variable the C optimizer excludes
        self.iterations = 0
        self._kind = kind
        momentum_, b1, b2, eps, wd, rho_ = (float(v) for v in numbers[1:7])
        self._hyper = {"momentum": momentum_, "nesterov": bool(nesterov), "beta_1": b1 or 0.9,
                       "beta_2": b2 or 0.999, "epsilon": eps or 1e-7, "weight_decay": wd,
                       "rho": rho_ or 0.9}
        _live.add(self)
        # made in a parameter-server strategy's scope: its slots live on the ps tasks too
        strategy = _current_strategy()
        self._ps_slots = {}  # id(PSVariable) -> its slot variables on the ps tasks
        self._ps_step = None
        if isinstance(strategy, ParameterServerStrategy):
            self._ps_step = _SharedCounter(strategy)
            strategy._optimizers.append(self)
            for ref in strategy._ps_variables:
                if ref() is not None:
                    self._add_ps_slots(ref())

    def _slot_count(self):
        if self._kind == _c.OPTIMIZER_SGD:
            return 1 if self._hyper["momentum"] > 0 else 0
        if self._kind == _c.OPTIMIZER_RMSPROP:
            return 2 if self._hyper["momentum"] > 0 else 1
        return 2

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        """Keras's: the variables of ``var_list``, and those whose name contains a match of one
        of ``var_names`` (regular expressions), take no weight decay. Before the first update
        only (Keras builds the optimizer then)."""
        if self.iterations:
            raise ValueError("`exclude_from_weight_decay()` can only be configured before the "
                             "optimizer is built.")
        for v in var_list or []:
            if not isinstance(v, DVariable):
                raise TypeError(f"exclude_from_weight_decay: {v!r} is not a DVariable")
        self._no_decay = list(var_list or [])
        self._no_decay_pattern = re.compile("|".join(set(var_names))) if var_names else None

    def _decays(self, v):
        """Whether AdamW decays v (not excluded by exclude_from_weight_decay)."""
        if any(v is x for x in self._no_decay):
            return False
        p = self._no_decay_pattern
        return not (p is not None and p.search(v.name))

    def _clip_host(self, grads):
        """Keras's clipping of host gradients (the parameter-server path's numpy update)."""
        c = self._clips
        if c["clipnorm"]:
            return [g * (c["clipnorm"] / max(float(np.sqrt(np.sum(np.square(g, dtype=np.float64)))),
                                             c["clipnorm"])) for g in grads]
        if c["global_clipnorm"]:
            n = float(np.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for g in grads)))
            return [g * (c["global_clipnorm"] / max(n, c["global_clipnorm"])) for g in grads]
        if c["clipvalue"]:
            return [np.clip(g, -c["clipvalue"], c["clipvalue"]) for g in grads]
        return grads

    def _add_ps_slots(self, v):
        """The slots of a parameter-server variable, made on the ps tasks when the variable or
        the optimizer is (collective: every client makes them in the same order)."""
        from ._ps import PSVariable  # noqa: PLC0415 (a later module)
        self._ps_slots[id(v)] = [
            PSVariable(np.zeros(v.shape, v.dtype), trainable=False,
                       name=f"{v.name}/{'mv'[k]}", _slot=True)
            for k in _builtins.range(self._slot_count())]

    def _ps_update(self, pairs):
        """Updates of parameter-server variables by a worker, Keras's rules on the host: it
        reads each variable and its slots, computes the new values and adds the differences
        one-sidedly (the ps tasks are not locked, so concurrent workers' updates interleave,
        as asynchronous training's do)."""
        h, lr = self._hyper, self._lr
        t = None
        if self._kind in (_c.OPTIMIZER_ADAM, _c.OPTIMIZER_ADAMW):
            t = self._ps_step.fetch_add(1) + 1  # the cluster's update count, as TF's iterations
        grads = self._clip_host([np.asarray(_read(_value(g)), dtype=v.dtype) for v, g in pairs])
        for (v, _), g in zip(pairs, grads):
            slots = self._ps_slots.get(id(v))
            if slots is None:
                raise DTensorError(f"apply_gradients: {v.name!r} lives on the ps tasks but the "
                                   f"optimizer was not made in the strategy's scope (its slots "
                                   f"must live there too)")
            g = np.asarray(g, dtype=v.dtype)
            w = v._host()
            old = [sl._host() for sl in slots]
            new = list(old)
            if self._kind == _c.OPTIMIZER_SGD:
                if slots:
                    new[0] = h["momentum"] * old[0] - lr * g
                    step = h["momentum"] * new[0] - lr * g if h["nesterov"] else new[0]
                    nw = w + step
                else:
                    nw = w - lr * g
            elif self._kind == _c.OPTIMIZER_RMSPROP:
                new[0] = h["rho"] * old[0] + (1 - h["rho"]) * g * g
                d = lr * g / np.sqrt(new[0] + h["epsilon"])
                if len(slots) > 1:
                    new[1] = h["momentum"] * old[1] + d
                    d = new[1]
                nw = w - d
            else:
                base = w * (1 - lr * h["weight_decay"]) \
                    if self._kind == _c.OPTIMIZER_ADAMW and self._decays(v) else w
                new[0] = h["beta_1"] * old[0] + (1 - h["beta_1"]) * g
                new[1] = h["beta_2"] * old[1] + (1 - h["beta_2"]) * g * g
                lr_t = lr * np.sqrt(1 - h["beta_2"] ** t) / (1 - h["beta_1"] ** t)
                nw = base - lr_t * new[0] / (np.sqrt(new[1]) + h["epsilon"])
            for sl, a, b in zip(slots, old, new):
                sl._add_host(np.asarray(b - a, dtype=v.dtype))
            v._add_host(np.asarray(nw - w, dtype=v.dtype))

    @property
    def learning_rate(self):
        """The learning rate as Keras shows it, a scalar variable (``numpy()``, ``assign``,
        ``float()``); assigning ``optimizer.learning_rate = x`` sets it for the next updates
        (every client alike)."""
        return _LearningRate(self)

    @learning_rate.setter
    def learning_rate(self, value):
        lr = float(_number(value, "Optimizer: learning_rate"))
        _c.optimizer_set_learning_rate(self._handle, lr)
        self._lr = lr

    lr = learning_rate  # Keras 2's name

    def get_config(self):
        """The constructor's arguments (Keras's get_config): what a saved model recompiles
        with."""
        return dict(getattr(self, "_config", {}), learning_rate=self._lr, **self._clips)

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def apply_gradients(self, grads_and_vars):
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        for g, v in pairs:
            if not isinstance(v, DVariable):
                raise TypeError(f"apply_gradients: {v!r} is not a DVariable")
        ctx = _replicas.current()
        if ctx is not None:
            strategy = ctx.strategy

            def merge(payloads):
                summed = [_replicas._sum_replicas(strategy, [p[j] for p in payloads], "SUM")
                          for j in _builtins.range(len(pairs))]
                self._update([v for _, v in pairs], summed)
                return [None] * len(payloads)
            ctx._runner.sync(ctx._local, ("apply_gradients", id(self)), merge,
                             [g for g, _ in pairs])
        else:
            self._update([v for _, v in pairs], [_value(g) for g, _ in pairs])
        return self.iterations

    def minimize(self, loss, var_list, tape):
        """apply_gradients of tape.gradient(loss, var_list)."""
        return self.apply_gradients(zip(tape.gradient(loss, var_list), var_list))

    def _update(self, variables, grads):
        from ._ps import PSVariable  # noqa: PLC0415 (a later module)
        _no_trace("an optimizer's update")
        ps = [(v, g) for v, g in zip(variables, grads) if isinstance(v, PSVariable)]
        if ps and self.global_clipnorm and len(ps) < len(variables):
            raise errors.UnimplementedError("apply_gradients: global_clipnorm over parameter-"
                                            "server and other variables in one update")
        if ps:
            self._ps_update(ps)
            pairs = [(v, g) for v, g in zip(variables, grads) if not isinstance(v, PSVariable)]
            variables, grads = [v for v, _ in pairs], [g for _, g in pairs]
            if not variables:
                self.iterations += 1
                return
        fitted = []
        for v, g in zip(variables, grads):
            if g.layout.mesh is not v.layout.mesh:
                g = copy_to_mesh(g, v.layout)
            elif g.layout != v.layout:
                g = relayout(g, v.layout)
            fitted.append(g)
        told = [v for v in variables if id(v) not in self._no_decay_told and not self._decays(v)]
        if told:
            _c.optimizer_exclude_from_weight_decay(self._handle, [v._handle for v in told])
            self._no_decay_told.update((id(v), v) for v in told)
        _c.optimizer_apply(self._handle, [v._handle for v in variables],
                           [g._handle for g in fitted])
        for v in variables:
            v._version += 1
        self.iterations += 1


class _LearningRate:
    """An optimizer's learning rate, shown as Keras's scalar variable."""

    def __init__(self, optimizer):
        self._optimizer = optimizer

    def numpy(self):
        return np.float32(self._optimizer._lr)

    def assign(self, value):
        self._optimizer.learning_rate = value
        return self

    def __float__(self):
        return float(self._optimizer._lr)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.numpy(), dtype=dtype)

    def __format__(self, spec):
        return format(self.numpy(), spec)

    def __eq__(self, other):
        return float(self) == other

    __hash__ = None

    def __repr__(self):
        return (f"<dtensor.Variable 'learning_rate:0' shape=() dtype=float32, "
                f"numpy={self.numpy()}>")


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__truediv__", "__rtruediv__", "__lt__", "__le__", "__gt__", "__ge__", "__neg__"):
    setattr(_LearningRate, _name,
            lambda self, *other, _name=_name: getattr(float(self), _name)(*other))


class SGD(Optimizer):
    def __init__(self, learning_rate=0.01, momentum=0.0, nesterov=False, clipnorm=None,
                 clipvalue=None, global_clipnorm=None):
        self._config = {"momentum": momentum, "nesterov": nesterov}
        super().__init__(_c.OPTIMIZER_SGD, learning_rate, momentum, nesterov, clipnorm=clipnorm,
                         clipvalue=clipvalue, global_clipnorm=global_clipnorm)


class Adam(Optimizer):
    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                 clipnorm=None, clipvalue=None, global_clipnorm=None):
        self._config = {"beta_1": beta_1, "beta_2": beta_2, "epsilon": epsilon}
        super().__init__(_c.OPTIMIZER_ADAM, learning_rate, 0.0, False, beta_1, beta_2, epsilon,
                         clipnorm=clipnorm, clipvalue=clipvalue, global_clipnorm=global_clipnorm)


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Keras's AdamW): each update first shrinks a variable by
    learning_rate * weight_decay of itself, then takes Adam's step."""

    def __init__(self, learning_rate=0.001, weight_decay=0.004, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-7, clipnorm=None, clipvalue=None, global_clipnorm=None):
        if not weight_decay > 0:
            raise ValueError(f"AdamW: weight_decay {weight_decay}, expected > 0 (Adam has none)")
        self._config = {"weight_decay": weight_decay, "beta_1": beta_1, "beta_2": beta_2,
                        "epsilon": epsilon}
        super().__init__(_c.OPTIMIZER_ADAMW, learning_rate, 0.0, False, beta_1, beta_2, epsilon,
                         weight_decay, clipnorm=clipnorm, clipvalue=clipvalue,
                         global_clipnorm=global_clipnorm)


class RMSprop(Optimizer):
    """Keras's RMSprop (not centered): a running mean of squared gradients scales each step."""

    def __init__(self, learning_rate=0.001, rho=0.9, momentum=0.0, epsilon=1e-7,
                 centered=False, clipnorm=None, clipvalue=None, global_clipnorm=None):
        if centered:
            raise errors.UnimplementedError("RMSprop: centered=True is not supported")
        self._config = {"rho": rho, "momentum": momentum, "epsilon": epsilon}
        super().__init__(_c.OPTIMIZER_RMSPROP, learning_rate, momentum, False, 0.0, 0.0,
                         epsilon, 0.0, rho, clipnorm=clipnorm, clipvalue=clipvalue,
                         global_clipnorm=global_clipnorm)
