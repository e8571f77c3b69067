"""The parameter-server talk's example (and the tf.distribute guide's parameter-server setup) as a
TensorFlow user types it, with `tf.` replaced by `dtensor.` (README, "Where the guides' names
live"). Every task runs this same program with its own TF_CONFIG, as TensorFlow's tasks are
started (or with DTENSOR_CLUSTER, which maps the ranks onto the tasks):

    mpiexec.mpich -n 1 -env TF_CONFIG '{"cluster": {"chief": ["h:0"], "worker": ["h:1"],
        "ps": ["h:2"]}, "task": {"type": "chief", "index": 0}}' python3 \\
        examples/guide_parameter_server.py : -n 1 -env TF_CONFIG '{..."worker"...}' ... : ...
    DTENSOR_CLUSTER=chief=1,worker=3,ps=2 mpiexec.mpich -n 6 \\
        python3 examples/guide_parameter_server.py

A variable made in the strategy's scope lives on the ps tasks; five scheduled functions each
add the next element of the per-worker dataset [1, 2, 3, 4, 5] to it, whichever worker runs
them, so after join() it holds 15, read on every task. The lines marked "check:" are additions
for bindings/python/tests/test_guides.py.
"""
import dtensor

# The guide's setup: a partitioner, the strategy from TF_CONFIG, the coordinator.
variable_partitioner = (
    dtensor.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=(256 << 10),
        max_shards=2))
strategy = dtensor.distribute.experimental.ParameterServerStrategy(
    dtensor.distribute.cluster_resolver.TFConfigClusterResolver(),
    variable_partitioner=variable_partitioner)
coordinator = dtensor.distribute.experimental.coordinator.ClusterCoordinator(
    strategy)

# The talk's example.
with strategy.scope():
    v = dtensor.Variable(initial_value=0)


@dtensor.function
def worker_fn(iterator):

    def replica_fn(x):
        v.assign_add(x)

    strategy.run(replica_fn, args=(next(iterator),))


def dataset_fn():
    return dtensor.data.Dataset.from_tensor_slices([1, 2, 3, 4, 5])


per_worker_dataset = coordinator.create_per_worker_dataset(dataset_fn)
per_worker_iterator = iter(per_worker_dataset)

for _ in range(5):
    coordinator.schedule(worker_fn, args=(per_worker_iterator,))
coordinator.join()
print(v)

assert v.read_value() == 15
print(f"check: {strategy.task_type}:{strategy.task_index} reads {int(v.read_value())} "
      f"from {v.device}")
coordinator.shutdown()
