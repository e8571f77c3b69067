"""The tf.distribute.Strategy API as its documentation and the posts introducing it use it,
including TensorFlow 2.0-2.3's names (experimental_run_v2, CollectiveCommunication,
experimental_distribute_datasets_from_function), typed as a TensorFlow user types them with
`tf.` replaced by `dtensor.` and the two GPUs by two CPU devices:

    python3 examples/guide_strategy_api.py
    mpiexec.mpich -n 2 python3 examples/guide_strategy_api.py

Lines marked "check:" print values for bindings/python/tests/test_guides.py.
"""
import dtensor

dtensor.config.set_logical_device_configuration(
    dtensor.config.list_physical_devices("CPU")[0],
    [dtensor.config.LogicalDeviceConfiguration()] * 2)

# The default strategy is a pass-through: run calls the function and gives its value back.
default_strategy = dtensor.distribute.get_strategy()
print("check: default run", default_strategy.run(lambda: 42))
print("check: default replicas",
      dtensor.distribute.get_replica_context().num_replicas_in_sync)

# A variable created in a MirroredStrategy's scope is a MirroredVariable.
strategy = dtensor.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
with strategy.scope():
    x = dtensor.Variable(1.)
print(x)
print("check: local results", [float(t) for t in strategy.experimental_local_results(x)])


# Strategy.reduce: the replicas' ids summed.
def step_fn():
    i = dtensor.distribute.get_replica_context().replica_id_in_sync_group
    return dtensor.identity(i)


per_replica_result = strategy.run(step_fn)
total = strategy.reduce("SUM", per_replica_result, axis=None)
print("check: reduce ids", total)


# Strategy.run with values from a function.
def value_fn(value_context):
    return value_context.num_replicas_in_sync


distributed_values = strategy.experimental_distribute_values_from_function(value_fn)


def replica_fn2(input):
    return input * 2


result = strategy.run(replica_fn2, args=(distributed_values,))
print(result)
print("check: run doubled", [int(t) for t in strategy.experimental_local_results(result)])

# TensorFlow 2.0's name of run, and an all-reduce in the replica context.


def all_reduce_fn():
    ctx = dtensor.distribute.get_replica_context()
    return ctx.all_reduce(dtensor.distribute.ReduceOp.SUM,
                          dtensor.constant(ctx.replica_id_in_sync_group + 1.0))


per_replica = strategy.experimental_run_v2(all_reduce_fn)
print("check: all_reduce", [float(t) for t in strategy.experimental_local_results(per_replica)])
print("check: reduce mean",
      strategy.reduce(dtensor.distribute.ReduceOp.MEAN, per_replica, axis=None))

# TensorFlow 2.0-2.3's multi-worker names.
multiworker = dtensor.distribute.experimental.MultiWorkerMirroredStrategy(
    communication=dtensor.distribute.experimental.CollectiveCommunication.RING)
print("check: multi-worker replicas", multiworker.num_replicas_in_sync)


def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(4)
    d = dtensor.data.Dataset.from_tensors([[1.]]).repeat().batch(batch_size)
    return d.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)


inputs = iter(multiworker.experimental_distribute_datasets_from_function(dataset_fn))


def square_sum(batch):
    return dtensor.reduce_sum(batch * batch)


for _ in range(2):
    per_replica = multiworker.experimental_run_v2(square_sum, args=(next(inputs),))
    print("check: sum over the global batch",
          multiworker.reduce(dtensor.distribute.ReduceOp.SUM, per_replica, axis=None))
