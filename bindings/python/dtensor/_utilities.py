"""What TensorFlow programs use around the ops: tf.Module, tf.nest, tf.io.gfile, tf.dtypes and
tf.random's global generator."""

import contextlib as _contextlib
import re as _re
import types as _types

import numpy as np

from . import errors
from ._dtypes import bfloat16, bool_, float16, float32, float64, int32, int64, int8, uint8
from ._ops import Generator, _Random
from ._variables import DVariable

# ---- tf.Module, tf.nest, tf.io.gfile, tf.dtypes: what TensorFlow programs use around the ops ----


class Module:
    """tf.Module: a container whose variables are found in its attributes (nested modules,
    lists, tuples and dicts of them), each once, in attribute order."""

    def __init__(self, name=None):
        self._name = name or _re.sub(r"(?<!^)(?=[A-Z])", "_", type(self).__name__).lower()

    @property
    def name(self):
        return self._name

    def _walk(self, seen):
        for key, value in sorted(vars(self).items()):
            if key.startswith("_"):
                continue
            yield from _module_items(value, seen)

    @property
    def variables(self):
        return tuple(v for v in self._walk(set()) if isinstance(v, DVariable))

    @property
    def trainable_variables(self):
        return tuple(v for v in self.variables if v.trainable)

    @property
    def submodules(self):
        seen, out = set(), []

        def visit(m):
            for key, value in sorted(vars(m).items()):
                for x in _flat_values(value):
                    if isinstance(x, Module) and id(x) not in seen:
                        seen.add(id(x))
                        out.append(x)
                        visit(x)
        visit(self)
        return tuple(out)

    @_contextlib.contextmanager
    def name_scope(self):
        yield self._name


def _flat_values(value):
    if isinstance(value, (list, tuple)):
        return [y for v in value for y in _flat_values(v)]
    if isinstance(value, dict):
        return [y for k in sorted(value, key=str) for y in _flat_values(value[k])]
    return [value]


def _module_items(value, seen):
    """The variables under an attribute value (modules walked), each once."""
    for x in _flat_values(value):
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, DVariable):
            yield x
        elif isinstance(x, Module):
            yield from x._walk(seen)
        elif hasattr(x, "variables") and hasattr(x, "trainable_variables") and \
                not isinstance(x, type):  # a Keras layer or model inside a module
            yield from (v for v in x.variables if id(v) not in seen and not seen.add(id(v)))


def _nest_flatten(structure):
    """tf.nest.flatten: the leaves, dicts by sorted key."""
    if isinstance(structure, (list, tuple)):
        return [y for v in structure for y in _nest_flatten(v)]
    if isinstance(structure, dict):
        return [y for k in sorted(structure) for y in _nest_flatten(structure[k])]
    return [structure]


def _nest_map_structure(func, *structures):
    """tf.nest.map_structure: func on the leaves of structures of one shape."""
    first = structures[0]
    if isinstance(first, (list, tuple)):
        items = [_nest_map_structure(func, *parts) for parts in zip(*structures)]
        return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)
    if isinstance(first, dict):
        return {k: _nest_map_structure(func, *(s[k] for s in structures)) for k in first}
    return func(*structures)


def _nest_pack_sequence_as(structure, flat_sequence):
    flat = list(flat_sequence)
    at = [0]

    def build(x):
        if isinstance(x, (list, tuple)):
            items = [build(v) for v in x]
            return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
        if isinstance(x, dict):
            return {k: build(x[k]) for k in sorted(x)}
        at[0] += 1
        return flat[at[0] - 1]
    return build(structure)


nest = _types.SimpleNamespace(flatten=_nest_flatten, map_structure=_nest_map_structure,
                              pack_sequence_as=_nest_pack_sequence_as)


def _makedirs(path):
    import os  # noqa: PLC0415
    os.makedirs(path, exist_ok=True)


def _rmtree(path):
    import shutil  # noqa: PLC0415
    shutil.rmtree(path)


def _gfile():
    import glob as _glob  # noqa: PLC0415
    import os  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    return _types.SimpleNamespace(
        makedirs=_makedirs, mkdir=os.mkdir, rmtree=_rmtree, exists=os.path.exists,
        isdir=os.path.isdir, listdir=os.listdir, glob=_glob.glob, remove=os.remove,
        rename=lambda src, dst, overwrite=False: os.replace(src, dst) if overwrite or
        not os.path.exists(dst) else (_ for _ in ()).throw(
            errors.AlreadyExistsError(f"rename: {dst} exists")),
        copy=lambda src, dst, overwrite=False: shutil.copyfile(src, dst), GFile=open,
        walk=os.walk)


#: tf.io: the file-system calls TensorFlow programs make (tf.io.gfile), on the local file system
io = _types.SimpleNamespace(gfile=_gfile())

#: tf.string: the dtype of Keras inputs of text (numpy's object arrays of str here)
string = np.dtype(object)
#: tf.dtypes: the dtypes under TensorFlow's module path
dtypes = _types.SimpleNamespace(
    float16=float16, bfloat16=bfloat16, float32=float32, float64=float64, int8=int8,
    uint8=uint8, int32=int32, int64=int64, bool=bool_, string=string,
    as_dtype=lambda d: string if d in ("string", str) else np.dtype(d))

_global_generator = None


def _global_rng():
    global _global_generator
    if _global_generator is None:
        _global_generator = Generator(0)
    return _global_generator


def _set_seed(seed):
    """tf.random.set_seed: the global generator restarts from ``seed``."""
    _global_rng().reset_from_seed(int(seed))


def _random_uniform(shape, minval=0, maxval=None, dtype=np.float32, seed=None, name=None):
    """tf.random.uniform: the next draw of the global generator (the same on every client:
    its stream depends on the seed and the draws made, never on the client)."""
    g = Generator(seed) if seed is not None else _global_rng()
    return g.uniform(shape, minval, maxval, dtype)


def _random_normal(shape, mean=0.0, stddev=1.0, dtype=np.float32, seed=None, name=None):
    g = Generator(seed) if seed is not None else _global_rng()
    return g.normal(shape, mean, stddev, dtype)


_Random.uniform = staticmethod(_random_uniform)
_Random.normal = staticmethod(_random_normal)
_Random.set_seed = staticmethod(_set_seed)
