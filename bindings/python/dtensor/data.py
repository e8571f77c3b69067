"""Input pipelines over numpy arrays, with tf.data.Dataset's names and semantics.

Elements are numpy arrays or (nested) tuples and dicts of them. Values are converted as
TensorFlow converts them: a tuple or a dict is a structure, a list is a tensor; Python floats
become float32, Python ints int32, numpy arrays keep their dtype. A dataset is a recipe: each
iteration starts it anew (so ``shuffle`` reshuffles every epoch, as TensorFlow's does by
default). ``map`` functions may call dtensor ops on the elements (their results come back as
arrays). ``strategy.experimental_distribute_dataset`` splits each batch over the replicas.
"""

import itertools

import numpy as np

__all__ = ["Dataset"]

_DONE = object()  # marks a cache that holds every element


def _map_structure(fn, x):
    """fn on each leaf of a structure: tuples and dicts are structures, anything else (a
    list included, as in tf.data) is a leaf."""
    if isinstance(x, tuple):
        return tuple(_map_structure(fn, v) for v in x)
    if isinstance(x, dict):
        return {k: _map_structure(fn, v) for k, v in x.items()}
    return fn(x)


def _leaves(x):
    if isinstance(x, tuple):
        return [a for v in x for a in _leaves(v)]
    if isinstance(x, dict):
        return [a for k in x for a in _leaves(x[k])]
    return [x]


def _array(x):
    """A leaf as an array, converted as TensorFlow converts it (DTensors read back); text
    (str, bytes and lists of them) becomes a numpy array of str (tf.string's elements)."""
    from ._tensor import _host_array
    try:
        return _host_array(x, what="dataset element")
    except TypeError:
        a = np.asarray(x, dtype=object)
        if a.size and all(isinstance(v, (str, bytes, np.str_, np.bytes_)) for v in a.flat):
            return np.asarray(x).astype(str)
        raise


class Dataset:
    """tf.data.Dataset over numpy values."""

    def __init__(self, make, length=None):
        self._make = make  # () -> iterator over elements
        self._length = length  # number of elements when known
        self._epoch = itertools.count()

    # ---- sources ----

    @staticmethod
    def from_tensor_slices(tensors):
        """The rows of arrays (a tuple or dict of arrays gives tuples or dicts of rows)."""
        values = _map_structure(_array, tensors)
        lengths = {a.shape[0] if a.ndim else None for a in _leaves(values)}
        if len(lengths) != 1 or None in lengths:
            raise ValueError(f"from_tensor_slices: the arrays' leading extents differ or are "
                             f"missing: {sorted(map(str, lengths))}")
        n = lengths.pop()
        return Dataset(lambda: (_map_structure(lambda a: a[i], values) for i in range(n)), n)

    @staticmethod
    def from_tensors(tensors):
        """One element: the value itself."""
        values = _map_structure(_array, tensors)
        return Dataset(lambda: iter([values]), 1)

    @staticmethod
    def range(*args, dtype=np.int64):
        """tf.data.Dataset.range: int64 elements by default, as TensorFlow's."""
        r = range(*args)
        if not -2**63 <= r.start < 2**63 or not -2**63 <= r.stop < 2**63:
            raise ValueError(f"range{args}: the bounds must fit in 64 bits")
        n = max(0, -((r.start - r.stop) // r.step))  # len(r) overflows past 2^63
        return Dataset(lambda: (np.asarray(i, dtype=dtype) for i in r), n)

    # ---- transformations ----

    def batch(self, batch_size, drop_remainder=False):
        """Consecutive elements stacked into batches of ``batch_size`` (the last one shorter
        unless ``drop_remainder``)."""
        batch_size = int(batch_size)
        if batch_size < 1:
            raise ValueError(f"batch: batch_size {batch_size} must be at least 1")

        def make():
            it = self._make()
            while True:
                chunk = list(itertools.islice(it, batch_size))
                if not chunk or (drop_remainder and len(chunk) < batch_size):
                    return
                yield _stack(chunk)
        n = self._length
        if n is not None:
            n = n // batch_size if drop_remainder else -(-n // batch_size)
        return Dataset(make, n)

    def unbatch(self):
        def make():
            for element in self._make():
                n = _leaves(element)[0].shape[0]
                for i in range(n):
                    yield _map_structure(lambda a: a[i], element)
        return Dataset(make)

    def shuffle(self, buffer_size, seed=None, reshuffle_each_iteration=True):
        """Elements drawn at random from a buffer of ``buffer_size`` (TensorFlow's algorithm:
        fill the buffer, emit a random slot, refill it)."""
        buffer_size = int(buffer_size)
        if buffer_size < 1:
            raise ValueError(f"shuffle: buffer_size {buffer_size} must be at least 1")
        base = np.random.SeedSequence(seed).entropy if seed is None else int(seed)

        def make():
            epoch = next(self._epoch) if reshuffle_each_iteration else 0
            rng = np.random.default_rng([base, epoch])
            buf = []
            for element in self._make():
                if len(buf) < buffer_size:
                    buf.append(element)
                    continue
                k = int(rng.integers(len(buf)))
                yield buf[k]
                buf[k] = element
            while buf:
                yield buf.pop(int(rng.integers(len(buf))))
        return Dataset(make, self._length)

    def repeat(self, count=None):
        """The elements ``count`` times (forever when None)."""
        def make():
            times = itertools.count() if count is None or count < 0 else range(int(count))
            for _ in times:
                yield from self._make()
        n = None if count is None or count < 0 or self._length is None \
            else self._length * int(count)
        return Dataset(make, n)

    def take(self, count):
        count = int(count)
        n = count if self._length is None else min(count, self._length)
        if count < 0:
            return self
        return Dataset(lambda: itertools.islice(self._make(), count), n)

    def skip(self, count):
        count = int(count)
        n = None if self._length is None else max(0, self._length - count)
        return Dataset(lambda: itertools.islice(self._make(), count, None), n)

    def map(self, map_func, num_parallel_calls=None, deterministic=None):
        """map_func(element) (a tuple element is passed as positional arguments); dtensor ops
        on the elements run on the default mesh and their results come back as arrays."""
        if not callable(map_func):
            raise TypeError(f"map: map_func must be callable, got {type(map_func).__name__}")

        def call(e):
            out = map_func(*e) if isinstance(e, tuple) else map_func(e)
            return _map_structure(_array, out)
        return Dataset(lambda: (call(e) for e in self._make()), self._length)

    def filter(self, predicate):
        if not callable(predicate):
            raise TypeError(f"filter: predicate must be callable, got {type(predicate).__name__}")

        def keep(e):
            return bool(predicate(*e) if isinstance(e, tuple) else predicate(e))
        return Dataset(lambda: (e for e in self._make() if keep(e)))

    def shard(self, num_shards, index):
        """Every num_shards-th element, starting at index."""
        if not 0 <= index < num_shards:
            raise ValueError(f"shard: index {index} is not in 0..{num_shards - 1}")
        n = None if self._length is None else len(range(index, self._length, num_shards))
        return Dataset(lambda: itertools.islice(self._make(), index, None, num_shards), n)

    def prefetch(self, buffer_size):
        """The same elements (they are in memory already)."""
        return self

    def cache(self, filename=""):
        """The same elements, computed once: the first complete iteration keeps them (after
        the maps before it), later ones replay them (a file name is not supported)."""
        if filename:
            from . import errors
            raise errors.UnimplementedError("cache: only the in-memory cache (filename='')")
        kept = []

        def make():
            if kept and kept[-1] is _DONE:
                yield from kept[:-1]
                return
            kept.clear()
            for element in self._make():
                kept.append(element)
                yield element
            kept.append(_DONE)
        return Dataset(make, self._length)

    # ---- iteration ----

    def __iter__(self):
        return DatasetIterator(self)

    def cardinality(self):
        """The number of elements, or -1 (infinite) / -2 (unknown) as TensorFlow's."""
        if self._length is not None:
            return self._length
        return -2

    def __len__(self):
        if self._length is None:
            raise TypeError("the dataset's length is unknown or infinite")
        return self._length

    def as_numpy_iterator(self):
        return iter(self)

    def get_single_element(self):
        """The dataset's one element (tf.data.Dataset.get_single_element); ValueError when it
        has none or more than one."""
        it = iter(self._make())
        try:
            element = next(it)
        except StopIteration:
            raise ValueError("get_single_element: the dataset is empty") from None
        for _ in it:
            raise ValueError("get_single_element: the dataset has more than one element")
        return element


class DatasetIterator:
    """What iter(dataset) gives (an iterator over its elements). Passed to a scheduled function
    of a parameter-server coordinator, it becomes one iterator for the whole cluster: each
    element goes to one function call, whichever worker runs it."""

    def __init__(self, dataset):
        self._dataset = dataset
        self._it = dataset._make()

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def get_next(self):
        return next(self)


def _stack(elements):
    first = elements[0]
    if isinstance(first, tuple):
        return tuple(_stack([e[k] for e in elements]) for k in range(len(first)))
    if isinstance(first, dict):
        return {k: _stack([e[k] for e in elements]) for k in first}
    return np.stack([np.asarray(e) for e in elements])
