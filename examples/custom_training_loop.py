"""The tf.distribute guide's custom training loop, as written there, with dtensor's names.

    python3 examples/custom_training_loop.py                  # 6 CPU devices in one process
    mpiexec.mpich -n 2 python3 examples/custom_training_loop.py   # 2 clients x 3 devices

STRATEGY=mirrored|multi_worker_mirrored|one_device|default picks the strategy (the default:
multi_worker_mirrored, whose replicas are every device of every client). A 3-class
classifier on synthetic data; the global batch (10) does not divide by the 6 replicas, and the
last batch (4 of 64 examples) leaves replicas empty: each replica's loss is scaled by the
global batch, so every strategy prints the same losses. As in the guide, the model and the
optimizer are checkpointed every 2 epochs (tf.train.Checkpoint's save, here one HDF5 file per
save under CHECKPOINT_DIR) and the latest checkpoint is restored into a new model at the end.
"""
import os
import shutil
import tempfile

import numpy as np

import dtensor
from dtensor import keras

DEVICES = 6
dtensor.initialize_accelerator_system(
    "CPU", num_logical_cpu_devices=DEVICES // int(os.environ.get("PMI_SIZE", "1")))

STRATEGIES = {"mirrored": dtensor.MirroredStrategy,
              "multi_worker_mirrored": dtensor.MultiWorkerMirroredStrategy,
              "one_device": dtensor.OneDeviceStrategy, "default": dtensor.Strategy}
strategy = STRATEGIES[os.environ.get("STRATEGY", "multi_worker_mirrored")]()

# Data: every client builds the same dataset; distribution keeps each client's rows.
rng = np.random.default_rng(0)
features = rng.normal(size=(64, 4)).astype(np.float32)
labels = (features @ rng.normal(size=(4, 3))).argmax(axis=1).astype(np.int32)
GLOBAL_BATCH_SIZE = 10
EPOCHS = 3
dataset = dtensor.data.Dataset.from_tensor_slices((features, labels)).batch(GLOBAL_BATCH_SIZE)
dist_dataset = strategy.experimental_distribute_dataset(dataset)

with strategy.scope():
    model = keras.Sequential([keras.layers.Dense(16, activation="relu", input_shape=(4,)),
                              keras.layers.Dense(3)])
    optimizer = dtensor.SGD(learning_rate=0.5)
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                             reduction="none")

    def compute_loss(labels, predictions):
        per_example_loss = loss_object(labels, predictions)
        return dtensor.compute_average_loss(per_example_loss,
                                            global_batch_size=GLOBAL_BATCH_SIZE)

    train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")


# Checkpoints (the guide's checkpoint_prefix), in a directory every client sees.
checkpoint_dir = os.environ.get("CHECKPOINT_DIR") or \
    os.path.join(tempfile.gettempdir(), "dtensor_custom_loop_checkpoints")
checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt")
if dtensor.client_id() == 0:
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    os.makedirs(checkpoint_dir)
dtensor.barrier()
checkpoint = dtensor.train.Checkpoint(optimizer=optimizer, model=model)


def train_step(inputs):
    features, labels = inputs
    with dtensor.GradientTape() as tape:
        predictions = model(features)
        loss = compute_loss(labels, predictions)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    train_accuracy.update_state(labels, predictions)
    return loss


@dtensor.function
def distributed_train_step(dataset_inputs):
    per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
    return strategy.reduce(dtensor.ReduceOp.SUM, per_replica_losses, axis=None)


for epoch in range(EPOCHS):
    total_loss = 0.0
    num_batches = 0
    for x in dist_dataset:
        total_loss += float(distributed_train_step(x))
        num_batches += 1
    train_loss = total_loss / num_batches
    accuracy = train_accuracy.result()
    if dtensor.client_id() == 0:
        print(f"Epoch {epoch + 1}, Loss: {train_loss:.6f}, Accuracy: {accuracy * 100:.2f}")
    train_accuracy.reset_state()
    if epoch % 2 == 0 or epoch == EPOCHS - 1:
        checkpoint.save(checkpoint_prefix)

# Restore the latest checkpoint into a new model (in any strategy, mesh or client count) and
# evaluate it: the same predictions as the trained model's.
with strategy.scope():
    new_model = keras.Sequential([keras.layers.Dense(16, activation="relu", input_shape=(4,)),
                                  keras.layers.Dense(3)])
    new_optimizer = dtensor.SGD(learning_rate=0.5)
latest = dtensor.train.latest_checkpoint(checkpoint_dir)
dtensor.train.Checkpoint(optimizer=new_optimizer, model=new_model).restore(latest)
logits = new_model.predict(features, batch_size=GLOBAL_BATCH_SIZE)
same = np.array_equal(logits, model.predict(features, batch_size=GLOBAL_BATCH_SIZE))
accuracy = float((logits.argmax(axis=1) == labels).mean())
if dtensor.client_id() == 0:
    print(f"Restored {os.path.basename(latest)}: accuracy {accuracy * 100:.2f}, "
          f"{'the same' if same else 'NOT the same'} predictions as the trained model")
dtensor.shutdown_accelerator_system()
