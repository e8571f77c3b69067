"""tf.train's checkpoints over the C checkpoint (``dt_checkpoint_*``): ``Checkpoint``,
``CheckpointManager``, ``latest_checkpoint``.

A checkpoint is one HDF5 file (h5py reads it) holding every tracked variable at its global
shape, written without gathering: each client writes only its own devices' blocks, and a
restore reads each device's block in the variable's current layout, so a checkpoint saved on
one mesh or client count restores into any other. Writes go to ``PATH.tmp``, renamed when
every client is done, so a job killed while saving leaves the previous checkpoint whole::

    ckpt = dtensor.train.Checkpoint(model=model, optimizer=optimizer, step=step, rng=rng)
    manager = dtensor.train.CheckpointManager(ckpt, "run/ckpts", max_to_keep=3)
    ckpt.restore(manager.latest_checkpoint)   # None on the first run: nothing happens
    ...
    manager.save()                            # run/ckpts/ckpt-1.h5, -2, ...

Tracked objects (keyword arguments, nested in dicts): DVariables, ``dtensor.keras`` models and
layers (variables named by structure: ``model/layer_with_weights-0/kernel``), ``dtensor.
Sequential`` (the C model), optimizers (their iterations and slots, for the checkpoint's
variables), ``dtensor.random.Generator`` (seed and counter). Every call is collective.
"""
import os as _os
import re as _re
import shutil as _shutil

from . import (ClusterSpec, DTensorError, DVariable, Layout, Module, Optimizer, PSVariable,
               Sequential, barrier, client_id, errors, num_clients)
from . import _dtensor as _c
from . import random as _random
from ._ops import _result
from ._runtime import _allgather_json

__all__ = ["Checkpoint", "CheckpointManager", "latest_checkpoint", "list_variables",
           "load_variable", "ClusterSpec"]

_CKPT = _re.compile(r"^ckpt-(\d+)\.h5$")


def _path_arg(path, what):
    """A file system path (str or os.PathLike); TypeError otherwise."""
    if not isinstance(path, (str, _os.PathLike)):
        raise TypeError(f"{what}: expected a path, got {type(path).__name__}")
    return path


def latest_checkpoint(checkpoint_dir):
    """The newest ``ckpt-N.h5`` in the directory (highest N), or None (tf.train.
    latest_checkpoint). Not collective."""
    _path_arg(checkpoint_dir, "latest_checkpoint")
    if not _os.path.isdir(checkpoint_dir):
        return None
    return _c.checkpoint_latest(str(checkpoint_dir))


def list_variables(ckpt_path):
    """[(name, shape)] of every tensor in a checkpoint file, names as in the file
    ("variables/model/layer_with_weights-0/kernel"). Not collective."""
    import h5py  # noqa: PLC0415 (optional: the library itself does not need h5py)

    if not _os.path.isfile(_path_arg(ckpt_path, "list_variables")):
        raise errors.NotFoundError(f"list_variables: no checkpoint file {ckpt_path!r}")
    out = []
    with h5py.File(ckpt_path, "r") as f:
        f.visititems(lambda name, obj: out.append((name, tuple(obj.shape)))
                     if isinstance(obj, h5py.Dataset) else None)
    return out


def load_variable(ckpt_path, name, layout):
    """The tensor stored at ``name`` ("variables/w") read in ``layout`` (any mesh): each
    client reads only its devices' blocks. Collective."""
    return _result(_c.checkpoint_read_tensor(str(ckpt_path), name, layout.mesh._handle,
                                             layout._text), layout.mesh)


class _LoadStatus:
    """What restore returns (tf.train's load status): the restore is complete when it
    returns, so the assertions have nothing left to check."""

    def assert_consumed(self):
        return self

    def assert_existing_objects_matched(self):
        return self

    def expect_partial(self):
        return self

    def run_restore_ops(self, session=None):
        return None


def _keras():
    from . import keras  # noqa: PLC0415 (keras imports this module's package first)

    return keras


class Checkpoint:
    """tf.train.Checkpoint: ``Checkpoint(model=..., optimizer=..., step=..., rng=...)``."""

    def __init__(self, root=None, **kwargs):
        self._objects = dict(kwargs)
        if root is not None:
            self._objects["root"] = root
        for name in self._objects:
            _check_name(name)
        self.save_counter = 0
        self.metadata = {}

    # ---- what is saved ----

    def _entries(self):
        entries, optimizers = [], []
        for name, obj in self._objects.items():
            _collect(name, obj, entries, optimizers)
        return entries + optimizers

    def _io(self, write, path):
        md = {str(k): str(v) for k, v in self.metadata.items()}
        path = _os.fspath(_path_arg(path, "Checkpoint.write" if write else "Checkpoint.read"))
        counter, md = _c.checkpoint_io(write, path, self._entries(), md,
                                       int(self.save_counter))
        return counter, md

    # ---- tf.train.Checkpoint's methods ----

    def write(self, file_prefix):
        """Write every tracked object to ``file_prefix`` (the path, as given; its directory is
        made when missing). Returns it. Clients that name different files (each worker its own,
        as TensorFlow's multi-worker programs do) each get the whole checkpoint: it is written
        once, to client 0's file, and copied to the others'."""
        path = _os.fspath(_path_arg(file_prefix, "Checkpoint.write"))
        parent = _os.path.dirname(path)
        if parent:
            _os.makedirs(parent, exist_ok=True)
        paths = _allgather_json(path) if num_clients() > 1 else [path]
        self._io(True, paths[0])
        if len(set(paths)) > 1:
            barrier()  # client 0's file is complete everywhere
            error = None
            if path != paths[0]:
                try:
                    _shutil.copyfile(paths[0], path)
                except OSError as e:
                    error = f"Checkpoint.write: cannot copy {paths[0]} to {path}: {e}"
            for e in _allgather_json(error):
                if e:
                    raise DTensorError(e)
        return str(file_prefix)

    def save(self, file_prefix):
        """Increment ``save_counter`` and write ``f"{file_prefix}-{save_counter}.h5"``;
        returns that path."""
        _path_arg(file_prefix, "Checkpoint.save")
        self.save_counter += 1
        path = f"{file_prefix}-{self.save_counter}.h5"
        try:
            self.write(path)
        except BaseException:
            self.save_counter -= 1
            raise
        return path

    def read(self, save_path):
        """Restore every tracked object from ``save_path``. Raises DTensorError naming the
        first missing, mismatched (shape, dtype) object, or the file's problem; on error
        nothing changes. A Keras model not built yet is restored when it is (its first call),
        as TensorFlow's delayed restoration: the whole checkpoint is read again then."""
        unbuilt = [m for m in _models(self._objects) if not m.built and not m.variables]
        if unbuilt:
            for m in unbuilt:
                m._deferred = list(getattr(m, "_deferred", [])) + [(self, save_path)]
            return _LoadStatus()
        counter, md = self._io(False, save_path)
        self.save_counter = counter
        self.metadata = md
        for obj in _optimizers(self._objects):
            obj.iterations = _c.optimizer_iterations(obj._handle)
        for v in _variables(self._objects):
            v._version += 1
        return _LoadStatus()

    def restore(self, save_path):
        """read(save_path); ``None`` (no checkpoint yet) restores nothing."""
        if save_path is None:
            return _LoadStatus()
        return self.read(save_path)


def _check_name(name):
    if not _re.fullmatch(r"[A-Za-z0-9_.:-]+(/[A-Za-z0-9_.:-]+)*", str(name)):
        raise ValueError(f"Checkpoint: name {name!r}: names are made of [A-Za-z0-9_.:-] "
                         f"separated by '/'")


def _short(variable):
    return variable.name.rsplit("/", 1)[-1]


def _collect(name, obj, entries, optimizers):
    keras = _keras()
    if isinstance(obj, PSVariable):
        raise DTensorError(f"Checkpoint: {name!r} is a parameter-server variable (MPI windows "
                           f"on the ps tasks); checkpoints of those are not supported yet")
    if isinstance(obj, DVariable):
        entries.append(("variable", name, obj._handle))
    elif isinstance(obj, Sequential):
        entries.append(("model", name, obj._handle))
    elif isinstance(obj, keras.Model):
        if not obj.built and not obj.variables:
            raise ValueError(f"Checkpoint: keras model {name!r} has no variables yet: build "
                             f"it (call it once, or give the first layer input_shape=) first")
        for v in obj._variables:
            entries.append(("variable", f"{name}/{_short(v)}", v._handle))
        k = 0
        for layer in obj._layers_in_order():
            if layer.variables:
                _collect(f"{name}/layer_with_weights-{k}", layer, entries, optimizers)
                k += 1
    elif isinstance(obj, keras.Layer):
        for v in obj.variables:
            entries.append(("variable", f"{name}/{_short(v)}", v._handle))
    elif isinstance(obj, Module):  # a tf.Module: its attributes, by name
        for key, value in sorted(vars(obj).items()):
            if not key.startswith("_") and _tracked(value):
                _collect(f"{name}/{key}", value, entries, optimizers)
    elif isinstance(obj, Optimizer):
        optimizers.append(("optimizer", name, obj._handle))
    elif isinstance(obj, _random.Generator):
        entries.append(("generator", name, obj._handle))
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _check_name(key)
            _collect(f"{name}/{key}", value, entries, optimizers)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _collect(f"{name}/{i}", value, entries, optimizers)
    else:
        raise TypeError(f"Checkpoint: {name!r} is a {type(obj).__name__}; tracked objects are "
                        f"DVariables, models, layers, optimizers, random.Generators, and "
                        f"dicts or lists of them")


def _tracked(value):
    """Whether a module attribute holds something a checkpoint saves."""
    keras = _keras()
    if isinstance(value, (list, tuple)):
        return any(_tracked(v) for v in value)
    if isinstance(value, dict):
        return any(_tracked(v) for v in value.values())
    return isinstance(value, (DVariable, Module, keras.Layer, Optimizer, _random.Generator))


def _walk(objects):
    keras = _keras()
    for obj in objects.values() if isinstance(objects, dict) else objects:
        if isinstance(obj, (dict, list, tuple)):
            yield from _walk(obj)
        elif isinstance(obj, (keras.Layer, Module)):
            yield from obj.variables
        else:
            yield obj


def _models(objects):
    keras = _keras()
    out = []
    for obj in objects.values() if isinstance(objects, dict) else objects:
        if isinstance(obj, (dict, list, tuple)):
            out.extend(_models(obj))
        elif isinstance(obj, keras.Model):
            out.append(obj)
    return out


def _optimizers(objects):
    return [o for o in _walk(objects) if isinstance(o, Optimizer)]


def _variables(objects):
    return [o for o in _walk(objects) if isinstance(o, DVariable)]


class CheckpointManager:
    """tf.train.CheckpointManager: ``save()`` writes ``directory/ckpt-N.h5`` and deletes the
    oldest beyond ``max_to_keep`` (None keeps all). Checkpoints already in the directory are
    adopted, so a restarted job finds ``latest_checkpoint`` and numbers on. Collective."""

    def __init__(self, checkpoint, directory, max_to_keep, checkpoint_name="ckpt"):
        if checkpoint_name != "ckpt":
            raise ValueError("CheckpointManager: checkpoint_name must be 'ckpt' (files are "
                             "ckpt-N.h5)")
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"CheckpointManager: checkpoint must be a Checkpoint, got "
                            f"{type(checkpoint).__name__}")
        self._checkpoint = checkpoint
        self.directory = _os.fspath(_path_arg(directory, "CheckpointManager"))
        self.max_to_keep = max_to_keep
        error = None
        if client_id() == 0:
            try:
                _os.makedirs(self.directory, exist_ok=True)
            except OSError as e:
                error = f"CheckpointManager: cannot create {self.directory}: {e}"
        found = self._scan() if error is None and client_id() == 0 else []
        agreed = _allgather_json({"error": error, "found": found, "dir": self.directory})
        for a in agreed:
            if a["error"]:
                raise DTensorError(a["error"])
        self._numbers = agreed[0]["found"]
        # each client its own directory (as a multi-worker program's workers): each keeps its
        # own copies, and deletes its own old ones
        self._own = len({a["dir"] for a in agreed}) > 1
        if self._own and client_id() != 0:
            _os.makedirs(self.directory, exist_ok=True)

    def _scan(self):
        return sorted(int(m.group(1)) for m in map(_CKPT.match, _os.listdir(self.directory))
                      if m)

    def _path(self, n):
        return _os.path.join(self.directory, f"ckpt-{n}.h5")

    @property
    def checkpoints(self):
        """Kept checkpoints, oldest first."""
        return [self._path(n) for n in self._numbers]

    @property
    def latest_checkpoint(self):
        return self._path(self._numbers[-1]) if self._numbers else None

    def save(self, checkpoint_number=None):
        """Write the next checkpoint (``checkpoint_number``: that number, e.g. the step);
        returns its path."""
        ck = self._checkpoint
        n = int(checkpoint_number) if checkpoint_number is not None else \
            (self._numbers[-1] + 1 if self._numbers else 1)
        path = self._path(n)
        ck.save_counter += 1
        try:
            ck.write(path)
        except BaseException:
            ck.save_counter -= 1
            raise
        if n not in self._numbers:
            self._numbers = sorted(self._numbers + [n])
        error = None
        while self.max_to_keep is not None and self.max_to_keep > 0 and \
                len(self._numbers) > self.max_to_keep:
            victim = self._numbers[1] if self._numbers[0] == n else self._numbers[0]
            if client_id() == 0 or self._own:
                try:
                    _os.unlink(self._path(victim))
                except FileNotFoundError:
                    pass
                except OSError as e:
                    error = f"CheckpointManager: saved {path} but cannot delete: {e}"
            self._numbers.remove(victim)
        for a in _allgather_json(error):
            if a:
                raise DTensorError(a)
        barrier()
        return path
