"""tf.keras.layers: symbolic inputs (KerasTensor) and the functional graph, the Layer base,
regularizers and the layers (Dense, Conv2D, pooling, Reshape, Embedding, ...)."""

import inspect as _inspect
import types as _types

import numpy as np

from .. import DTensor, DVariable, Layout, get_strategy, _replicas
from .._tensor import _host_array, _shape_arg, _value
from .._ops import _Symbolic, _as_tensor
from .._nn import _hw, _nhwc
from .._utilities import _nest_flatten
from ._base import _Configurable, _activation, _d, errors

# ---- layers ---------------------------------------------------------------------------------


def _glorot_uniform(shape, rng, dtype):
    receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1  # a conv kernel's window
    fan_in = (shape[-2] if len(shape) > 1 else shape[0]) * receptive
    fan_out = shape[-1] * receptive
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=shape).astype(dtype)


_INITIALIZERS = {
    "glorot_uniform": _glorot_uniform,
    "uniform": lambda shape, rng, dtype: rng.uniform(-0.05, 0.05, size=shape).astype(dtype),
    "zeros": lambda shape, rng, dtype: np.zeros(shape, dtype),
    "ones": lambda shape, rng, dtype: np.ones(shape, dtype),
    "random_normal": lambda shape, rng, dtype: rng.normal(0.0, 0.05, size=shape).astype(dtype),
}


class KerasTensor(_Symbolic):
    """A symbolic tensor of Keras's functional API: its shape (None for the batch), dtype and
    the call (a layer's, or an op's) that makes it from other KerasTensors. Layers and
    dtensor ops given one return another; ``keras.Model(inputs, outputs)`` runs the calls."""

    def __init__(self, shape, dtype, name=None, node=None):
        self.shape = _d().TensorShape(shape)
        self.dtype = dtype
        self.name = name
        self._node = node  # (callable, args, kwargs), or None for an Input

    @property
    def ndim(self):
        return len(self.shape)

    def _make_node(self, fn, args, kwargs):
        return _symbolic_call(fn, args, kwargs)

    def __repr__(self):
        return (f"<KerasTensor shape={tuple(self.shape)}, dtype={np.dtype(self.dtype).name}, "
                f"name={self.name}>")


def _is_symbolic(x):
    if isinstance(x, KerasTensor):
        return True
    if isinstance(x, (list, tuple)):
        return any(_is_symbolic(v) for v in x)
    if isinstance(x, dict):
        return any(_is_symbolic(v) for v in x.values())
    return False


def _map_nested(fn, x):
    if isinstance(x, (list, tuple)):
        return type(x)(_map_nested(fn, v) for v in x)
    if isinstance(x, dict):
        return {k: _map_nested(fn, v) for k, v in x.items()}
    return fn(x)


def _placeholder(kt):
    """A value standing for a KerasTensor (a batch of one) to run a call on."""
    shape = [1 if d is None else d for d in kt.shape]
    if np.dtype(kt.dtype) == np.dtype(object):
        return np.full(shape, "", dtype=object)
    return np.zeros(shape, dtype=np.dtype(kt.dtype))


def _symbolic_call(fn, args, kwargs):
    """The KerasTensor of fn(*args, **kwargs) with KerasTensors among the arguments: fn runs
    once on placeholders (a batch of one: it builds the layers it calls), which gives the
    result's shape and dtype; a leading extent of one under an unknown batch is the batch."""
    value = fn(*_map_nested(lambda v: _placeholder(v) if isinstance(v, KerasTensor) else v,
                            list(args)),
               **_map_nested(lambda v: _placeholder(v) if isinstance(v, KerasTensor) else v,
                             kwargs))
    batch = any(isinstance(v, KerasTensor) and v.shape and v.shape[0] is None
                for v in _nest_flatten([list(args), kwargs]))
    node = (fn, args, kwargs)

    def wrap(v):
        a = v if isinstance(v, (DTensor, DVariable)) else np.asarray(v)
        shape = list(a.shape)
        if batch and shape and shape[0] == 1:
            shape[0] = None
        return KerasTensor(shape, a.dtype, node=node)
    if isinstance(value, (list, tuple)):  # one node, several outputs
        outs = [wrap(v) for v in value]
        for k, o in enumerate(outs):
            o._node = (lambda *a, _k=k, **kw: fn(*a, **kw)[_k], args, kwargs)
        return type(value)(outs)
    return wrap(value)


def _node_layers(outputs):
    """The layers the calls behind some KerasTensors use, in call order, each once."""
    seen, order = set(), []

    def visit(x):
        if isinstance(x, (list, tuple)):
            for v in x:
                visit(v)
        elif isinstance(x, dict):
            for v in x.values():
                visit(v)
        elif isinstance(x, KerasTensor) and x._node is not None and id(x) not in seen:
            seen.add(id(x))
            fn, args, kwargs = x._node
            visit(list(args))
            visit(kwargs)
            layer = getattr(fn, "_layer", None)
            if layer is not None and layer not in order:
                order.append(layer)
    visit(outputs)
    return order


def _evaluate(kt, feed, memo):
    """The value of a KerasTensor given the inputs' values (feed: id -> value)."""
    key = id(kt)
    if key in feed:
        return feed[key]
    if key not in memo:
        if kt._node is None:
            raise ValueError(f"the model's outputs need the input {kt.name or kt!r}, which was "
                             f"not given")
        fn, args, kwargs = kt._node

        def value(v):
            return _evaluate(v, feed, memo) if isinstance(v, KerasTensor) else v
        memo[key] = fn(*_map_nested(value, list(args)), **_map_nested(value, kwargs))
    return memo[key]


class Layer(_Configurable):
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
        shape = _shape_arg(shape, f"{self.name}.add_weight")
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
            a = _host_array(x, what=f"{self.name}: inputs")
            ctx = _replicas.current()
            x = _as_tensor(a) if ctx is not None else self._strategy.distribute_batch(a)
        x = _value(x)
        if np.issubdtype(x.dtype, np.floating) and np.issubdtype(self.dtype, np.floating) and \
                x.dtype != self.dtype:
            x = _d().cast(x, self.dtype)
        return x

    def __call__(self, x, training=None, mask=None, **kwargs):
        """The layer on x. ``training`` goes to a ``call`` that takes it, as Keras passes it
        (no built-in layer here behaves differently in training); ``mask`` is accepted. On a
        KerasTensor (the functional API) it gives the KerasTensor of its output."""
        if _is_symbolic(x):
            def call(v):
                return self(v, training=training, **kwargs)
            call._layer = self  # the functional model's layers
            return _symbolic_call(call, (x,), {})
        x = self._input(x)
        if not self.built:
            self.build(x.shape)
            self.built = True
            for ck, path in getattr(self, "_deferred", ()):  # a restore made before the build
                ck.read(path)
            self._deferred = []
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
        """The variables; a parameter-server variable split over ps tasks counts as its shards
        (each with ``shape`` and ``device``), as TensorFlow lists a ShardedVariable's."""
        out = []
        for v in self.variables:
            shards = v.variables if isinstance(v, _d().PSVariable) else None
            out.extend(shards if shards and len(shards) > 1 else [v])
        return out

    def count_params(self):
        return int(sum(np.prod(v.shape) for v in self._variables))


class Regularizer(_Configurable):
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


class Conv2D(Layer):
    """activation(conv2d(x, kernel) + bias), x of shape [batch, height, width, channels]
    (channels last), kernel [kh, kw, channels, filters]: tf.nn.conv2d, composed of windows
    and one einsum (see dtensor.conv2d)."""

    def __init__(self, filters, kernel_size, strides=(1, 1), padding="valid",
                 data_format=None, dilation_rate=(1, 1), activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None, input_shape=None, name=None,
                 dtype=np.float32):
        super().__init__(name, dtype)
        if isinstance(filters, bool) or not isinstance(filters, (int, np.integer)) or \
                filters < 1:
            raise ValueError(f"Conv2D: filters must be a positive integer, got {filters!r}")
        d = _d()
        self.filters = int(filters)
        self.kernel_size = _hw(kernel_size, "Conv2D: kernel_size")
        self.strides = _hw(strides, "Conv2D: strides")
        self.dilation_rate = _hw(dilation_rate, "Conv2D: dilation_rate")
        if str(padding).lower() not in ("valid", "same"):
            raise ValueError(f"Conv2D: padding {padding!r} is not 'valid' or 'same'")
        self.padding = str(padding).lower()
        _nhwc(data_format or "NHWC", "Conv2D")
        self.activation = _activation(activation)
        self.use_bias = use_bias
        self.kernel_initializer, self.bias_initializer = kernel_initializer, bias_initializer
        self.kernel_regularizer = _regularizer(kernel_regularizer)
        self.bias_regularizer = _regularizer(bias_regularizer)
        self.input_shape = None if input_shape is None else tuple(input_shape)

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(f"{self.name}: Conv2D takes [batch, height, width, channels] "
                             f"inputs, got shape {tuple(input_shape)}")
        self.kernel = self.add_weight("kernel", list(self.kernel_size) +
                                      [input_shape[-1], self.filters], self.kernel_initializer,
                                      regularizer=self.kernel_regularizer)
        self.bias = self.add_weight("bias", [self.filters], self.bias_initializer,
                                    regularizer=self.bias_regularizer) if self.use_bias else None

    def call(self, x):
        y = _d().conv2d(x, _beside(self.kernel, x), self.strides, self.padding.upper(),
                        dilations=self.dilation_rate)
        if self.bias is not None:
            y = y + _beside(self.bias, x)
        return self.activation(y)

    def output_shape(self, input_shape):
        return (input_shape[0],) + _pooled(input_shape[1:3], self.kernel_size, self.strides,
                                           self.padding, self.dilation_rate) + (self.filters,)


def _pooled(hw, window, strides, padding, dilation=(1, 1)):
    """The spatial extents after a window op (Keras's conv_output_length)."""
    out = []
    for n, k, s, d in zip(hw, window, strides, dilation):
        span = (k - 1) * d + 1
        out.append(None if n is None else (-(-n // s) if padding == "same" else
                                           (n - span) // s + 1))
    return tuple(out)


class _Pooling2D(Layer):
    _op = None

    def __init__(self, pool_size=(2, 2), strides=None, padding="valid", data_format=None,
                 name=None, dtype=np.float32):
        super().__init__(name, dtype)
        d = _d()
        self.pool_size = _hw(pool_size, f"{type(self).__name__}: pool_size")
        self.strides = self.pool_size if strides is None else \
            _hw(strides, f"{type(self).__name__}: strides")
        if str(padding).lower() not in ("valid", "same"):
            raise ValueError(f"{type(self).__name__}: padding {padding!r} is not 'valid' or "
                             f"'same'")
        self.padding = str(padding).lower()
        _nhwc(data_format or "NHWC", type(self).__name__)

    def build(self, input_shape):
        pass

    def call(self, x):
        return getattr(_d(), self._op)(x, self.pool_size, self.strides, self.padding.upper())

    def output_shape(self, input_shape):
        return (input_shape[0],) + _pooled(input_shape[1:3], self.pool_size, self.strides,
                                           self.padding) + (input_shape[3],)


class MaxPooling2D(_Pooling2D):
    """The maximum of each pool_size window (tf.nn.max_pool2d)."""
    _op = "max_pool2d"


class AveragePooling2D(_Pooling2D):
    """The mean of each pool_size window (tf.nn.avg_pool2d)."""
    _op = "avg_pool2d"


class Reshape(Layer):
    """Each example reshaped to ``target_shape`` (one extent may be -1)."""

    def __init__(self, target_shape, name=None, dtype=np.float32, input_shape=None):
        super().__init__(name, dtype)
        self.target_shape = tuple(int(d) for d in target_shape)
        self.input_shape = None if input_shape is None else tuple(input_shape)

    def build(self, input_shape):
        pass

    def call(self, x):
        return _d().reshape(x, [x.shape[0]] + list(self.output_shape(x.shape)[1:]))

    def output_shape(self, input_shape):
        shape = list(self.target_shape)
        if -1 in shape:
            size = int(np.prod(input_shape[1:]))
            known = int(np.prod([d for d in shape if d != -1]))
            shape[shape.index(-1)] = size // known
        return (input_shape[0],) + tuple(shape)


class InputLayer(Layer):
    """The input of a model: its shape (without the batch axis) and dtype (keras.Input)."""

    def __init__(self, shape=None, batch_size=None, dtype=None, name=None, input_shape=None):
        super().__init__(name, np.float32)
        shape = shape if shape is not None else input_shape
        if shape is None:
            raise ValueError("Input: shape is required")
        self.input_shape = tuple(shape)
        self.input_dtype = dtype
        self.built = True

    def build(self, input_shape):
        pass

    def _input(self, x):
        return x if isinstance(x, (DTensor, DVariable)) else np.asarray(x)

    def call(self, x):
        return x

    def output_shape(self, input_shape):
        return tuple(input_shape)


def Input(shape=None, batch_size=None, name=None, dtype=None, **kwargs):  # noqa: N802 (Keras)
    """keras.Input: a KerasTensor of the batch's shape (the functional API's input; the first
    element of a Sequential too)."""
    layer = InputLayer(shape, batch_size, dtype, name)
    kt = KerasTensor([batch_size] + list(layer.input_shape),
                     np.float32 if dtype is None else dtype, name=name)
    kt._input_layer = layer
    return kt


class StringLookup(Layer):
    """Strings to integer ids by a vocabulary (keras.layers.StringLookup): with
    ``num_oov_indices`` n (1 by default) ids 0..n-1 are for strings outside the vocabulary
    (hashed among them) and vocabulary[i] is n + i; a ``mask_token`` takes id 0 before them.
    A preprocessing layer: it maps numpy arrays of strings to int64 arrays on the host (as in
    a dataset's map)."""

    def __init__(self, max_tokens=None, num_oov_indices=1, mask_token=None,
                 oov_token="[UNK]", vocabulary=None, invert=False, output_mode="int",
                 name=None, **kwargs):
        super().__init__(name)
        if invert or output_mode != "int":
            raise errors().UnimplementedError("StringLookup: only output_mode='int' lookups")
        if vocabulary is None:
            raise ValueError("StringLookup: a vocabulary is required (adapt is not supported)")
        self.num_oov_indices, self.mask_token, self.oov_token = \
            int(num_oov_indices), mask_token, oov_token
        self._vocab = [str(v) for v in vocabulary]
        first = (1 if mask_token is not None else 0) + self.num_oov_indices
        self._index = {v: first + i for i, v in enumerate(self._vocab)}
        self.built = True

    def get_vocabulary(self):
        return ([self.mask_token] if self.mask_token is not None else []) + \
            [self.oov_token] * self.num_oov_indices + list(self._vocab)

    def vocabulary_size(self):
        return len(self.get_vocabulary())

    def _input(self, x):
        return np.asarray(x.numpy() if isinstance(x, DTensor) else x)

    def build(self, input_shape):
        pass

    def call(self, x):
        x = np.asarray(x)
        masked = 1 if self.mask_token is not None else 0
        out = np.empty(x.shape, dtype=np.int64)
        for pos, s in np.ndenumerate(x):
            s = s.decode() if isinstance(s, bytes) else str(s)
            if self.mask_token is not None and s == self.mask_token:
                out[pos] = 0
            elif s in self._index:
                out[pos] = self._index[s]
            elif self.num_oov_indices:
                out[pos] = masked + (hash(s) % self.num_oov_indices if
                                     self.num_oov_indices > 1 else 0)
            else:
                out[pos] = -1
        return out

    def output_shape(self, input_shape):
        return tuple(input_shape)


class Embedding(Layer):
    """Rows of a trainable [input_dim, output_dim] table by integer ids (tf.nn.
    embedding_lookup); in a parameter-server strategy's scope the table is split over the ps
    tasks by its partitioner, as TensorFlow's."""

    def __init__(self, input_dim, output_dim, embeddings_initializer="uniform",
                 embeddings_regularizer=None, input_length=None, name=None, dtype=np.float32,
                 **kwargs):
        super().__init__(name, dtype)
        self.input_dim, self.output_dim = int(input_dim), int(output_dim)
        if self.input_dim < 1 or self.output_dim < 1:
            raise ValueError(f"Embedding: input_dim {input_dim} and output_dim {output_dim} "
                             f"must be positive")
        self.embeddings_initializer = embeddings_initializer
        self.embeddings_regularizer = _regularizer(embeddings_regularizer)

    def _input(self, x):
        """Integer ids stay integers (no cast to the layer's dtype)."""
        if isinstance(x, (DTensor, DVariable)):
            return _value(x)
        a = np.asarray(x)
        ctx = _replicas.current()
        return _as_tensor(a) if ctx is not None else self._strategy.distribute_batch(a)

    def build(self, input_shape):
        self.embeddings = self.add_weight("embeddings", [self.input_dim, self.output_dim],
                                          self.embeddings_initializer,
                                          regularizer=self.embeddings_regularizer)

    def call(self, x):
        return _d().embedding_lookup(_beside(self.embeddings, x), x)

    def output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)


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
                                LayerNormalization=LayerNormalization, Conv2D=Conv2D,
                                Convolution2D=Conv2D, MaxPooling2D=MaxPooling2D,
                                MaxPool2D=MaxPooling2D, AveragePooling2D=AveragePooling2D,
                                AvgPool2D=AveragePooling2D, Reshape=Reshape,
                                InputLayer=InputLayer, Input=Input,
                                StringLookup=StringLookup, Embedding=Embedding)
