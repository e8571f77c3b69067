"""The Keras distributed training tutorial (tensorflow.org/tutorials/distribute/keras) as a
TensorFlow user types it, with `tf.` replaced by `dtensor.` (README, "Where the guides' names
live") and the GPUs by two CPU devices per client:

    python3 examples/guide_keras.py
    mpiexec.mpich -n 2 python3 examples/guide_keras.py

Substituted, as nothing can be downloaded here: tensorflow_datasets' MNIST becomes synthetic
(uint8 image, int64 label) pairs of ten learnable classes with the same info.splits; the
notebook's shell and TensorBoard magics are left out (the TensorBoard callback writes its event
files to ./logs all the same). The tutorial's sizes are the defaults; DTENSOR_EXAMPLE_TRAIN,
_TEST (examples), _BATCH (per replica) and _EPOCHS shrink them for the tests
(bindings/python/tests/test_tutorials.py), which check the learning rates the schedule
printed, one checkpoint per epoch, and that the restored, the saved-and-loaded and the
replicated-and-loaded models evaluate alike.
"""
import os
from types import SimpleNamespace

import numpy as np

import dtensor

phy = dtensor.config.list_physical_devices('CPU')
dtensor.config.set_logical_device_configuration(phy[0], [dtensor.config.LogicalDeviceConfiguration()] * 2)
print(dtensor.__version__)

# tfds.load(name='mnist', with_info=True, as_supervised=True): synthetic (image uint8 28 x 28 x 1,
# label int64) pairs of ten learnable classes (the column band of a bright stripe)
def synthetic_mnist(n, seed):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 10, n)
  images = rng.integers(0, 96, (n, 28, 28, 1)).astype(np.uint8)
  for i, k in enumerate(labels):
    images[i, :, 2 + 2 * k:4 + 2 * k, 0] += 40
  return dtensor.data.Dataset.from_tensor_slices((images, labels))

num_train = int(os.environ.get("DTENSOR_EXAMPLE_TRAIN", 60000))
num_test = int(os.environ.get("DTENSOR_EXAMPLE_TEST", 10000))
datasets = {'train': synthetic_mnist(num_train, 1), 'test': synthetic_mnist(num_test, 2)}
info = SimpleNamespace(splits={'train': SimpleNamespace(num_examples=num_train),
                               'test': SimpleNamespace(num_examples=num_test)})

mnist_train, mnist_test = datasets['train'], datasets['test']

strategy = dtensor.distribute.MirroredStrategy()
print('Number of devices: {}'.format(strategy.num_replicas_in_sync))
num_train_examples = info.splits['train'].num_examples
num_test_examples = info.splits['test'].num_examples
BUFFER_SIZE = 10000
BATCH_SIZE_PER_REPLICA = int(os.environ.get("DTENSOR_EXAMPLE_BATCH", 64))
BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync

def scale(image, label):
  image = dtensor.cast(image, dtensor.float32)
  image /= 255
  return image, label

train_dataset = mnist_train.map(scale).cache().shuffle(BUFFER_SIZE).batch(BATCH_SIZE)
eval_dataset = mnist_test.map(scale).batch(BATCH_SIZE)

with strategy.scope():
  model = dtensor.keras.Sequential([
      dtensor.keras.layers.Conv2D(32, 3, activation='relu', input_shape=(28, 28, 1)),
      dtensor.keras.layers.MaxPooling2D(),
      dtensor.keras.layers.Flatten(),
      dtensor.keras.layers.Dense(64, activation='relu'),
      dtensor.keras.layers.Dense(10)
  ])
  model.compile(loss=dtensor.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                optimizer=dtensor.keras.optimizers.Adam(learning_rate=0.001),
                metrics=['accuracy'])

checkpoint_dir = './training_checkpoints'
checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt_{epoch:04d}.weights.h5")

def decay(epoch):
  if epoch < 3:
    return 1e-3
  elif epoch >= 3 and epoch < 7:
    return 1e-4
  else:
    return 1e-5

class PrintLR(dtensor.keras.callbacks.Callback):
  def on_epoch_end(self, epoch, logs=None):
    print('\nLearning rate for epoch {} is {}'.format(epoch + 1, model.optimizer.learning_rate.numpy()))

callbacks = [
    dtensor.keras.callbacks.TensorBoard(log_dir='./logs'),
    dtensor.keras.callbacks.ModelCheckpoint(filepath=checkpoint_prefix,
                                       save_weights_only=True),
    dtensor.keras.callbacks.LearningRateScheduler(decay),
    PrintLR()
]
EPOCHS = int(os.environ.get("DTENSOR_EXAMPLE_EPOCHS", 12))
model.fit(train_dataset, epochs=EPOCHS, callbacks=callbacks)

import pathlib
latest_checkpoint = sorted(pathlib.Path(checkpoint_dir).glob('*'))[-1]
model.load_weights(latest_checkpoint)
eval_loss, eval_acc = model.evaluate(eval_dataset)
print('Eval loss: {}, Eval accuracy: {}'.format(eval_loss, eval_acc))

path = 'my_model.keras'
model.save(path)
unreplicated_model = dtensor.keras.models.load_model(path)
unreplicated_model.compile(
    loss=dtensor.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    optimizer=dtensor.keras.optimizers.Adam(),
    metrics=['accuracy'])
eval_loss, eval_acc = unreplicated_model.evaluate(eval_dataset)
print('Eval loss: {}, Eval Accuracy: {}'.format(eval_loss, eval_acc))

with strategy.scope():
  replicated_model = dtensor.keras.models.load_model(path)
  replicated_model.compile(loss=dtensor.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                           optimizer=dtensor.keras.optimizers.Adam(),
                           metrics=['accuracy'])
  eval_loss, eval_acc = replicated_model.evaluate(eval_dataset)
  print ('Eval loss: {}, Eval Accuracy: {}'.format(eval_loss, eval_acc))
