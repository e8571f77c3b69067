"""The DTensor ML tutorial (tensorflow.org/tutorials/distribute/dtensor_ml_tutorial) as a
TensorFlow user types it, with `tf.` replaced by `dtensor.` (README, "Where the guides' names
live"; `from dtensor.experimental import dtensor` is this package):

    python3 examples/guide_dtensor_ml.py
    mpiexec.mpich -n 2 python3 examples/guide_dtensor_ml.py

Substituted, as nothing can be downloaded here: the IMDB reviews and the TextVectorization
layer that makes their tf-idf vectors become synthetic tf-idf batches of the same shape and
dtypes (64 x 1200 float32 features, int64 labels); the tutorial's last section (saving with
tf.saved_model) is left out. The MLP trains with data parallelism, then model and data
parallelism, then spatial parallelism, each model restoring the previous one's checkpoint: the
losses and accuracies the progress bars print are one SGD run, which
bindings/python/tests/test_tutorials.py recomputes in numpy. At -n 2 each client packs its own
devices' components (repack_local_tensor's local_device_locations) and the clients' temporary
checkpoint directories differ: each gets the whole checkpoint.
"""
import tempfile
import numpy as np
import dtensor
from dtensor.experimental import dtensor

print('TensorFlow version:', dtensor.__version__)

def configure_virtual_cpus(ncpu):
  phy_devices = dtensor.config.list_physical_devices('CPU')
  dtensor.config.set_logical_device_configuration(phy_devices[0], [
        dtensor.config.LogicalDeviceConfiguration(),
    ] * ncpu)

configure_virtual_cpus(8 // dtensor.num_clients())  # 8 devices in all, each client its share
DEVICES = [f'CPU:{i}' for i in range(8)]

dtensor.config.list_logical_devices('CPU')

# train_data_vec: batches of 64 (tf-idf features (64, 1200) float32, label (64,) int64)
rng = np.random.default_rng(3)
_X = rng.random((640, 1200)).astype(np.float32) * (rng.random((640, 1200)) < 0.05)
_Y = (_X[:, :600].sum(1) > _X[:, 600:].sum(1)).astype(np.int64)
train_data_vec = dtensor.data.Dataset.from_tensor_slices((_X, _Y)).batch(64)

class Dense(dtensor.Module):

  def __init__(self, input_size, output_size,
               init_seed, weight_layout, activation=None):
    super().__init__()

    random_normal_initializer = dtensor.function(dtensor.random.stateless_normal)

    self.weight = dtensor.DVariable(
        dtensor.call_with_layout(
            random_normal_initializer, weight_layout,
            shape=[input_size, output_size],
            seed=init_seed
            ))
    if activation is None:
      activation = lambda x:x
    self.activation = activation

    # bias is sharded the same way as the last axis of weight.
    bias_layout = weight_layout.delete([0])

    self.bias = dtensor.DVariable(
        dtensor.call_with_layout(dtensor.zeros, bias_layout, [output_size]))

  def __call__(self, x):
    y = dtensor.matmul(x, self.weight) + self.bias
    y = self.activation(y)

    return y

class BatchNorm(dtensor.Module):

  def __init__(self):
    super().__init__()

  def __call__(self, x, training=True):
    if not training:
      pass
    mean, variance = dtensor.nn.moments(x, axes=[0])
    return dtensor.nn.batch_normalization(x, mean, variance, 0.0, 1.0, 1e-5)

from typing import Tuple

class MLP(dtensor.Module):

  def __init__(self, dense_layouts: Tuple[dtensor.Layout, dtensor.Layout]):
    super().__init__()

    self.dense1 = Dense(
        1200, 48, (1, 2), dense_layouts[0], activation=dtensor.nn.relu)
    self.bn = BatchNorm()
    self.dense2 = Dense(48, 2, (3, 4), dense_layouts[1])

  def __call__(self, x):
    y = x
    y = self.dense1(y)
    y = self.bn(y)
    y = self.dense2(y)
    return y

class MLPStricter(dtensor.Module):

  def __init__(self, mesh, input_mesh_dim, inner_mesh_dim1, output_mesh_dim):
    super().__init__()

    self.dense1 = Dense(
        1200, 48, (1, 2), dtensor.Layout([input_mesh_dim, inner_mesh_dim1], mesh),
        activation=dtensor.nn.relu)
    self.bn = BatchNorm()
    self.dense2 = Dense(48, 2, (3, 4), dtensor.Layout([inner_mesh_dim1, output_mesh_dim], mesh))


  def __call__(self, x):
    y = x
    y = self.dense1(y)
    y = self.bn(y)
    y = self.dense2(y)
    return y

WORLD = dtensor.create_mesh([("world", 8)], devices=DEVICES)

model = MLP([dtensor.Layout.replicated(WORLD, rank=2),
             dtensor.Layout.replicated(WORLD, rank=2)])

sample_x, sample_y = train_data_vec.take(1).get_single_element()
sample_x = dtensor.copy_to_mesh(sample_x, dtensor.Layout.replicated(WORLD, rank=2))
print(model(sample_x))

def repack_local_tensor(x, layout):
  """Repacks a local Tensor-like to a DTensor with layout.

  This function assumes a single-client application.
  """
  x = dtensor.convert_to_tensor(x)
  sharded_dims = []

  queue = [x]
  for axis, dim in enumerate(layout.sharding_specs):
    if dim == dtensor.UNSHARDED:
      continue
    num_splits = layout.shape[axis]
    queue = dtensor.nest.map_structure(lambda x: dtensor.split(x, num_splits, axis=axis), queue)
    sharded_dims.append(dim)

  components = []
  for locations in layout.mesh.local_device_locations():
    t = queue[0]
    for dim in sharded_dims:
      split_index = locations[dim]  # Only valid on single-client mesh.
      t = t[split_index]
    components.append(t)

  return dtensor.pack(components, layout)

mesh = dtensor.create_mesh([("batch", 8)], devices=DEVICES)

model = MLP([dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh),
             dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh),])

def repack_batch(x, y, mesh):
  x = repack_local_tensor(x, layout=dtensor.Layout(['batch', dtensor.UNSHARDED], mesh))
  y = repack_local_tensor(y, layout=dtensor.Layout(['batch'], mesh))
  return x, y

sample_x, sample_y = train_data_vec.take(1).get_single_element()
sample_x, sample_y = repack_batch(sample_x, sample_y, mesh)

print('x', sample_x[:, 0])
print('y', sample_y)

@dtensor.function
def train_step(model, x, y, learning_rate=dtensor.constant(1e-4)):
  with dtensor.GradientTape() as tape:
    logits = model(x)
    loss = dtensor.reduce_sum(
        dtensor.nn.sparse_softmax_cross_entropy_with_logits(
            logits=logits, labels=y))
  parameters = model.trainable_variables
  gradients = tape.gradient(loss, parameters)
  for parameter, parameter_gradient in zip(parameters, gradients):
    parameter.assign_sub(learning_rate * parameter_gradient)

  accuracy = 1.0 - dtensor.reduce_sum(dtensor.cast(dtensor.argmax(logits, axis=-1, output_type=dtensor.int64) != y, dtensor.float32)) / x.shape[0]
  loss_per_sample = loss / len(x)
  return {'loss': loss_per_sample, 'accuracy': accuracy}

CHECKPOINT_DIR = tempfile.mkdtemp()

def start_checkpoint_manager(model):
  ckpt = dtensor.train.Checkpoint(root=model)
  manager = dtensor.train.CheckpointManager(ckpt, CHECKPOINT_DIR, max_to_keep=3)

  if manager.latest_checkpoint:
    print("Restoring a checkpoint")
    ckpt.restore(manager.latest_checkpoint).assert_consumed()
  else:
    print("New training")
  return manager

num_epochs = 2
manager = start_checkpoint_manager(model)

for epoch in range(num_epochs):
  step = 0
  pbar = dtensor.keras.utils.Progbar(target=int(train_data_vec.cardinality()), stateful_metrics=[])
  metrics = {'epoch': epoch}
  for x,y in train_data_vec:

    x, y = repack_batch(x, y, mesh)

    metrics.update(train_step(model, x, y, 1e-2))

    pbar.update(step, values=metrics.items(), finalize=False)
    step += 1
  manager.save()
  pbar.update(step, values=metrics.items(), finalize=True)

mesh = dtensor.create_mesh([("batch", 4), ("model", 2)], devices=DEVICES)
model = MLP([dtensor.Layout([dtensor.UNSHARDED, "model"], mesh),
             dtensor.Layout(["model", dtensor.UNSHARDED], mesh)])

def repack_batch(x, y, mesh):
  x = repack_local_tensor(x, layout=dtensor.Layout(['batch', dtensor.UNSHARDED], mesh))
  y = repack_local_tensor(y, layout=dtensor.Layout(['batch'], mesh))
  return x, y

num_epochs = 2
manager = start_checkpoint_manager(model)

for epoch in range(num_epochs):
  step = 0
  pbar = dtensor.keras.utils.Progbar(target=int(train_data_vec.cardinality()))
  metrics = {'epoch': epoch}
  for x,y in train_data_vec:
    x, y = repack_batch(x, y, mesh)
    metrics.update(train_step(model, x, y, 1e-2))
    pbar.update(step, values=metrics.items(), finalize=False)
    step += 1
  manager.save()
  pbar.update(step, values=metrics.items(), finalize=True)

mesh = dtensor.create_mesh([("batch", 2), ("feature", 2), ("model", 2)], devices=DEVICES)
model = MLP([dtensor.Layout(["feature", "model"], mesh),
             dtensor.Layout(["model", dtensor.UNSHARDED], mesh)])

def repack_batch_for_spt(x, y, mesh):
    x = repack_local_tensor(x, layout=dtensor.Layout(["batch", 'feature'], mesh))
    y = repack_local_tensor(y, layout=dtensor.Layout(["batch"], mesh))
    return x, y

num_epochs = 2

manager = start_checkpoint_manager(model)
for epoch in range(num_epochs):
  step = 0
  metrics = {'epoch': epoch}
  pbar = dtensor.keras.utils.Progbar(target=int(train_data_vec.cardinality()))

  for x, y in train_data_vec:
    x, y = repack_batch_for_spt(x, y, mesh)
    metrics.update(train_step(model, x, y, 1e-2))

    pbar.update(step, values=metrics.items(), finalize=False)
    step += 1
  manager.save()
  pbar.update(step, values=metrics.items(), finalize=True)
