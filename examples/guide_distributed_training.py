"""The tf.distribute guide (tensorflow.org/guide/distributed_training) as a TensorFlow user types
it, with `tf.` replaced by `dtensor.` (README, "Where the guides' names live") and the guide's
two GPUs replaced by two CPU devices per client:

    python3 examples/guide_distributed_training.py
    mpiexec.mpich -n 2 python3 examples/guide_distributed_training.py

Lines marked "check:" are additions: they print the initial weights and the training history,
so that bindings/python/tests/test_guides.py can recompute every loss in numpy with Keras's
update rule. Every client prints (MirroredStrategy is each client's own, as in TensorFlow).
"""
import json
import os

import dtensor

# The guide's machine has two GPUs; here two CPU devices stand for them.
dtensor.config.set_logical_device_configuration(
    dtensor.config.list_physical_devices("CPU")[0],
    [dtensor.config.LogicalDeviceConfiguration()] * 2)

# ---- Types of strategies --------------------------------------------------------------------
mirrored_strategy = dtensor.distribute.MirroredStrategy()
mirrored_strategy = dtensor.distribute.MirroredStrategy(devices=["/cpu:0", "/cpu:1"])
mirrored_strategy = dtensor.distribute.MirroredStrategy(
    cross_device_ops=dtensor.distribute.HierarchicalCopyAllReduce())

strategy = dtensor.distribute.MultiWorkerMirroredStrategy()
communication_options = dtensor.distribute.experimental.CommunicationOptions(
    implementation=dtensor.distribute.experimental.CommunicationImplementation.NCCL)
strategy = dtensor.distribute.MultiWorkerMirroredStrategy(
    communication_options=communication_options)

central_storage_strategy = dtensor.distribute.experimental.CentralStorageStrategy()

default_strategy = dtensor.distribute.get_strategy()

# In optimizer or other library code
# Get currently active strategy
strategy = dtensor.distribute.get_strategy()
print("check: reduce", strategy.reduce("SUM", 1., axis=None))  # reduce some values

if dtensor.config.list_physical_devices('GPU'):
    strategy = dtensor.distribute.MirroredStrategy()
else:  # Use the Default Strategy
    strategy = dtensor.distribute.get_strategy()

with strategy.scope():
    # Do something interesting
    print(dtensor.Variable(1.))

strategy = dtensor.distribute.OneDeviceStrategy(device="/cpu:0")

# ---- Keras Model.fit ------------------------------------------------------------------------
mirrored_strategy = dtensor.distribute.MirroredStrategy()

with mirrored_strategy.scope():
    model = dtensor.keras.Sequential([
        dtensor.keras.layers.Dense(1, input_shape=(1,),
                                   kernel_regularizer=dtensor.keras.regularizers.L2(1e-4))])
    model.compile(loss='mse', optimizer='sgd')
print("check: fit initial", json.dumps([w.tolist() for w in model.get_weights()]))

dataset = dtensor.data.Dataset.from_tensors(([1.], [1.])).repeat(100).batch(10)
history = model.fit(dataset, epochs=2)
print("check: fit dataset", json.dumps(history.history["loss"]))
result = model.evaluate(dataset)
print("check: evaluate", json.dumps(result))

import numpy as np  # noqa: E402 (the guide imports it here)

inputs, targets = np.ones((100, 1)), np.ones((100, 1))
history = model.fit(inputs, targets, epochs=2, batch_size=10)
print("check: fit numpy", json.dumps(history.history["loss"]))

print("check: replicas", mirrored_strategy.num_replicas_in_sync)

# Compute a global batch size using a number of replicas.
BATCH_SIZE_PER_REPLICA = 5
global_batch_size = (BATCH_SIZE_PER_REPLICA *
                     mirrored_strategy.num_replicas_in_sync)
dataset = dtensor.data.Dataset.from_tensors(([1.], [1.])).repeat(100)
dataset = dataset.batch(global_batch_size)

LEARNING_RATES_BY_BATCH_SIZE = {5: 0.1, 10: 0.15, 20: 0.175}
learning_rate = LEARNING_RATES_BY_BATCH_SIZE[global_batch_size]

# ---- Custom training loops ------------------------------------------------------------------
with mirrored_strategy.scope():
    model = dtensor.keras.Sequential([
        dtensor.keras.layers.Dense(1, input_shape=(1,),
                                   kernel_regularizer=dtensor.keras.regularizers.L2(1e-4))])
    optimizer = dtensor.keras.optimizers.SGD()
print("check: loop initial", json.dumps([w.tolist() for w in model.get_weights()]))

dataset = dtensor.data.Dataset.from_tensors(([1.], [1.])).repeat(1000).batch(
    global_batch_size)
dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)

# Sets `reduction=NONE` to leave it to dtensor.nn.compute_average_loss() below.
loss_object = dtensor.keras.losses.BinaryCrossentropy(
    from_logits=True,
    reduction=dtensor.keras.losses.Reduction.NONE)


def train_step(inputs):
    features, labels = inputs

    with dtensor.GradientTape() as tape:
        predictions = model(features, training=True)
        per_example_loss = loss_object(labels, predictions)
        loss = dtensor.nn.compute_average_loss(per_example_loss)
        model_losses = model.losses
        if model_losses:
            loss += dtensor.nn.scale_regularization_loss(dtensor.add_n(model_losses))

    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss


@dtensor.function
def distributed_train_step(dist_inputs):
    per_replica_losses = mirrored_strategy.run(train_step, args=(dist_inputs,))
    return mirrored_strategy.reduce(dtensor.distribute.ReduceOp.SUM, per_replica_losses,
                                    axis=None)


for dist_inputs in dist_dataset:
    print(distributed_train_step(dist_inputs))

iterator = iter(dist_dataset)
for _ in range(10):
    print(distributed_train_step(next(iterator)))

# ---- Setting up the TF_CONFIG environment variable ---------------------------------------
os.environ["TF_CONFIG"] = json.dumps({
    "cluster": {
        "worker": ["host1:port", "host2:port", "host3:port"],
        "ps": ["host4:port", "host5:port"]
    },
    "task": {"type": "worker", "index": 1}
})
print("check: TF_CONFIG", dtensor.distribute.cluster_resolver.TFConfigClusterResolver()
      .cluster_spec().as_dict())
