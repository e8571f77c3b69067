"""tf.keras.metrics: running means and sums, accuracies, cross-entropies and error metrics,
summed over every replica's examples."""

import types as _types

import numpy as np

from .. import DTensor, DVariable, Layout, client_id, get_strategy, unpack
from .. import _dtensor as _c
from .._runtime import _allgather_json
from .._tensor import _value
from .._ops import _host_mesh
from ._base import _Configurable, _d
from ._losses import BinaryCrossentropy, CategoricalCrossentropy
from ._losses import SparseCategoricalCrossentropy as SparseCategoricalCrossentropyLoss
from ._losses import _sparse_xent, _to_same_rank

# ---- metrics --------------------------------------------------------------------------------


def _blocks(t):
    """This client's blocks of a DTensor that no other device holds a copy of with a lower id
    (so that summing every client's blocks counts each element once)."""
    t = _value(t)
    layout = t.layout
    if layout.partial:
        raise ValueError(f"metrics: a tensor with pending sums ({layout._text!r}) cannot be "
                         f"read; relayout it first")
    mesh = layout.mesh
    owner = {}
    for dev in range(mesh.size):
        off = tuple(layout.local_shape(list(t.shape), dev)[1])
        owner.setdefault(off, dev)
    out = []
    for comp, dev in zip(unpack(t), mesh.local_device_ids()):
        off = tuple(layout.local_shape(list(t.shape), dev)[1])
        if owner[off] == dev:
            out.append(comp)
    return out


def _tensor(v, like):
    """v as a DTensor on like's mesh: DTensors as they are, host values (a dtype of their own
    when integral, else like's, float32 next to an integral like) uploaded in like's layout or
    replicated."""
    if isinstance(v, (DTensor, DVariable)):
        return _value(v)
    a = np.asarray(v)
    if not np.issubdtype(a.dtype, np.integer) and a.dtype != np.bool_:
        a = a.astype(like.dtype if np.issubdtype(like.dtype, np.floating) else np.float32)
    return _d().dtensor_from_array(a, like.layout if a.shape == like.shape else
                                   Layout.replicated(like.layout.mesh, a.ndim))


def _pred(y_pred):
    """Predictions as a DTensor: host values (float64 as Keras's float32) replicated on the
    default mesh."""
    if isinstance(y_pred, (DTensor, DVariable)):
        return _value(y_pred)
    a = np.asarray(y_pred)
    return _d().convert_to_tensor(a.astype(np.float32) if a.dtype == np.float64 else a)


def _aligned(p, *others):
    """This client's blocks of DTensor p and of ``others`` (labels, weights, masks: DTensors,
    host arrays, numbers or None, of p's shape or of its leading axes, a last axis of extent 1
    allowed) laid out alike, so that the k-th block of each covers the same examples: p keeps
    the sharding of the leading axes every other tensor has with p's extent and takes none
    on the rest (a sharded class axis is gathered for each row shard, never the whole tensor);
    the others take p's. Tuples (p's block, the others' blocks), numbers and None repeated."""
    d = _d()
    p = _value(p)
    vals = [o if o is None or (not isinstance(o, (DTensor, DVariable)) and np.ndim(o) == 0)
            else _tensor(o, p) for o in others]
    tensors = [t for t in vals if isinstance(t, DTensor)]
    specs = list(p.layout.sharding_specs)
    for i in range(p.ndim):
        if any(i >= t.ndim or t.shape[i] != p.shape[i] for t in tensors):
            specs[i] = "unsharded"
    mesh = p.layout.mesh

    def laid(t, rank):
        want = Layout((specs + ["unsharded"] * rank)[:rank], mesh)
        if t.layout.mesh is not mesh:
            return d.copy_to_mesh(t, want)
        return t if t.layout.sharding_specs == want.sharding_specs else d.relayout(t, want)

    p = laid(p, p.ndim)
    blocks = [_blocks(laid(t, t.ndim)) if isinstance(t, DTensor) else None for t in vals]
    return [(pb, *[b[k] if b is not None else v for b, v in zip(blocks, vals)])
            for k, pb in enumerate(_blocks(p))]


def _same_rank(v_shape, w):
    """Keras's squeeze_or_expand_to_same_rank of values (their global shape) and weights (a
    host block): (the weights after it, whether the values lose their last axis of extent 1,
    which they do where the weights are one rank short of them and of rank 2 or more)."""
    rv, rw = len(v_shape), w.ndim
    if rv == rw + 1 and v_shape[-1] == 1:
        if rw == 1:
            return w[..., None], False
        return w, True
    if rw == rv + 1 and w.shape[-1] == 1:
        return w[..., 0], False
    return w, False


def _pairs(y_true, y_pred, sample_weight=None):
    """Matching local blocks (labels, predictions, weights or None) of y_pred and of the
    labels and weights laid out as its leading axes."""
    return [(t, p, w) for p, t, w in _aligned(y_pred, y_true, sample_weight)]


class Metric(_Configurable):
    """A streaming metric: ``update_state`` adds this client's blocks' totals on the host,
    ``result()`` sums every client's (collective), ``reset_state()`` clears."""

    def __init__(self, name=None):
        self.name = name or type(self).__name__.lower()
        # a metric of a client-local strategy (mirrored on several clients) counts this
        # client's examples alone; a parameter-server strategy's adds the workers' updates
        strategy = get_strategy()
        self._local = getattr(strategy, "_client_local", False) and \
            strategy._kind != _c.STRATEGY_PARAMETER_SERVER
        self.reset_state()

    def reset_state(self):
        self._total = 0.0
        self._count = 0.0

    reset_states = reset_state

    def _add(self, total, count):
        self._total += float(total)
        self._count += float(count)

    def _once(self):
        """Whether this client adds a count every client knows (collective results, host
        values): one client of a shared metric, each of a client-local one."""
        return self._local or client_id() == 0

    def _add_samplewise(self, blocks, shape, sample_weight):
        """Add Keras's Mean of values of global ``shape`` (reduce_to_samplewise_values): with
        weights w, each example's values times w averaged over its axes, counted by w averaged
        alike; with a number w, the mean of every value times w, counted w; without, each
        example's mean, counted once. ``blocks``: this client's (values, weights) blocks, the
        weights' aligned with the values' (when ``sample_weight`` is neither None nor a number).
        Sums in float64; a block adds its share of the global shape's elements to the count."""
        shape = list(shape)
        number = None  # a weight of every example
        if isinstance(sample_weight, (DTensor, DVariable)):
            if sample_weight.ndim == 0:
                number = float(np.asarray(_d().gather(sample_weight)))
        elif sample_weight is not None and np.ndim(sample_weight) == 0:
            number = float(sample_weight)
        # elements of an example and of the whole (1 where empty: no block adds any)
        per, every = max(float(np.prod(shape[1:])), 1.0), max(float(np.prod(shape)), 1.0)
        total = count = 0.0
        for v, w in blocks:
            v = np.asarray(v, np.float64)
            if sample_weight is None:
                total += v.sum() / per
                count += v.size / per
                continue
            if number is not None:
                total += v.sum() * number / every
                count += v.size * number / every
                continue
            w, squeeze = _same_rank(shape, np.asarray(w, np.float64))
            vshape = shape[:-1] if squeeze else shape
            if squeeze:
                v = v[..., 0]
            rw = w.ndim
            w = np.broadcast_to(w, v.shape[:rw])
            total += (v * w.reshape(w.shape + (1,) * (v.ndim - rw))).sum() / \
                max(float(np.prod(vshape[1:])), 1.0)
            count += w.sum() / max(float(np.prod(vshape[1:rw])), 1.0)
        self._add(total, count)

    def _gather(self, pair):
        return [pair] if self._local else _allgather_json(pair)

    def _value(self):
        """The result as a Python float (collective)."""
        sums = self._gather([self._total, self._count])
        total, count = sum(s[0] for s in sums), sum(s[1] for s in sums)
        return total / count if count else 0.0

    def result(self):
        """The metric over every client's updates (collective): a float32 scalar tensor on
        this client (a regular tensor), as Keras's."""
        return _regular_scalar(self._value())

    def __call__(self, *args, **kwargs):
        """update_state, then the result (Keras's metric call)."""
        self.update_state(*args, **kwargs)
        return self.result()


class Mean(Metric):
    """keras.metrics.Mean: the (weighted) mean of the values given, each example (the first
    axis) its values' mean, counted by its weight (Keras 3's reduce_to_samplewise_values)."""

    def __init__(self, name="mean", dtype=None):
        super().__init__(name)

    def update_state(self, values, sample_weight=None):
        if isinstance(values, (DTensor, DVariable)):
            values = _value(values)
            self._add_samplewise(_aligned(values, sample_weight), values.shape, sample_weight)
        elif self._once():  # host values: the same on every client
            a = np.asarray(values, np.float64)
            w = sample_weight
            if isinstance(w, (DTensor, DVariable)):
                w = np.asarray(_d().gather(w))
            if w is not None:
                w = np.asarray(w, np.float64)
            self._add_samplewise([(a, w)], a.shape, w)


class Sum(Metric):
    def update_state(self, values):
        for b in _blocks(values):
            self._add(b.sum(), 0)

    def _value(self):
        return sum(s[0] for s in self._gather([self._total, 0]))


def _regular_scalar(value):
    """A float32 scalar tensor on this client's host mesh (no other client takes part)."""
    d = _d()
    return d.dtensor_from_array(np.float32(value), Layout.replicated(_host_mesh(), 0))


class _MeanWrapper(Mean):
    """Keras's MeanMetricWrapper: the Mean of per-example values ``_values(y_true, y_pred)``
    (a DTensor of y_pred's leading axes, and the bool mask of the examples they count or
    None: Keras's _keras_mask, which weights multiply, as Keras 3 applies it)."""

    def update_state(self, y_true, y_pred, sample_weight=None):
        values, mask = self._values(y_true, _pred(y_pred))
        if mask is not None and sample_weight is not None:  # Keras's apply_mask
            d = _d()
            m, w = d.cast(mask, values.dtype), _tensor(sample_weight, values)
            if w.ndim == 0:
                sample_weight = m * float(np.asarray(d.gather(w)))
            else:
                m, w = _to_same_rank(m, d.cast(w, values.dtype))
                sample_weight = m * w
        super().update_state(values, sample_weight)


class _PairMetric(_MeanWrapper):
    """Values computed on the host from matching blocks of labels and predictions
    (``_score(labels, predictions)``): labels laid out as the predictions' leading axes, the
    predictions' other axes gathered per row shard."""

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = self._prepare(_pred(y_pred))
        blocks = []
        for t, p, w in _pairs(y_true, y_pred, sample_weight):
            blocks.append((self._score(t, p), w))
        shape = self._shape(y_true, y_pred)
        self._add_samplewise(blocks, shape, sample_weight)

    def _prepare(self, y_pred):
        return y_pred

    def _shape(self, y_true, y_pred):
        return list(y_pred.shape)


def _labels_as(t, shape):
    """Integer labels of a block reshaped to the predictions' leading ``shape`` (a last axis
    of extent 1 dropped)."""
    return np.asarray(t).reshape(shape).astype(np.int64)


class SparseCategoricalAccuracy(_PairMetric):
    """keras.metrics.SparseCategoricalAccuracy: how often the label is the class of the largest
    prediction (the first on ties), per example of y_pred's leading axes. The argmax runs on
    the devices (a sharded class axis costs its small collectives, no gather)."""

    def __init__(self, name="sparse_categorical_accuracy", dtype=None):
        super().__init__(name)

    def _prepare(self, y_pred):
        return _d().argmax(y_pred, axis=y_pred.ndim - 1)

    def _score(self, t, p):
        return (_labels_as(t, p.shape) == p).astype(np.float64)


class CategoricalAccuracy(_PairMetric):
    """keras.metrics.CategoricalAccuracy: whether the largest label and prediction agree."""

    def __init__(self, name="categorical_accuracy", dtype=None):
        super().__init__(name)

    def update_state(self, y_true, y_pred, sample_weight=None):
        d = _d()
        y_pred = _pred(y_pred)
        y_true = _tensor(y_true, y_pred)
        super().update_state(d.argmax(y_true, axis=y_true.ndim - 1), y_pred, sample_weight)

    def _prepare(self, y_pred):
        return _d().argmax(y_pred, axis=y_pred.ndim - 1)

    def _score(self, t, p):
        return (np.asarray(t) == p).astype(np.float64)


class SparseTopKCategoricalAccuracy(_PairMetric):
    """keras.metrics.SparseTopKCategoricalAccuracy: whether the label is among the k largest
    predictions, ties at the k-th counted in (tf.math.in_top_k: fewer than k classes predicted
    higher than the label's, which is finite); ``from_sorted_ids``: y_pred holds class ids,
    best first, and the label is among the first k. Each row's classes are gathered on the
    devices holding its shard (not the whole tensor)."""

    def __init__(self, k=5, name="sparse_top_k_categorical_accuracy", dtype=None,
                 from_sorted_ids=False):
        super().__init__(name)
        self.k = int(k)
        self.from_sorted_ids = bool(from_sorted_ids)

    def _score(self, t, p):
        t = _labels_as(t, p.shape[:-1])
        if self.from_sorted_ids:
            return (p[..., :self.k] == t[..., None]).any(-1).astype(np.float64)
        ok = (t >= 0) & (t < p.shape[-1])
        pt = np.take_along_axis(p, np.where(ok, t, 0)[..., None], -1)
        hit = ok & np.isfinite(pt[..., 0]) & ((p > pt).sum(-1) < self.k)
        return hit.astype(np.float64)

    def _shape(self, y_true, y_pred):
        return list(y_pred.shape[:-1])


class BinaryAccuracy(_PairMetric):
    def __init__(self, name="binary_accuracy", dtype=None, threshold=0.5):
        super().__init__(name)
        self.threshold = threshold

    def _score(self, t, p):
        return ((p > self.threshold) == (t > 0.5)).astype(np.float64)


class Accuracy(_PairMetric):
    """keras.metrics.Accuracy: how often the predictions equal the labels."""

    def __init__(self, name="accuracy", dtype=None):
        super().__init__(name)

    def _score(self, t, p):
        return (np.asarray(t).reshape(p.shape) == p).astype(np.float64)


class MeanSquaredErrorMetric(_PairMetric):
    def __init__(self, name="mean_squared_error", dtype=None):
        super().__init__(name)

    def _score(self, t, p):
        return ((t - p) ** 2).mean(axis=-1) if p.ndim > 1 else (t - p) ** 2

    def _shape(self, y_true, y_pred):
        return list(y_pred.shape[:-1]) if y_pred.ndim > 1 else list(y_pred.shape)


class MeanAbsoluteErrorMetric(MeanSquaredErrorMetric):
    def __init__(self, name="mean_absolute_error", dtype=None):
        super().__init__(name)

    def _score(self, t, p):
        return np.abs(t - p).mean(axis=-1) if p.ndim > 1 else np.abs(t - p)


class SparseCategoricalCrossentropy(_MeanWrapper):
    """keras.metrics.SparseCategoricalCrossentropy: the mean of Keras's sparse categorical
    cross-entropy over the examples, through the loss's fused op (logits, or probabilities:
    one pass over them, no one-hot; a sharded class axis costs small all-reduces). With
    ``ignore_class``, those examples add 0 and, as in Keras 3, still count unless weights are
    given (the weights of those examples are then taken as 0)."""

    def __init__(self, name="sparse_categorical_crossentropy", dtype=None, from_logits=False,
                 ignore_class=None, axis=-1):
        super().__init__(name)
        self.from_logits = from_logits
        self.ignore_class = ignore_class
        self.axis = axis

    def _values(self, y_true, y_pred):
        return _sparse_xent(y_true, y_pred, self.from_logits, self.ignore_class, self.axis,
                            None)


class CategoricalCrossentropyMetric(_MeanWrapper):
    """keras.metrics.CategoricalCrossentropy: the mean of the categorical cross-entropy of
    one-hot (or soft) labels, ``label_smoothing`` mixing them with the uniform distribution."""

    def __init__(self, name="categorical_crossentropy", dtype=None, from_logits=False,
                 label_smoothing=0.0, axis=-1):
        super().__init__(name)
        if axis not in (-1,):
            raise ValueError(f"CategoricalCrossentropy: only axis=-1 is supported, got {axis}")
        self.from_logits = from_logits
        self.label_smoothing = float(label_smoothing)
        self.axis = axis

    def _values(self, y_true, y_pred):
        d = _d()
        y_true = d.cast(_tensor(y_true, y_pred), y_pred.dtype)
        if self.label_smoothing:
            y_true = y_true * (1.0 - self.label_smoothing) + \
                self.label_smoothing / y_pred.shape[-1]
        return CategoricalCrossentropy(from_logits=self.from_logits).per_example(
            y_true, y_pred), None


metrics = _types.SimpleNamespace(
    Metric=Metric, Mean=Mean, Sum=Sum, SparseCategoricalAccuracy=SparseCategoricalAccuracy,
    CategoricalAccuracy=CategoricalAccuracy, BinaryAccuracy=BinaryAccuracy, Accuracy=Accuracy,
    SparseTopKCategoricalAccuracy=SparseTopKCategoricalAccuracy,
    SparseCategoricalCrossentropy=SparseCategoricalCrossentropy,
    CategoricalCrossentropy=CategoricalCrossentropyMetric,
    MeanSquaredError=MeanSquaredErrorMetric, MeanAbsoluteError=MeanAbsoluteErrorMetric)


def _get_metric(m, loss):
    if isinstance(m, Metric):
        return m
    if m in ("accuracy", "acc"):  # Keras picks the accuracy that fits the loss
        if isinstance(loss, SparseCategoricalCrossentropyLoss):
            return SparseCategoricalAccuracy(name="accuracy")
        if isinstance(loss, CategoricalCrossentropy):
            return CategoricalAccuracy(name="accuracy")
        if isinstance(loss, BinaryCrossentropy):
            return BinaryAccuracy(name="accuracy")
        return Accuracy()
    table = {"sparse_categorical_accuracy": SparseCategoricalAccuracy,
             "categorical_accuracy": CategoricalAccuracy, "binary_accuracy": BinaryAccuracy,
             "sparse_top_k_categorical_accuracy": SparseTopKCategoricalAccuracy,
             "sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
             "categorical_crossentropy": CategoricalCrossentropyMetric,
             "mse": MeanSquaredErrorMetric, "mean_squared_error": MeanSquaredErrorMetric,
             "mae": MeanAbsoluteErrorMetric, "mean_absolute_error": MeanAbsoluteErrorMetric}
    if m not in table:
        raise ValueError(f"unknown metric {m!r}; one of {sorted(table)} or 'accuracy'")
    return table[m]()
