"""The parameter-server training of the talk and the guide, with dtensor's names. Every client
runs this same program: the chief schedules, the workers run what it schedules, the ps task
holds the variables.

    DTENSOR_CLUSTER=chief=1,worker=2,ps=1 mpiexec.mpich -n 4 python3 examples/parameter_server.py

(TF_CONFIG works too; ranks take the tasks in the order chief, worker, ps.) First the talk's
example: a variable created in scope, five scheduled additions of 1..5, then 15 on every task.
Then a linear model fit asynchronously: each worker reads batches from its own per-worker
dataset and applies SGD updates straight to the variables on the ps task.
"""
import numpy as np

import dtensor

dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=1)
strategy = dtensor.ParameterServerStrategy(
    cluster_resolver=dtensor.TFConfigClusterResolver(),
    variable_partitioner=dtensor.MinSizePartitioner(min_shard_bytes=8, max_shards=2))
coordinator = dtensor.ClusterCoordinator(strategy)

# The talk's example.
with strategy.scope():
    v = dtensor.Variable(initial_value=0.0)


def add(x):
    v.assign_add(x)


for x in range(1, 6):
    coordinator.schedule(add, args=(float(x),))
coordinator.join()
dtensor.print_ordered(f"{strategy.task_type}:{strategy.task_index} reads "
                      f"{float(v.read_value())}\n")

# Asynchronous SGD on y = x @ w + b.
rng = np.random.default_rng(0)
w_true = rng.normal(size=(4, 1)).astype(np.float32)
with strategy.scope():
    w = dtensor.Variable(np.zeros((4, 1), np.float32))
    b = dtensor.Variable(np.zeros((1,), np.float32))


def dataset_fn():
    x = np.random.default_rng(dtensor.client_id()).normal(size=(256, 4)).astype(np.float32)
    y = x @ w_true + 0.5
    return dtensor.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=1).batch(32).repeat()


per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))


def train_step(iterator):
    x, y = next(iterator)
    err = x @ w.numpy() + b.numpy() - y
    w.assign_sub(0.1 * x.T @ err / len(x))
    b.assign_sub(0.1 * err.mean(axis=0))
    return float((err ** 2).mean())


losses = [coordinator.schedule(train_step, args=(per_worker_iterator,)) for _ in range(80)]
coordinator.join()
if dtensor.client_id() == 0:
    got = coordinator.fetch(losses)
    print(f"loss {got[0]:.4f} -> {got[-1]:.4f} over {len(got)} steps; w shards "
          f"{[s.shape for s in w.variables]}; |w - w_true| = "
          f"{float(np.abs(w.numpy() - w_true).max()):.3f}, b = {float(b.numpy()[0]):.3f}")
coordinator.shutdown()
dtensor.shutdown_accelerator_system()
