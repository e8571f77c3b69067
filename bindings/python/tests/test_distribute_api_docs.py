"""The tf.distribute API documentation's examples (Strategy, MirroredStrategy, ReplicaContext,
ValueContext, DistributedValues, OneDeviceStrategy, CentralStorageStrategy docstrings) as a
TensorFlow user types them, `tf.` -> `dtensor.`, "GPU:i" -> "CPU:i", each checked against the
output the documentation shows. MirroredStrategy is each client's own (as TensorFlow's, one
machine's), so these run alike on every client."""
import numpy as np
import pytest

import dtensor
from conftest import CLIENTS, DEVICES

LOCAL = DEVICES // CLIENTS
tf = dtensor  # the documentation's `tf`


def vals(x):
    return [np.asarray(v).tolist() for v in x]


def test_mirrored_variable_in_scope_and_outside():
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    with strategy.scope():
        mirrored_variable = tf.Variable(1.)
    assert repr(mirrored_variable) == (
        "MirroredVariable:{\n  0: <dtensor.Variable 'Variable:0' shape=() dtype=float32, "
        "numpy=1.0>,\n  1: <dtensor.Variable 'Variable/replica_1:0' shape=() dtype=float32, "
        "numpy=1.0>\n}")
    regular_variable = tf.Variable(1.)
    assert repr(regular_variable) == \
        "<dtensor.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>"


def test_mirrored_variable_made_in_a_function():
    x = []

    @tf.function
    def create_variable():
        if not x:
            x.append(tf.Variable(1.))
        return x[0]
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    with strategy.scope():
        create_variable()
    assert repr(x[0]).startswith("MirroredVariable:{")
    assert strategy.experimental_local_results(x[0])[1] == 1.0


def test_experimental_distribute_dataset():
    global_batch_size = 2
    strategy = tf.distribute.MirroredStrategy(devices=["CPU:0", "CPU:1"])
    dataset = tf.data.Dataset.range(4).batch(global_batch_size)
    dist_dataset = strategy.experimental_distribute_dataset(dataset)

    @tf.function
    def replica_fn(input):  # noqa: A002 (the documentation's name)
        return input * 2
    result = []
    for x in dist_dataset:
        result.append(strategy.run(replica_fn, args=(x,)))
    parts = [strategy.experimental_local_results(r) for r in result]
    assert [vals(p) for p in parts] == [[[0], [2]], [[4], [6]]]
    assert all(v.dtype == np.int64 and v.shape == (1,) for p in parts for v in p)
    assert repr(result[0]).startswith("PerReplica:{0: DTensor([0]")


def test_run_with_a_constant_input():
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    tensor_input = tf.constant(3.0)

    @tf.function
    def replica_fn(input):  # noqa: A002
        return input * 2.0
    result = strategy.run(replica_fn, args=(tensor_input,))
    assert vals(strategy.experimental_local_results(result)) == [6.0, 6.0]


def test_run_inside_a_function_with_distributed_values():
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])

    @tf.function
    def run():
        def value_fn(value_context):
            return value_context.num_replicas_in_sync
        distributed_values = strategy.experimental_distribute_values_from_function(value_fn)

        def replica_fn2(input):  # noqa: A002
            return input * 2
        return strategy.run(replica_fn2, args=(distributed_values,))
    result = run()
    assert vals(strategy.experimental_local_results(result)) == [4, 4]


def test_all_reduce_of_replica_ids_is_int32():
    strategy = tf.distribute.MirroredStrategy(["cpu:0", "cpu:1"])

    @tf.function
    def run():
        def value_fn(value_context):
            return tf.constant(value_context.replica_id_in_sync_group)
        distributed_values = strategy.experimental_distribute_values_from_function(value_fn)

        def replica_fn(input):  # noqa: A002
            return tf.distribute.get_replica_context().all_reduce("sum", input)
        return strategy.run(replica_fn, args=(distributed_values,))
    local = strategy.experimental_local_results(run())
    assert vals(local) == [1, 1] and local[0].dtype == np.int32


def test_reduce_of_replica_ids_and_devices():
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])

    def step_fn():
        i = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.identity(i)
    per_replica_result = strategy.run(step_fn)
    total = strategy.reduce("SUM", per_replica_result, axis=None)
    assert total == 1 and total.dtype == np.int32
    local = strategy.experimental_local_results(per_replica_result)
    assert local[0].device.endswith("device:CPU:0") and local[1].device.endswith("device:CPU:1")
    assert total.device.endswith("device:CPU:0")


def test_reduce_along_the_batch_axis():
    """The reduce docstring's global batch of 8 over 2 replicas, and the last partial batch of
    6 whose MEAN with axis=0 divides by 6 (TensorFlow's truediv: integers give float64)."""
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    x = next(iter(strategy.experimental_distribute_dataset(tf.data.Dataset.range(8).batch(8))))
    assert np.asarray(strategy.reduce("sum", x, axis=None)).tolist() == [4, 6, 8, 10]
    assert int(strategy.reduce("sum", x, axis=0)) == 28
    x = next(iter(strategy.experimental_distribute_dataset(tf.data.Dataset.range(6).batch(6))))
    mean = strategy.reduce(tf.distribute.ReduceOp.MEAN, x, axis=0)
    assert float(mean) == 2.5 and mean.dtype == np.float64


def test_distribute_values_from_function():
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    local = strategy.experimental_local_results(
        strategy.experimental_distribute_values_from_function(lambda ctx: tf.constant(1.)))
    assert isinstance(local, tuple) and vals(local) == [1.0, 1.0]
    array_value = np.array([3., 2., 1.])
    local = strategy.experimental_local_results(
        strategy.experimental_distribute_values_from_function(
            lambda ctx: array_value[ctx.replica_id_in_sync_group]))
    assert local == (3.0, 2.0)
    local = strategy.experimental_local_results(
        strategy.experimental_distribute_values_from_function(
            lambda ctx: ctx.num_replicas_in_sync))
    assert local == (2, 2)


def test_value_context():
    def value_fn(context):
        return context.replica_id_in_sync_group / context.num_replicas_in_sync
    context = tf.distribute.experimental.ValueContext(replica_id_in_sync_group=2,
                                                      num_replicas_in_sync=4)
    assert value_fn(context) == 0.5


def test_gather_of_two_replicas():
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    distributed_values = strategy.experimental_distribute_values_from_function(
        lambda _: tf.identity(tf.constant([[1], [2]])))

    @tf.function
    def run():
        return strategy.gather(distributed_values, axis=0)
    got = run()
    assert got.shape == (4, 1) and got.dtype == np.int32
    assert np.asarray(got).tolist() == [[1], [2], [1], [2]]


@pytest.mark.skipif(LOCAL < 4, reason="four devices on one client")
def test_gather_of_four_replicas_along_each_axis():
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2", "CPU:3"])
    single_tensor = tf.reshape(tf.range(6), shape=(1, 2, 3))
    distributed_values = strategy.experimental_distribute_values_from_function(
        lambda _: tf.identity(single_tensor))

    @tf.function
    def run(axis):
        return strategy.gather(distributed_values, axis=axis)
    one = np.arange(6).reshape(1, 2, 3)
    for axis, shape in [(0, (4, 2, 3)), (1, (1, 8, 3)), (2, (1, 2, 12))]:
        got = run(axis)
        assert got.shape == shape
        np.testing.assert_array_equal(np.asarray(got), np.concatenate([one] * 4, axis=axis))


def test_replica_context_ids():
    strategy = tf.distribute.MirroredStrategy(['CPU:0', 'CPU:1'])

    def func():
        return tf.distribute.get_replica_context().replica_id_in_sync_group
    assert vals(strategy.experimental_local_results(strategy.run(func))) == [0, 1]


def test_all_reduce_of_one_value_and_of_a_list():
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])

    def step_fn():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(1.))
    assert vals(strategy.experimental_local_results(strategy.run(step_fn))) == [2.0, 2.0]

    def step_fn2():
        ctx = tf.distribute.get_replica_context()
        value1 = tf.identity(1.)
        value2 = tf.identity(2.)
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, [value1, value2])
    local = strategy.experimental_local_results(strategy.run(step_fn2))
    assert [vals(x) for x in local] == [[2.0, 4.0], [2.0, 4.0]]


def test_all_gather_of_a_tensor_and_of_a_nest():
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])

    @tf.function
    def gather_value():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_gather(tf.constant([1, 2, 3]), axis=0)
    result = strategy.run(gather_value)
    assert vals(strategy.experimental_local_results(result)) == [[1, 2, 3, 1, 2, 3]] * 2

    @tf.function
    def gather_nest():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_gather([tf.constant([1, 2, 3]), tf.constant([[1, 2], [3, 4]])], axis=0)
    result = strategy.run(gather_nest)
    assert vals(strategy.experimental_local_results(result[0])) == [[1, 2, 3, 1, 2, 3]] * 2
    assert vals(strategy.experimental_local_results(result[1])) == \
        [[[1, 2], [3, 4], [1, 2], [3, 4]]] * 2


def test_merge_call():
    distribution = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])

    def merge_fn(distribution, three_plus_replica_id):
        return sum(distribution.experimental_local_results(three_plus_replica_id))

    def fn(three):
        replica_ctx = tf.distribute.get_replica_context()
        v = three + replica_ctx.replica_id_in_sync_group
        s = replica_ctx.merge_call(merge_fn, args=(v,))
        return s + v
    with distribution.scope():
        merged_results = distribution.run(fn, args=[3])
        assert vals(distribution.experimental_local_results(merged_results)) == [10, 11]


def test_variable_created_in_scope():
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        v = tf.Variable(1.)
    assert strategy.extended.variable_created_in_scope(v) is True
    strategy = tf.distribute.MirroredStrategy()
    v = tf.Variable(1.)
    assert strategy.extended.variable_created_in_scope(v) is False
    assert strategy.extended.worker_devices[0].endswith("device:CPU:0")


def test_distributed_values_made_and_used():
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    dataset = tf.data.Dataset.from_tensor_slices([5., 6., 7., 8.]).batch(2)
    distributed_values = next(iter(strategy.experimental_distribute_dataset(dataset)))

    @tf.function
    def run(input):  # noqa: A002
        return input + 1.0
    updated_value = strategy.run(run, args=(distributed_values,))
    assert vals(strategy.experimental_local_results(updated_value)) == [[6.0], [7.0]]
    assert strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(
        lambda: tf.distribute.get_replica_context().replica_id_in_sync_group), axis=None) == 1


def test_input_context_per_replica_batches():
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    global_batch_size = 4

    def dataset_fn(input_context):
        batch_size = input_context.get_per_replica_batch_size(global_batch_size)
        d = tf.data.Dataset.from_tensors([[1.]]).repeat().batch(batch_size)
        return d.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    x = next(iter(strategy.distribute_datasets_from_function(dataset_fn)))
    assert [v.shape for v in strategy.experimental_local_results(x)] == [(2, 1, 1), (2, 1, 1)]


@pytest.mark.skipif(CLIENTS > 1, reason="one-device and central storage are one machine's: "
                                        "the other clients hold no replica (README)")
def test_one_device_strategy_run_gives_the_value_itself():
    strategy = tf.distribute.OneDeviceStrategy(device="/cpu:0")
    with strategy.scope():
        v = tf.Variable(1.0)
    assert v.device.endswith("device:CPU:0")

    def step_fn(x):
        return x * 2
    result = 0
    for i in range(10):
        result += strategy.run(step_fn, args=(i,))
    assert result == 90


@pytest.mark.skipif(CLIENTS > 1, reason="one machine's strategy (README)")
def test_central_storage_strategy_runs_each_batch():
    strategy = tf.distribute.experimental.CentralStorageStrategy()
    dist_dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.range(5).batch(2))
    out = []
    with strategy.scope():
        @tf.function
        def train_step(val):
            return val + 1
        for x in dist_dataset:
            out.append(strategy.run(train_step, args=(x,)))
    got = [sorted(sum((np.asarray(v).tolist() for v in strategy.experimental_local_results(r)),
                      [])) for r in out]
    assert got == [[1, 2], [3, 4], [5]]
