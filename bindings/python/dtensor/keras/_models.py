"""tf.keras.Model and Sequential: compile, fit, evaluate, predict, summary and saving (.keras
files), load_model, and utils.Progbar."""

import json as _json
import os as _os
import tempfile as _tempfile
import time as _time
import types as _types
import zipfile as _zipfile

import numpy as np

from .. import Adam, AdamW, DTensor, GradientTape, Layout, RMSprop, SGD, client_id, _replicas
from .. import data as _data
from .._runtime import _allgather_json
from .._utilities import _nest_flatten
from ._base import _d, _deserialize, _serialize, _train, errors
from ._losses import (BinaryCrossentropy, CategoricalCrossentropy, MeanAbsoluteError,
                      MeanSquaredError, SparseCategoricalCrossentropy, _get_loss)
from ._metrics import (Accuracy, BinaryAccuracy, CategoricalAccuracy, Mean, MeanAbsoluteErrorMetric,
                       MeanSquaredErrorMetric, SparseCategoricalAccuracy, Sum, _get_metric)
from ._layers import (Activation, AveragePooling2D, Conv2D, Dense, Embedding, Flatten, InputLayer,
                      KerasTensor, L1, L1L2, L2, Layer, LayerNormalization, MaxPooling2D, Reshape,
                      StringLookup, _evaluate, _is_symbolic, _map_nested, _node_layers,
                      _symbolic_call)
from ._callbacks import History, _Progress, _get_optimizer

# ---- models ---------------------------------------------------------------------------------


class Model(Layer):
    """Subclass with ``call(x)`` (layers as attributes) or use Sequential; then ``compile``
    and ``fit``. Variables are found in the model's layer attributes."""

    def __init__(self, inputs=None, outputs=None, name=None):
        """``Model(inputs, outputs)``: the functional API's model of KerasTensors (inputs a
        KerasTensor, a list or a dict of them; outputs likewise); ``Model()`` in a subclass
        with ``call``."""
        if isinstance(inputs, str) and outputs is None and name is None:
            inputs, name = None, inputs  # Model("name"), as before
        super().__init__(name)
        self.optimizer = self.loss = None
        self.compiled_metrics = []
        self.stop_training = False
        self._graph = None
        if inputs is not None or outputs is not None:
            if not _is_symbolic(inputs) or not _is_symbolic(outputs):
                raise TypeError("Model(inputs, outputs): both must be KerasTensors (from "
                                "keras.Input and the layers called on them)")
            self._graph = (inputs, outputs)
            self._functional_layers = _node_layers(outputs)
            self.built = True

    def build(self, input_shape):
        pass

    def _layers(self):
        if self._graph is not None:
            return list(self._functional_layers)
        return [v for v in vars(self).values() if isinstance(v, Layer) and v is not self]

    def __call__(self, x, training=None, mask=None, **kwargs):
        if self._graph is None:
            return Layer.__call__(self, x, training=training, mask=mask, **kwargs)
        if _is_symbolic(x):
            def call(v):
                return self(v, training=training)
            call._layer = self
            return _symbolic_call(call, (x,), {})
        inputs, outputs = self._graph
        feed = {}

        def bind(kt, value):
            feed[id(kt)] = value
        flat = _nest_flatten(inputs)
        if len(flat) == 1 and not isinstance(x, (dict, list, tuple)):
            bind(flat[0], x)  # one input: the value itself, in whatever structure it was named
        elif isinstance(inputs, dict):
            if not isinstance(x, dict):
                raise TypeError(f"{self.name}: the model takes a dict with keys "
                                f"{sorted(inputs)}, got {type(x).__name__}")
            missing = sorted(set(inputs) - set(x))
            if missing:
                raise ValueError(f"{self.name}: the inputs {missing} are missing")
            for k, kt in inputs.items():
                bind(kt, x[k])
        elif isinstance(inputs, (list, tuple)):
            if not isinstance(x, (list, tuple)) or len(x) != len(inputs):
                raise ValueError(f"{self.name}: the model takes {len(inputs)} inputs")
            for kt, v in zip(inputs, x):
                bind(kt, v)
        else:
            bind(inputs, x)
        memo = {}
        return _map_nested(lambda kt: _evaluate(kt, feed, memo), outputs)

    @property
    def layers(self):
        return self._layers()

    @property
    def variables(self):
        out = list(self._variables)
        for layer in self._layers():
            out.extend(layer.variables)
        return out

    @property
    def trainable_variables(self):
        return [v for v in self.variables if v.trainable]

    @property
    def losses(self):
        """The regularization losses of every layer's weights (see Layer.losses)."""
        out = list(Layer.losses.fget(self))
        for layer in self._layers():
            out.extend(layer.losses)
        return out

    def _total_loss(self, y, pred):
        """The compiled loss plus the regularization losses, as Keras's compiled loss."""
        loss = self.loss(y, pred)
        mesh = loss.layout.mesh
        reg = [r if r.layout.mesh is mesh else  # central storage: from the variables' device
               _d().copy_to_mesh(r, Layout.replicated(mesh, r.ndim)) for r in self.losses]
        return loss + _d().add_n(reg) if reg else loss

    def compile(self, optimizer="sgd", loss=None, metrics=None, loss_weights=None,
                weighted_metrics=None, run_eagerly=False, steps_per_execution=1,
                jit_compile="auto"):
        """Keras's compile. ``steps_per_execution``, ``run_eagerly`` and ``jit_compile`` are
        how Keras groups steps into compiled calls: here each step runs as it is, with the same
        results."""
        if loss_weights is not None or weighted_metrics is not None:
            raise errors().UnimplementedError("compile: loss_weights and weighted_metrics "
                                              "(one output models only)")
        self._compile_config = {"optimizer": optimizer, "loss": loss, "metrics": metrics}
        self.optimizer = _get_optimizer(optimizer)
        self.loss = _get_loss(loss) if loss is not None else None
        self.compiled_metrics = [_get_metric(m, self.loss) for m in (metrics or [])]
        for m in self.compiled_metrics:
            m._local = self._strategy._client_local

    # ---- steps (override to customise, as in Keras) ----

    def train_step(self, data):
        x, y = data
        with GradientTape() as tape:
            pred = self(x, training=True)
            loss = self._total_loss(y, pred)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        for m in self.compiled_metrics:
            m.update_state(y, pred)
        return loss

    def test_step(self, data):
        x, y = data
        pred = self(x)
        loss = self._total_loss(y, pred)
        for m in self.compiled_metrics:
            m.update_state(y, pred)
        return loss

    # ---- loops ----

    def _batches(self, x, y, batch_size, shuffle, seed=0):
        if isinstance(x, _data.Dataset) or (y is None and not isinstance(x, np.ndarray)):
            return x
        if batch_size is None:
            batch_size = 32
        ds = _data.Dataset.from_tensor_slices((x, y) if y is not None else x)
        if shuffle:
            ds = ds.shuffle(len(ds), seed=seed)
        return ds.batch(batch_size)

    def _distribute(self, batch):
        s = self._strategy
        return tuple(s.distribute_batch(np.asarray(b)) for b in batch) \
            if isinstance(batch, (tuple, list)) else s.distribute_batch(np.asarray(batch))

    def _loss_metric(self):
        m = Mean("loss")
        m._local = self._strategy._client_local
        return m

    def _require_compiled(self, what):
        if self.optimizer is None or self.loss is None:
            raise _d().errors.FailedPreconditionError(
                f"{what}: call compile(optimizer, loss) first")

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose=1, callbacks=None,
            shuffle=True, steps_per_epoch=None, initial_epoch=0, validation_data=None,
            seed=0):
        """Train for ``epochs`` epochs of ``steps_per_epoch`` batches (all of them by
        default; a dataset that runs out is restarted). Returns a History. Collective."""
        self._require_compiled("fit")
        if _replicas.current() is not None:
            raise _d().errors.FailedPreconditionError(
                "fit: call it in cross-replica context, not inside strategy.run")
        data = self._batches(x, y, batch_size, shuffle, seed)
        history = History()
        cbs = list(callbacks or []) + [history]  # History last: it sees what the others log
        steps = steps_per_epoch
        if steps is None:
            steps = len(data)
        if verbose:
            cbs.append(_Progress(epochs, steps))
        self._initial_epoch = initial_epoch
        for cb in cbs:
            cb.set_model(self)
            cb.on_train_begin()
        it = iter(data)
        self.stop_training = False
        for epoch in range(self._initial_epoch, epochs):  # BackupAndRestore may move it on
            loss_metric = self._loss_metric()
            for m in self.compiled_metrics:
                m.reset_state()
            for cb in cbs:
                cb.on_epoch_begin(epoch)
            if steps_per_epoch is None:
                it = iter(data)
            for step in range(steps):
                try:
                    batch = next(it)
                except StopIteration:
                    it = iter(data)
                    batch = next(it)
                for cb in cbs:
                    cb.on_train_batch_begin(step)
                dist = self._distribute(batch)
                loss = self.train_step(dist)
                n = _d().gather(loss).item() if isinstance(loss, DTensor) else float(loss)
                rows = np.asarray(batch[0] if isinstance(batch, (tuple, list)) else batch)
                if loss_metric._local or client_id() == 0:  # the same on every client
                    loss_metric._add(n * len(rows), len(rows))
                for cb in cbs:
                    cb.on_train_batch_end(step, {"loss": n})
            logs = {"loss": loss_metric._value()}
            logs.update({m.name: m._value() for m in self.compiled_metrics})
            if validation_data is not None:
                val = self.evaluate(*validation_data, verbose=0, return_dict=True)
                logs.update({f"val_{k}": v for k, v in val.items()})
            for cb in cbs:
                cb.on_epoch_end(epoch, logs)
            if self.stop_training:
                break
        for cb in cbs:
            cb.on_train_end()
        self.history = history
        return history

    def evaluate(self, x=None, y=None, batch_size=None, verbose=1, return_dict=False,
                 steps=None):
        """The loss (weighted by batch size) and metrics over the data. Collective."""
        self._require_compiled("evaluate")
        data = self._batches(x, y, batch_size, shuffle=False)
        loss_metric = self._loss_metric()
        for m in self.compiled_metrics:
            m.reset_state()
        for k, batch in enumerate(data):
            if steps is not None and k >= steps:
                break
            loss = self.test_step(self._distribute(batch))
            n = _d().gather(loss).item() if isinstance(loss, DTensor) else float(loss)
            rows = len(np.asarray(batch[0] if isinstance(batch, (tuple, list)) else batch))
            if loss_metric._local or client_id() == 0:
                loss_metric._add(n * rows, rows)
        logs = {"loss": loss_metric._value()}
        logs.update({m.name: m._value() for m in self.compiled_metrics})
        if verbose and client_id() == 0:
            print(" - ".join(f"{k}: {v:.4f}" for k, v in logs.items()), flush=True)
        if return_dict:
            return logs
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

    def predict(self, x, batch_size=None, verbose=0):
        """The model's outputs for x (numpy, gathered: the caller asked for them). Collective."""
        data = x if isinstance(x, _data.Dataset) else \
            _data.Dataset.from_tensor_slices(np.asarray(x)).batch(batch_size or 32)
        out = []
        for batch in data:
            b = batch[0] if isinstance(batch, (tuple, list)) else batch
            out.append(_d().gather(self(self._strategy.distribute_batch(np.asarray(b)))))
        return np.concatenate(out) if out else np.zeros((0,))

    def summary(self, print_fn=None):
        """Layers, output shapes and parameter counts (client 0 prints)."""
        print_fn = print_fn or (lambda s: print(s) if client_id() == 0 else None)
        rows = [(f"{layer.name} ({type(layer).__name__})", layer.count_params())
                for layer in self._layers_in_order()]
        width = max([len(r[0]) for r in rows] + [20])
        print_fn(f'Model: "{self.name}"')
        print_fn(f"{'Layer (type)':<{width}}  {'Param #':>10}")
        for name, n in rows:
            print_fn(f"{name:<{width}}  {n:>10}")
        total = sum(int(np.prod(v.shape)) for v in self.variables)
        trainable = sum(int(np.prod(v.shape)) for v in self.trainable_variables)
        print_fn(f"Total params: {total}")
        print_fn(f"Trainable params: {trainable}")
        print_fn(f"Non-trainable params: {total - trainable}")

    def _layers_in_order(self):
        return self._layers()

    def get_weights(self):
        """Every variable's value as a numpy array (gathered: collective)."""
        return [_d().gather(v.read_value()) for v in self.variables]

    def set_weights(self, weights):
        vs = self.variables
        if len(weights) != len(vs):
            raise ValueError(f"set_weights: {len(weights)} arrays for {len(vs)} variables")
        for v, w in zip(vs, weights):
            w = np.asarray(w)
            if tuple(w.shape) != tuple(v.shape):
                raise ValueError(f"set_weights: {v.name} has shape {v.shape}, got {w.shape}")
        for v, w in zip(vs, weights):
            v.assign(np.asarray(w, dtype=v.dtype))

    def save_weights(self, filepath, overwrite=True, save_format=None):
        """Every variable written to ``filepath`` as a dtensor checkpoint: one HDF5 file, as
        Keras's ``.h5`` weights, that h5py reads (``variables/model/layer_with_weights-0/
        kernel`` ...). Nothing is gathered: each client writes the blocks of its own devices.
        Collective."""
        if not isinstance(filepath, (str, _os.PathLike)):
            raise TypeError(f"save_weights: expected a path, got {type(filepath).__name__}")
        if not overwrite and _os.path.exists(filepath):
            raise _d().errors.AlreadyExistsError(
                f"save_weights: {filepath} exists (overwrite=False)")
        _train().Checkpoint(model=self).write(filepath)

    def load_weights(self, filepath):
        """Weights written by save_weights, read into the variables' layouts (any mesh or
        client count); a variable of another shape or dtype raises naming it. Files of the
        earlier .npz form are still read. Collective."""
        if not isinstance(filepath, (str, _os.PathLike)):
            raise TypeError(f"load_weights: expected a path, got {type(filepath).__name__}")
        if not _os.path.isfile(filepath):
            raise _d().errors.NotFoundError(f"load_weights: no weights file {filepath!r}")
        with open(filepath, "rb") as f:
            legacy = f.read(2) == b"PK"
        if not legacy:
            _train().Checkpoint(model=self).read(filepath)
            return
        with np.load(filepath) as z:
            names = sorted(z.files, key=lambda k: int(k.split(":", 1)[0]))
            ours = [f"{i}:{v.name}" for i, v in enumerate(self.variables)]
            if names != ours:
                raise ValueError(f"load_weights: {filepath} holds {names}, the model {ours}")
            self.set_weights([z[k] for k in names])


class Sequential(Model):
    """Layers applied in order; built on the first call (or from the first layer's
    ``input_shape``)."""

    def __init__(self, layers=None, name=None):
        super().__init__(name)
        self._stack = []
        self._input_layer = None  # a keras.Input given first
        self._shape = None  # the output shape so far, once the input shape is known
        for layer in layers or []:
            self.add(layer)

    def add(self, layer):
        if isinstance(layer, KerasTensor) and getattr(layer, "_input_layer", None) is not None:
            layer = layer._input_layer  # keras.Input(...) first
        if not isinstance(layer, Layer):
            raise TypeError(f"Sequential.add: {layer!r} is not a layer")
        if isinstance(layer, InputLayer):  # keras.Input: the input shape, not a layer
            if self._stack:
                raise ValueError("Sequential.add: an Input must come first")
            self._shape = (None,) + tuple(layer.input_shape)
            self._input_layer = layer
            return
        self._stack.append(layer)
        if len(self._stack) == 1 and getattr(layer, "input_shape", None) is not None:
            self._shape = (None,) + tuple(layer.input_shape)
        if self._shape is not None:  # the input shape is known: build as layers come
            if not layer.built:
                layer.build(self._shape)
                layer.built = True
            self._shape = layer.output_shape(self._shape)
            self.built = True

    def _layers(self):
        return list(self._stack)

    def _layers_in_order(self):
        return list(self._stack)

    def call(self, x):
        for layer in self._stack:
            x = layer(x)
        return x

    def build(self, input_shape):
        """Build every layer from the input shape (a restore waiting for the variables then
        runs before the first computation, as TensorFlow's delayed restoration)."""
        shape = tuple(input_shape)
        for layer in self._stack:
            if not layer.built:
                layer.build(shape)
                layer.built = True
            shape = layer.output_shape(shape)

    def get_config(self):
        shape = None if self._input_layer is None else list(self._input_layer.input_shape)
        if shape is None and self._stack and getattr(self._stack[0], "input_shape", None):
            shape = list(self._stack[0].input_shape)
        if shape is None and self._stack and self._stack[0].built:
            shape = list(self._built_shape[1:]) if hasattr(self, "_built_shape") else None
        return {"name": self.name, "input_shape": shape,
                "layers": [{"class_name": type(layer).__name__, "config": layer.get_config()}
                           for layer in self._stack]}

    @classmethod
    def from_config(cls, config):
        layers_ = [_deserialize(layer) for layer in config["layers"]]
        model = cls(name=config.get("name"))
        if config.get("input_shape") is not None:
            model.add(InputLayer(config["input_shape"]))
        for layer in layers_:
            model.add(layer)
        return model


# ---- saving whole models (Keras's .keras files) ---------------------------------------------


def _save_model(model, filepath, overwrite=True):
    """model.save: a zip holding config.json (the architecture, and how it was compiled) and
    model.weights.h5 (a dtensor checkpoint of the weights, written without gathering), as
    Keras's .keras format is laid out. Collective."""
    filepath = _os.fspath(filepath)
    if not filepath.endswith(".keras"):
        raise ValueError(f"save: {filepath!r}: a model is saved to a .keras file "
                         f"(save_weights writes the weights alone)")
    if not overwrite and _os.path.exists(filepath):
        raise errors().AlreadyExistsError(f"save: {filepath} exists (overwrite=False)")
    config = {"class_name": type(model).__name__, "config": model.get_config()}
    compiled = getattr(model, "_compile_config", None)
    if compiled is not None:
        config["compile_config"] = {k: _serialize(v, f"save: compile's {k}")
                                    for k, v in compiled.items()}
    weights = filepath + ".weights.h5"
    model.save_weights(weights)
    error = None
    if client_id() == 0:
        try:
            with _zipfile.ZipFile(filepath, "w") as z:
                z.writestr("config.json", _json.dumps(config))
                z.writestr("metadata.json", _json.dumps({"keras_version": "dtensor",
                                                         "date_saved": _time.ctime()}))
                z.write(weights, "model.weights.h5")
        except OSError as e:
            error = f"save: cannot write {filepath}: {e}"
        _os.unlink(weights)
    for e in _allgather_json(error):
        if e:
            raise errors().UnknownError(e)


def load_model(filepath, custom_objects=None, compile=True):  # noqa: A002 (Keras's name)
    """keras.models.load_model of a file Model.save wrote: the model rebuilt in the strategy
    in scope (its variables in that strategy's layout), its weights read back, compiled again
    as it was when ``compile``. Collective."""
    filepath = _os.fspath(filepath)
    if not _os.path.isfile(filepath):
        raise errors().NotFoundError(f"load_model: no file {filepath!r}")
    with _zipfile.ZipFile(filepath) as z:
        config = _json.loads(z.read("config.json"))
        data = z.read("model.weights.h5")
    for name, cls in (custom_objects or {}).items():
        _SAVEABLE[name] = cls
    model = _deserialize(config)
    with _tempfile.NamedTemporaryFile(suffix=".h5", delete=False) as f:
        f.write(data)
    try:
        if not model.built:
            shape = config["config"].get("input_shape")
            if shape is None:
                raise ValueError(f"load_model: {filepath} does not say the model's input shape")
            model(np.zeros([1] + list(shape), np.float32))
        model.load_weights(f.name)
    finally:
        _os.unlink(f.name)
    cc = config.get("compile_config")
    if compile and cc is not None:
        model.compile(**{k: _deserialize(v) for k, v in cc.items()})
    return model


Model.save = _save_model


class Progbar:
    """keras.utils.Progbar: ``update(current, values)`` tracks the step and (name, value)
    pairs, averaged over the steps unless named in ``stateful_metrics``; the line is printed
    when the target is reached or ``finalize`` (client 0 prints)."""

    def __init__(self, target, width=30, verbose=1, interval=0.05, stateful_metrics=None,
                 unit_name="step"):
        self.target, self.width, self.verbose = target, width, verbose
        self.stateful = set(stateful_metrics or [])
        self.unit_name = unit_name
        self._values, self._seen, self._start = {}, 0, _time.perf_counter()

    def update(self, current, values=None, finalize=None):
        for name, v in values or []:
            v = float(v)
            if name in self.stateful:
                self._values[name] = [v, 1]
            else:
                steps = max(current - self._seen, 1)
                total = self._values.setdefault(name, [0.0, 0])
                total[0] += v * steps
                total[1] += steps
        self._seen = current
        if finalize is None:
            finalize = self.target is not None and current >= self.target
        if finalize and self.verbose and client_id() == 0:
            parts = [f"{k}: {t / max(n, 1):.4f}" for k, (t, n) in self._values.items()]
            took = _time.perf_counter() - self._start
            print(f"{current}/{self.target} - {took:.0f}s - " + " - ".join(parts), flush=True)

    def add(self, n, values=None):
        self.update(self._seen + n, values)


utils = _types.SimpleNamespace(Progbar=Progbar)
models = _types.SimpleNamespace(Sequential=Sequential, Model=Model, load_model=load_model)


# the classes a saved model's config names
_SAVEABLE = {c.__name__: c for c in (
    Sequential, Dense, Activation, Flatten, LayerNormalization, Conv2D, MaxPooling2D,
    AveragePooling2D, Reshape, InputLayer, StringLookup, Embedding, L1L2, L1, L2, SGD, Adam,
    AdamW, RMSprop,
    MeanSquaredError, MeanAbsoluteError, CategoricalCrossentropy, SparseCategoricalCrossentropy,
    BinaryCrossentropy, Mean, Sum, SparseCategoricalAccuracy, CategoricalAccuracy,
    BinaryAccuracy, Accuracy, MeanSquaredErrorMetric, MeanAbsoluteErrorMetric)}
