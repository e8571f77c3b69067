"""tf.distribute under its TensorFlow paths: ``dtensor.distribute.MirroredStrategy`` is
``tf.distribute.MirroredStrategy``, ``dtensor.distribute.experimental.ParameterServerStrategy``
is ``tf.distribute.experimental.ParameterServerStrategy``, and so on (the same objects as the
flat names ``dtensor.MirroredStrategy``, ...), so that a TensorFlow program needs only ``tf.``
replaced by ``dtensor.``."""

import types as _types

from . import (CentralStorageStrategy, ClusterCoordinator, CollectiveCommunication,
               CommunicationImplementation, CommunicationOptions, CrossDeviceOps,
               FixedShardsPartitioner, HierarchicalCopyAllReduce, InputContext,
               MaxSizePartitioner, MinSizePartitioner, MirroredStrategy,
               MultiWorkerMirroredStrategy, NcclAllReduce, OneDeviceStrategy,
               ParameterServerStrategy, PerReplica, ReduceOp, ReductionToOneDevice, RemoteValue,
               ReplicaContext, Strategy, TFConfigClusterResolver, get_replica_context,
               _replicas, get_strategy, in_cross_replica_context)
from .presets import (DataParallelStrategy, FullyShardedStrategy,
                      FullyShardedTensorParallelStrategy, TensorParallelStrategy, sharding_preset)
from .train import ClusterSpec

__all__ = ["CentralStorageStrategy", "ClusterCoordinator", "CrossDeviceOps",
           "HierarchicalCopyAllReduce", "InputContext", "MirroredStrategy",
           "MultiWorkerMirroredStrategy", "NcclAllReduce", "OneDeviceStrategy",
           "ParameterServerStrategy", "ReduceOp", "ReductionToOneDevice", "ReplicaContext",
           "Strategy", "get_replica_context", "get_strategy", "in_cross_replica_context",
           "has_strategy", "experimental", "cluster_resolver", "coordinator", "DistributedValues",
           "DataParallelStrategy", "FullyShardedStrategy", "TensorParallelStrategy",
           "FullyShardedTensorParallelStrategy", "sharding_preset"]

DistributedValues = PerReplica


def has_strategy():
    """tf.distribute.has_strategy: whether a (non-default) strategy is in scope."""
    from . import _dtensor as _c
    from ._runtime import _current_strategy
    s = _current_strategy()
    return s is not None and s._kind != _c.STRATEGY_DEFAULT


cluster_resolver = _types.SimpleNamespace(TFConfigClusterResolver=TFConfigClusterResolver,
                                          ClusterSpec=ClusterSpec)
coordinator = _types.SimpleNamespace(ClusterCoordinator=ClusterCoordinator,
                                     RemoteValue=RemoteValue)
experimental = _types.SimpleNamespace(
    ValueContext=_replicas.ValueContext,
    ParameterServerStrategy=ParameterServerStrategy,
    CentralStorageStrategy=CentralStorageStrategy,
    MultiWorkerMirroredStrategy=MultiWorkerMirroredStrategy,
    CommunicationOptions=CommunicationOptions,
    CommunicationImplementation=CommunicationImplementation,
    CollectiveCommunication=CollectiveCommunication,
    coordinator=coordinator,
    partitioners=_types.SimpleNamespace(FixedShardsPartitioner=FixedShardsPartitioner,
                                        MinSizePartitioner=MinSizePartitioner,
                                        MaxSizePartitioner=MaxSizePartitioner))
