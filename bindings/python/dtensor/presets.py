"""Sharding presets for transformers in the tf.distribute style: one class per way of laying a
model out, each giving the mesh ("batch" x "model" over every device) and the layouts of
parameters (by their Megatron-LM role) and of activations, from the C library's presets
(``dt_strategy_preset_mesh``, ``dt_strategy_preset_parameter_layout``,
``dt_strategy_preset_sequence_layout``). One model code serves them all: it keeps each
parameter in its ``stored`` layout (with its gradient and optimizer slots) and relayouts it to
its ``used`` layout where it reads it (a no-op when the two are equal)::

    strategy = dtensor.FullyShardedStrategy()          # PyTorch: fully_shard(model)
    stored, used = strategy.parameter_layouts("column", [768, 3072])
    w = dtensor.DVariable(dtensor.call_with_layout(init, stored, shape=[768, 3072]))
    h = x @ dtensor.relayout(w, used)

PyTorch's counterparts: ``DataParallelStrategy`` is DistributedDataParallel,
``FullyShardedStrategy`` FSDP2's ``fully_shard`` (ZeRO-3), ``TensorParallelStrategy``
``parallelize_module`` with ColwiseParallel / RowwiseParallel and SequenceParallel,
``FullyShardedTensorParallelStrategy`` ``fully_shard`` on a 2-D DeviceMesh after
``parallelize_module``.
"""

from . import _dtensor as _c

__all__ = ["ShardingPreset", "DataParallelStrategy", "FullyShardedStrategy",
           "TensorParallelStrategy", "FullyShardedTensorParallelStrategy", "sharding_preset",
           "PARAMETER_ROLES"]

#: the roles a parameter can play, as Megatron-LM splits it: "column" (a weight whose axis 1,
#: the output features or heads, splits over "model"), "column_bias" (its bias, axis 0), "row"
#: (a weight whose axis 0, the input features, splits), "vocab" (an embedding [vocabulary, ...]
#: split over the vocabulary), "replicated" (layer norms, row-parallel biases, positions)
PARAMETER_ROLES = {"replicated": _c.PARAM_REPLICATED, "column": _c.PARAM_COLUMN,
                   "column_bias": _c.PARAM_COLUMN_BIAS, "row": _c.PARAM_ROW,
                   "vocab": _c.PARAM_VOCAB}


class ShardingPreset:
    """A preset's mesh and layouts. Subclasses name the preset; creating one is collective
    (every client creates the same, as a mesh)."""

    _preset = None
    _model_axis = False  # whether model_size is honoured (the 2-D preset)

    def __init__(self, model_size=None, device_type="CPU"):
        from . import errors
        from ._mesh import Mesh
        from ._runtime import _DEVICE_TYPES, _ensure_init
        if type(self) is ShardingPreset:
            raise TypeError("ShardingPreset is abstract: create one of its subclasses")
        if model_size is not None and (isinstance(model_size, bool) or
                                       not isinstance(model_size, int) or
                                       not 1 <= model_size < 2**31):
            raise errors.InvalidArgumentError(f"{type(self).__name__}: model_size "
                                              f"{model_size!r}: expected a positive integer "
                                              f"below 2^31")
        if model_size is not None and not self._model_axis:
            raise errors.InvalidArgumentError(
                f"{type(self).__name__}: model_size {model_size} given, but this preset "
                f"fixes its model axis (only FullyShardedTensorParallelStrategy takes one)")
        kind = str(device_type).upper()
        if kind not in _DEVICE_TYPES:
            raise errors.InvalidArgumentError(f"{type(self).__name__}: device_type "
                                              f"{device_type!r} is not CPU or GPU")
        _ensure_init()
        self._mesh = Mesh(_c.preset_mesh(self._preset, model_size or 0, _DEVICE_TYPES[kind]))

    @property
    def name(self):
        """The C preset's name: "data_parallel", "fully_sharded", ..."""
        return _NAMES[self._preset]

    @property
    def mesh(self):
        """The mesh "batch" x "model" over every device."""
        return self._mesh

    @property
    def num_replicas_in_sync(self):
        """How many ways the batch splits (the "batch" axis)."""
        return self._mesh.dim_size("batch")

    def parameter_layouts(self, role, shape):
        """``(stored, used)`` Layouts of a parameter of ``role`` (a name of PARAMETER_ROLES) and
        ``shape``: where it, its gradient and its optimizer slots live, and where it is read."""
        from . import errors
        from ._mesh import Layout
        if role not in PARAMETER_ROLES:
            raise errors.InvalidArgumentError(f"{type(self).__name__}: role {role!r}: expected "
                                              f"one of {', '.join(PARAMETER_ROLES)}")
        dims = list(shape) if isinstance(shape, (list, tuple)) else None
        if dims is None or len(dims) > 8 or any(
                isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in dims):
            raise errors.InvalidArgumentError(f"{type(self).__name__}: shape {shape!r}: "
                                              f"expected a list of at most 8 extents >= 0")
        stored, used = _c.preset_parameter_layout(self._preset, self._mesh._handle,
                                                  PARAMETER_ROLES[role], dims)
        return (Layout.from_string(stored, self._mesh), Layout.from_string(used, self._mesh))

    def parameter_layout(self, role, shape):
        """The stored layout of a parameter (``parameter_layouts(role, shape)[0]``)."""
        return self.parameter_layouts(role, shape)[0]

    def sequence_layout(self, rank=3):
        """Activations ``[batch, sequence, ...]``: the batch over "batch", the sequence over
        "model" (sequence parallelism between the tensor-parallel regions)."""
        from . import errors
        from ._mesh import Layout
        if isinstance(rank, bool) or not isinstance(rank, int) or not 2 <= rank <= 8:
            raise errors.InvalidArgumentError(f"{type(self).__name__}: sequence_layout: rank "
                                              f"{rank!r}: expected an integer from 2 to 8")
        return Layout.from_string(_c.preset_sequence_layout(self._mesh._handle, rank),
                                  self._mesh)

    def input_layout(self, rank=2):
        """Inputs ``[batch, ...]``: the batch over "batch", the rest whole."""
        from ._mesh import Layout
        return Layout.batch_sharded(self._mesh, "batch", rank)

    def __repr__(self):
        return f"{type(self).__name__}(mesh={self._mesh})"


class DataParallelStrategy(ShardingPreset):
    """Data parallel (PyTorch's DistributedDataParallel): parameters replicated, the batch
    split over "batch" (N x 1 mesh); gradients come out partial and are all-reduced."""
    _preset = _c.PRESET_DATA_PARALLEL


class FullyShardedStrategy(ShardingPreset):
    """Fully sharded data parallel (FSDP2's ``fully_shard``, ZeRO-3; N x 1 mesh): every
    parameter, its gradient and its optimizer slots stored split on their first axis over
    "batch"; each is all-gathered where it is used and freed after, gathered again in the
    backward pass, and its gradient reduce-scattered into the stored shards."""
    _preset = _c.PRESET_FULLY_SHARDED


class TensorParallelStrategy(ShardingPreset):
    """Tensor parallel with sequence parallelism (``parallelize_module`` with ColwiseParallel /
    RowwiseParallel and SequenceParallel; 1 x N mesh): column weights split on their output
    axis, row weights on their input axis, the embedding on the vocabulary; the residual
    stream split along the sequence between the regions."""
    _preset = _c.PRESET_TENSOR_PARALLEL


class FullyShardedTensorParallelStrategy(ShardingPreset):
    """2-D: tensor parallel over "model" and fully sharded over "batch" (``fully_shard`` on a
    2-D DeviceMesh after ``parallelize_module``); mesh N / model_size x model_size
    (model_size defaults to 2 and must divide the devices)."""
    _preset = _c.PRESET_FULLY_SHARDED_TENSOR_PARALLEL
    _model_axis = True


_CLASSES = (DataParallelStrategy, FullyShardedStrategy, TensorParallelStrategy,
            FullyShardedTensorParallelStrategy)
_NAMES = {_c.PRESET_DATA_PARALLEL: "data_parallel", _c.PRESET_FULLY_SHARDED: "fully_sharded",
          _c.PRESET_TENSOR_PARALLEL: "tensor_parallel",
          _c.PRESET_FULLY_SHARDED_TENSOR_PARALLEL: "fully_sharded_tensor_parallel"}
# the names examples/gpt2.c's --preset takes, and the C presets' names
_BY_NAME = {"data": DataParallelStrategy, "fsdp": FullyShardedStrategy,
            "tensor": TensorParallelStrategy, "2d": FullyShardedTensorParallelStrategy}
_BY_NAME.update({_NAMES[c._preset]: c for c in _CLASSES})


def sharding_preset(name, model_size=None, device_type="CPU"):
    """The preset named ``name``: "data", "fsdp", "tensor" or "2d" (examples/gpt2.c's
    ``--preset``) or a C preset's name ("data_parallel", "fully_sharded", "tensor_parallel",
    "fully_sharded_tensor_parallel")."""
    from . import errors
    cls = _BY_NAME.get(name)
    if cls is None:
        raise errors.InvalidArgumentError(f"sharding_preset: {name!r}: expected one of "
                                          f"{', '.join(_BY_NAME)}")
    return cls(model_size, device_type)
