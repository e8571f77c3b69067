"""The multi-worker custom training loop tutorial (tensorflow.org/tutorials/distribute/
multi_worker_with_ctl): its main.py as a TensorFlow user types it, with `tf.` replaced by
`dtensor.` (README, "Where the guides' names live"). Each worker is a client, started with its
TF_CONFIG as the tutorial starts its workers:

    TF_CONFIG='{"cluster": {"worker": ["localhost:12345"]}, "task": {"type": "worker",
        "index": 0}}' python3 examples/guide_multi_worker_ctl/main.py
    mpiexec.mpich -n 1 -env TF_CONFIG '{... "index": 0}' python3 .../main.py : \
                  -n 1 -env TF_CONFIG '{... "index": 1}' python3 .../main.py

(the cluster's two workers, as the tutorial's). The tutorial's sizes are the defaults;
DTENSOR_EXAMPLE_TRAIN (examples), _BATCH (per worker) and _STEPS (per epoch) shrink them for
the tests (bindings/python/tests/test_tutorials.py). Each worker writes its checkpoint where
the tutorial says (the chief's directory, or its own temporary one, deleted after): every file
holds the whole checkpoint.
"""
import os
import json
import dtensor
import mnist
from multiprocessing import util

per_worker_batch_size = int(os.environ.get("DTENSOR_EXAMPLE_BATCH", 64))
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])
global_batch_size = per_worker_batch_size * num_workers

num_epochs = 3
num_steps_per_epoch=int(os.environ.get("DTENSOR_EXAMPLE_STEPS", 70))

def _is_chief(task_type, task_id, cluster_spec):
  return (task_type is None
          or task_type == 'chief'
          or (task_type == 'worker'
              and task_id == 0
              and 'chief' not in cluster_spec.as_dict()))

def _get_temp_dir(dirpath, task_id):
  base_dirpath = 'workertemp_' + str(task_id)
  temp_dir = os.path.join(dirpath, base_dirpath)
  dtensor.io.gfile.makedirs(temp_dir)
  return temp_dir

def write_filepath(filepath, task_type, task_id, cluster_spec):
  dirpath = os.path.dirname(filepath)
  base = os.path.basename(filepath)
  if not _is_chief(task_type, task_id, cluster_spec):
    dirpath = _get_temp_dir(dirpath, task_id)
  return os.path.join(dirpath, base)

checkpoint_dir = os.path.join(util.get_temp_dir(), 'ckpt')

strategy = dtensor.distribute.MultiWorkerMirroredStrategy()

with strategy.scope():
  multi_worker_model = mnist.build_cnn_model()
  multi_worker_dataset = strategy.distribute_datasets_from_function(
      lambda input_context: mnist.dataset_fn(global_batch_size, input_context))
  optimizer = dtensor.keras.optimizers.RMSprop(learning_rate=0.001)
  train_accuracy = dtensor.keras.metrics.SparseCategoricalAccuracy(
      name='train_accuracy')

@dtensor.function
def train_step(iterator):
  """Training step function."""

  def step_fn(inputs):
    """Per-Replica step function."""
    x, y = inputs
    with dtensor.GradientTape() as tape:
      predictions = multi_worker_model(x, training=True)
      per_example_loss = dtensor.keras.losses.SparseCategoricalCrossentropy(
          from_logits=True,
          reduction=dtensor.keras.losses.Reduction.NONE)(y, predictions)
      loss = dtensor.nn.compute_average_loss(per_example_loss)
      model_losses = multi_worker_model.losses
      if model_losses:
        loss += dtensor.nn.scale_regularization_loss(dtensor.add_n(model_losses))

    grads = tape.gradient(loss, multi_worker_model.trainable_variables)
    optimizer.apply_gradients(
        zip(grads, multi_worker_model.trainable_variables))
    train_accuracy.update_state(y, predictions)

    return loss

  per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
  return strategy.reduce(
      dtensor.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

epoch = dtensor.Variable(
    initial_value=dtensor.constant(0, dtype=dtensor.dtypes.int64), name='epoch')
step_in_epoch = dtensor.Variable(
    initial_value=dtensor.constant(0, dtype=dtensor.dtypes.int64),
    name='step_in_epoch')

task_type, task_id, cluster_spec = (strategy.cluster_resolver.task_type,
                                    strategy.cluster_resolver.task_id,
                                    strategy.cluster_resolver.cluster_spec())

checkpoint = dtensor.train.Checkpoint(
    model=multi_worker_model, epoch=epoch, step_in_epoch=step_in_epoch)

write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id,
                                      cluster_spec)
checkpoint_manager = dtensor.train.CheckpointManager(
    checkpoint, directory=write_checkpoint_dir, max_to_keep=1)

latest_checkpoint = dtensor.train.latest_checkpoint(checkpoint_dir)
if latest_checkpoint:
  checkpoint.restore(latest_checkpoint)

while epoch.numpy() < num_epochs:
  iterator = iter(multi_worker_dataset)
  total_loss = 0.0
  num_batches = 0

  while step_in_epoch.numpy() < num_steps_per_epoch:
    total_loss += train_step(iterator)
    num_batches += 1
    step_in_epoch.assign_add(1)

  train_loss = total_loss / num_batches
  print('Epoch: %d, accuracy: %f, train_loss: %f.'
                %(epoch.numpy(), train_accuracy.result(), train_loss))

  train_accuracy.reset_states()

  checkpoint_manager.save()
  if not _is_chief(task_type, task_id, cluster_spec):
    dtensor.io.gfile.rmtree(write_checkpoint_dir)

  epoch.assign_add(1)
  step_in_epoch.assign(0)
