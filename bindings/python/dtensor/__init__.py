"""dtensor: sharded tensors over meshes of devices, mirroring ``tf.experimental.dtensor``.

Names and semantics follow TensorFlow's DTensor API, with numpy arrays where TensorFlow uses
``tf.Tensor``::

    import numpy as np
    import dtensor

    dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=6)
    mesh = dtensor.create_mesh([("x", 3), ("y", 2)], device_type="CPU")
    layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh)
    t = dtensor.dtensor_from_array(np.arange(6, dtype=np.int32).reshape(3, 2), layout)
    dtensor.unpack(t)          # one component per local device
    dtensor.gather(t)          # the global array, gathered explicitly (collective)

Under ``mpiexec.mpich -n N`` each rank is a client, as in DTensor's multi-client mode; calls
documented as collective must be made by every client in the same order. Every failure raises
:class:`DTensorError` carrying the C status (``.status``, ``.code``) and message.
"""

# The API lives in modules by concern, each importing only the modules before it in this list
# (a name from a later one is imported where it is used); this file re-exports their public
# names. _nn wraps the ops of tf.nn and tf.math for symbolic operands in every module.
from . import _dtensor as _c
from . import errors
from ._dtensor import DTensorError
from ._dtypes import (TensorShape, UNSHARDED, bfloat16, bool_, float16, float32, float64, int32,
                      int64, int8, uint8)
from ._runtime import (LogicalDevice, LogicalDeviceConfiguration, PhysicalDevice, barrier,
                       client_id, config, devices_report, initialize_accelerator_system,
                       is_initialized, list_logical_devices, list_physical_devices, local_devices,
                       num_clients, num_global_devices, num_local_devices, print_ordered,
                       set_logical_device_configuration, shutdown_accelerator_system,
                       _allgather_json)
from ._mesh import (Layout, Mesh, MeshDimension, create_distributed_mesh, create_mesh, ledger,
                    ledger_clear, ledger_next_step, ledger_text, set_collective_algorithm)
from ._tensor import (DTensor, LocalTensor, check_layout, dtensor_from_array, fetch_layout,
                      from_dlpack, gather, local_components, pack, unpack)
from ._ops import (Generator, cast, constant, convert_to_tensor, default_mesh, fill, identity,
                   is_dtensor, ones, ones_like, random, range, run_on, show_programs, zeros,
                   zeros_like)
from ._math_ops import (abs, add, argmax, argmin, concat, cos, cumsum, divide, equal, erf, exp,
                        floordiv, floormod, gelu, greater, greater_equal, layer_norm, less,
                        less_equal, log, log_softmax, logical_and, logical_not, logical_or,
                        logical_xor, matmul, maximum, minimum, mod, multiply, neg, negative,
                        not_equal, pow, reduce_logsumexp, reduce_max, reduce_mean, reduce_min,
                        reduce_prod, reduce_sum, relu, reshape, rms_norm, rsqrt, sigmoid, silu, sin,
                        slice, softmax, sqrt, square, subtract, swish, tanh, transpose, truediv,
                        where)
from ._array_ops import (broadcast_to, call_with_layout, copy_to_mesh, einsum, embedding_lookup,
                         expand_dims, gather_rows, one_hot, pad, relayout, split, squeeze, stack,
                         take, tile, unsorted_segment_sum)
from ._variables import DVariable
from ._function import Function, function
from ._training import Adam, AdamW, Dense, Optimizer, RMSprop, SGD, Sequential
from ._strategies import (CentralStorageStrategy, CollectiveCommunication,
                          CommunicationImplementation, CommunicationOptions, CrossDeviceOps,
                          GradientTape, HierarchicalCopyAllReduce, InputContext, MirroredStrategy,
                          MultiWorkerMirroredStrategy, NcclAllReduce, OneDeviceStrategy, PerReplica,
                          ReduceOp, ReductionToOneDevice, ReplicaContext, Strategy,
                          get_replica_context, get_strategy, in_cross_replica_context)
from ._ps import (ClusterCoordinator, ClusterSpec, FixedShardsPartitioner, MaxSizePartitioner,
                  MinSizePartitioner, PSVariable, ParameterServerStrategy, PerWorkerDataset,
                  RemoteValue, TFConfigClusterResolver, Variable)
from ._nn import (add_n, avg_pool2d, batch_normalization, compute_average_loss, conv2d, math,
                  max_pool2d, moments, nn, scale_regularization_loss,
                  softmax_cross_entropy_with_logits, sparse_softmax_cross_entropy_with_logits)
from ._utilities import Module, dtypes, io, nest, string

_c.error_classes.update(errors.BY_STATUS)  # C failures raise TensorFlow's classes

__version__ = _c.VERSION  # the C library's (tf.__version__)

__all__ = [
    "UNSHARDED", "DTensorError", "DTensor", "Mesh", "Layout",
    "initialize_accelerator_system", "shutdown_accelerator_system", "is_initialized",
    "create_mesh", "create_distributed_mesh", "client_id", "num_clients", "barrier",
    "num_local_devices", "num_global_devices", "local_devices", "devices_report",
    "dtensor_from_array", "pack", "unpack", "gather", "fetch_layout", "check_layout",
    "print_ordered", "call_with_layout", "relayout", "copy_to_mesh", "fill", "ones", "zeros",
    "range", "random", "matmul", "add", "subtract", "multiply", "divide", "maximum", "minimum",
    "pow", "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "neg",
    "negative", "abs", "exp", "log", "sqrt", "relu", "tanh", "sigmoid", "square", "sin", "cos",
    "reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "transpose",
    "reshape", "slice", "concat", "DVariable", "function", "Function", "show_programs", "set_collective_algorithm",
    "ledger", "ledger_text", "ledger_clear", "ledger_next_step", "Dense", "Sequential", "SGD",
    "Adam", "AdamW", "RMSprop", "ReduceOp", "Strategy", "OneDeviceStrategy", "MirroredStrategy",
    "MultiWorkerMirroredStrategy", "CentralStorageStrategy", "ParameterServerStrategy",
    "ClusterCoordinator", "RemoteValue", "get_strategy", "compute_average_loss",
    "is_dtensor", "default_mesh", "run_on", "zeros_like", "ones_like", "cast", "truediv",
    "floordiv", "floormod", "mod", "GradientTape", "PerReplica", "ReplicaContext",
    "InputContext", "get_replica_context", "in_cross_replica_context", "Optimizer", "data",
    "keras", "from_dlpack", "local_components", "CrossDeviceOps", "NcclAllReduce",
    "HierarchicalCopyAllReduce", "ReductionToOneDevice", "CommunicationImplementation",
    "CommunicationOptions", "FixedShardsPartitioner", "MinSizePartitioner", "MaxSizePartitioner",
    "TFConfigClusterResolver", "PSVariable", "Variable", "PerWorkerDataset", "bfloat16",
    "float16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool_", "where",
    "logical_and", "logical_or", "logical_xor", "logical_not", "erf", "gelu", "silu", "swish",
    "rsqrt", "nn", "math", "train", "Checkpoint", "CheckpointManager",
    # row-wise ops
    "softmax", "log_softmax", "reduce_logsumexp", "layer_norm", "rms_norm", "argmax", "argmin",
    "cumsum",
    # TensorFlow's names for what TensorFlow programs do around the ops
    "constant", "convert_to_tensor", "identity", "stop_gradient", "TensorShape", "LocalTensor",
    "add_n", "scale_regularization_loss", "softmax_cross_entropy_with_logits",
    "sparse_softmax_cross_entropy_with_logits", "ClusterSpec", "CollectiveCommunication",
    "errors", "config", "distribute", "experimental", "list_physical_devices",
    "list_logical_devices", "set_logical_device_configuration", "LogicalDeviceConfiguration",
    "Module", "nest", "io", "string", "dtypes", "conv2d", "max_pool2d", "avg_pool2d", "moments",
    "batch_normalization", "MeshDimension",
]


# ---- input pipelines and Keras-style models (modules built on the names above) --------------

from . import data, keras, train  # noqa: E402 (they import the names defined above)
from . import attention, presets  # noqa: E402
from . import distribute, experimental  # noqa: E402
from .presets import (DataParallelStrategy, FullyShardedStrategy,  # noqa: E402
                      FullyShardedTensorParallelStrategy, TensorParallelStrategy)

stop_gradient = keras.stop_gradient  # tf.stop_gradient
from .train import Checkpoint, CheckpointManager  # noqa: E402
