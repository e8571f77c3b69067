"""The custom training tutorial (tensorflow.org/tutorials/distribute/custom_training) as a
TensorFlow user types it, with `tf.` replaced by `dtensor.` (README, "Where the guides' names
live") and the GPUs by two CPU devices per client:

    python3 examples/guide_custom_training.py
    mpiexec.mpich -n 2 python3 examples/guide_custom_training.py

Substituted, as nothing can be downloaded here: Fashion MNIST becomes synthetic 28 x 28 uint8
images of ten learnable classes (load_data below). The tutorial's sizes are the defaults;
DTENSOR_EXAMPLE_TRAIN, _TEST (images), _BATCH (per replica) and _EPOCHS shrink them for the
tests (bindings/python/tests/test_tutorials.py), which check what TensorFlow guarantees here:
the losses fall, the model restored from the first checkpoint without a strategy has the test
accuracy printed when it was saved, and the three training loops train one model on.
MirroredStrategy is each client's own, as in TensorFlow: every client trains on its own.
"""
import os

import numpy as np

import dtensor

phy = dtensor.config.list_physical_devices('CPU')
dtensor.config.set_logical_device_configuration(phy[0], [dtensor.config.LogicalDeviceConfiguration()] * 2)
print(dtensor.__version__)

# fashion_mnist.load_data(): synthetic 28 x 28 uint8 images whose label (0-9) is the band of
# rows holding their brightest stripe, so that the CNN has something to learn
def load_data(n_train, n_test, seed=0):
  rng = np.random.default_rng(seed)
  def make(n):
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.integers(0, 96, (n, 28, 28)).astype(np.uint8)
    for i, k in enumerate(labels):
      images[i, 2 + 2 * k:4 + 2 * k, :] += 40
    return images, labels
  return make(n_train), make(n_test)

(train_images, train_labels), (test_images, test_labels) = load_data(
    int(os.environ.get("DTENSOR_EXAMPLE_TRAIN", 12800)),
    int(os.environ.get("DTENSOR_EXAMPLE_TEST", 2000)))

train_images = train_images[..., None]
test_images = test_images[..., None]
train_images = train_images / np.float32(255)
test_images = test_images / np.float32(255)

strategy = dtensor.distribute.MirroredStrategy()
print('Number of devices: {}'.format(strategy.num_replicas_in_sync))
BUFFER_SIZE = len(train_images)
BATCH_SIZE_PER_REPLICA = int(os.environ.get("DTENSOR_EXAMPLE_BATCH", 64))
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
EPOCHS = int(os.environ.get("DTENSOR_EXAMPLE_EPOCHS", 10))

train_dataset = dtensor.data.Dataset.from_tensor_slices((train_images, train_labels)).shuffle(BUFFER_SIZE).batch(GLOBAL_BATCH_SIZE)
test_dataset = dtensor.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(GLOBAL_BATCH_SIZE)
train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)

def create_model():
  regularizer = dtensor.keras.regularizers.L2(1e-5)
  model = dtensor.keras.Sequential([
      dtensor.keras.layers.Conv2D(32, 3,
                             activation='relu',
                             kernel_regularizer=regularizer),
      dtensor.keras.layers.MaxPooling2D(),
      dtensor.keras.layers.Conv2D(64, 3,
                             activation='relu',
                             kernel_regularizer=regularizer),
      dtensor.keras.layers.MaxPooling2D(),
      dtensor.keras.layers.Flatten(),
      dtensor.keras.layers.Dense(64,
                            activation='relu',
                            kernel_regularizer=regularizer),
      dtensor.keras.layers.Dense(10, kernel_regularizer=regularizer)
    ])
  return model

checkpoint_dir = './training_checkpoints'
checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt")

with strategy.scope():
  loss_object = dtensor.keras.losses.SparseCategoricalCrossentropy(
      from_logits=True,
      reduction=dtensor.keras.losses.Reduction.NONE)
  def compute_loss(labels, predictions, model_losses):
    per_example_loss = loss_object(labels, predictions)
    loss = dtensor.nn.compute_average_loss(per_example_loss)
    if model_losses:
      loss += dtensor.nn.scale_regularization_loss(dtensor.add_n(model_losses))
    return loss

with strategy.scope():
  test_loss = dtensor.keras.metrics.Mean(name='test_loss')
  train_accuracy = dtensor.keras.metrics.SparseCategoricalAccuracy(
      name='train_accuracy')
  test_accuracy = dtensor.keras.metrics.SparseCategoricalAccuracy(
      name='test_accuracy')

with strategy.scope():
  model = create_model()
  optimizer = dtensor.keras.optimizers.Adam(learning_rate=0.001)
  checkpoint = dtensor.train.Checkpoint(optimizer=optimizer, model=model)

def train_step(inputs):
  images, labels = inputs
  with dtensor.GradientTape() as tape:
    predictions = model(images, training=True)
    loss = compute_loss(labels, predictions, model.losses)
  gradients = tape.gradient(loss, model.trainable_variables)
  optimizer.apply_gradients(zip(gradients, model.trainable_variables))
  train_accuracy.update_state(labels, predictions)
  return loss

def test_step(inputs):
  images, labels = inputs
  predictions = model(images, training=False)
  t_loss = loss_object(labels, predictions)
  test_loss.update_state(t_loss)
  test_accuracy.update_state(labels, predictions)

@dtensor.function
def distributed_train_step(dataset_inputs):
  per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
  return strategy.reduce(dtensor.distribute.ReduceOp.SUM, per_replica_losses,
                         axis=None)

@dtensor.function
def distributed_test_step(dataset_inputs):
  return strategy.run(test_step, args=(dataset_inputs,))

for epoch in range(EPOCHS):
  total_loss = 0.0
  num_batches = 0
  for x in train_dist_dataset:
    total_loss += distributed_train_step(x)
    num_batches += 1
  train_loss = total_loss / num_batches
  for x in test_dist_dataset:
    distributed_test_step(x)
  if epoch % 2 == 0:
    checkpoint.save(checkpoint_prefix)
  template = ("Epoch {}, Loss: {}, Accuracy: {}, Test Loss: {}, "
              "Test Accuracy: {}")
  print(template.format(epoch + 1, train_loss,
                         train_accuracy.result() * 100, test_loss.result(),
                         test_accuracy.result() * 100))
  test_loss.reset_states()
  train_accuracy.reset_states()
  test_accuracy.reset_states()

eval_accuracy = dtensor.keras.metrics.SparseCategoricalAccuracy(
      name='eval_accuracy')
new_model = create_model()
new_optimizer = dtensor.keras.optimizers.Adam()
test_dataset = dtensor.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(GLOBAL_BATCH_SIZE)

@dtensor.function
def eval_step(images, labels):
  predictions = new_model(images, training=False)
  eval_accuracy(labels, predictions)

checkpoint = dtensor.train.Checkpoint(optimizer=new_optimizer, model=new_model)
checkpoint.restore(dtensor.train.latest_checkpoint(checkpoint_dir))
for images, labels in test_dataset:
  eval_step(images, labels)
print('Accuracy after restoring the saved model without strategy: {}'.format(
    eval_accuracy.result() * 100))

for _ in range(EPOCHS):
  total_loss = 0.0
  num_batches = 0
  train_iter = iter(train_dist_dataset)
  for _ in range(10):
    total_loss += distributed_train_step(next(train_iter))
    num_batches += 1
  average_train_loss = total_loss / num_batches
  template = ("Epoch {}, Loss: {}, Accuracy: {}")
  print(template.format(epoch + 1, average_train_loss, train_accuracy.result() * 100))
  train_accuracy.reset_states()

@dtensor.function
def distributed_train_epoch(dataset):
  total_loss = 0.0
  num_batches = 0
  for x in dataset:
    per_replica_losses = strategy.run(train_step, args=(x,))
    total_loss += strategy.reduce(
      dtensor.distribute.ReduceOp.SUM, per_replica_losses, axis=None)
    num_batches += 1
  return total_loss / dtensor.cast(num_batches, dtype=dtensor.float32)

for epoch in range(EPOCHS):
  train_loss = distributed_train_epoch(train_dist_dataset)
  template = ("Epoch {}, Loss: {}, Accuracy: {}")
  print(template.format(epoch + 1, train_loss, train_accuracy.result() * 100))
  train_accuracy.reset_states()
