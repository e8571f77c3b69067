"""The parameter-server training tutorial (tensorflow.org/tutorials/distribute/
parameter_server_training) as a TensorFlow user types it, with `tf.` replaced by `dtensor.`
(README, "Where the guides' names live"). Every task of the cluster runs this program with its
TF_CONFIG, as the tutorial's "real cluster" section starts them (the tutorial's in-process
cluster of tf.distribute.Server objects and portpicker is what the launcher replaces):

    mpiexec.mpich -n 1 -env TF_CONFIG '{"cluster": {"chief": [...], "worker": [3 addresses],
        "ps": [2 addresses]}, "task": {"type": "chief", "index": 0}}' python3 \
        examples/guide_parameter_server_training.py : -n 1 -env TF_CONFIG '{... worker 0 ...}' ...

(a chief, the tutorial's 3 workers and 2 ps tasks; the chief coordinates). The tutorial's
checks of the embedding's two shards (one per ps task) need 2 ps tasks, as in TensorFlow.
Workers update the variables on the ps tasks asynchronously, so the accuracies differ from run
to run, as TensorFlow's do; bindings/python/tests/test_tutorials.py checks what does not.
"""
import multiprocessing
import os
import random

import dtensor

cluster_resolver = dtensor.distribute.cluster_resolver.TFConfigClusterResolver()
NUM_PS = len(cluster_resolver.cluster_spec().as_dict().get("ps", []))

variable_partitioner = (
    dtensor.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=(256 << 10),
        max_shards=NUM_PS))

strategy = dtensor.distribute.ParameterServerStrategy(
    cluster_resolver,
    variable_partitioner=variable_partitioner)

global_batch_size = 64

x = dtensor.random.uniform((10, 10))
y = dtensor.random.uniform((10,))

dataset = dtensor.data.Dataset.from_tensor_slices((x, y)).shuffle(10).repeat()
dataset = dataset.batch(global_batch_size)
dataset = dataset.prefetch(2)

with strategy.scope():
  model = dtensor.keras.models.Sequential([dtensor.keras.layers.Dense(10)])

  model.compile(dtensor.keras.optimizers.legacy.SGD(), loss="mse", steps_per_execution=10)

working_dir = "my_working_dir"  # the tutorial's /tmp/my_working_dir, in the current directory
log_dir = os.path.join(working_dir, "log")
ckpt_filepath = os.path.join(working_dir, "ckpt")
backup_dir = os.path.join(working_dir, "backup")

callbacks = [
    dtensor.keras.callbacks.TensorBoard(log_dir=log_dir),
    dtensor.keras.callbacks.ModelCheckpoint(filepath=ckpt_filepath),
    dtensor.keras.callbacks.BackupAndRestore(backup_dir=backup_dir),
]

model.fit(dataset, epochs=5, steps_per_epoch=20, callbacks=callbacks)

feature_vocab = [
    "avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"
]
label_vocab = ["yes", "no"]

with strategy.scope():
  feature_lookup_layer = dtensor.keras.layers.StringLookup(
      vocabulary=feature_vocab,
      mask_token=None)
  label_lookup_layer = dtensor.keras.layers.StringLookup(
      vocabulary=label_vocab,
      num_oov_indices=0,
      mask_token=None)

  raw_feature_input = dtensor.keras.layers.Input(
      shape=(3,),
      dtype=dtensor.string,
      name="feature")
  feature_id_input = feature_lookup_layer(raw_feature_input)
  feature_preprocess_stage = dtensor.keras.Model(
      {"features": raw_feature_input},
      feature_id_input)

  raw_label_input = dtensor.keras.layers.Input(
      shape=(1,),
      dtype=dtensor.string,
      name="label")
  label_id_input = label_lookup_layer(raw_label_input)

  label_preprocess_stage = dtensor.keras.Model(
      {"label": raw_label_input},
      label_id_input)

def feature_and_label_gen(num_examples=200):
  examples = {"features": [], "label": []}
  for _ in range(num_examples):
    features = random.sample(feature_vocab, 3)
    label = ["yes"] if "avenger" in features else ["no"]
    examples["features"].append(features)
    examples["label"].append(label)
  return examples

examples = feature_and_label_gen()

def dataset_fn(_):
  raw_dataset = dtensor.data.Dataset.from_tensor_slices(examples)

  train_dataset = raw_dataset.map(
      lambda x: (
          {"features": feature_preprocess_stage(x["features"])},
          label_preprocess_stage(x["label"])
      )).shuffle(200).batch(32).repeat()
  return train_dataset

with strategy.scope():
  model_input = dtensor.keras.layers.Input(
      shape=(3,), dtype=dtensor.int64, name="model_input")

  emb_layer = dtensor.keras.layers.Embedding(
      input_dim=len(feature_lookup_layer.get_vocabulary()), output_dim=16384)
  emb_output = dtensor.reduce_mean(emb_layer(model_input), axis=1)
  dense_output = dtensor.keras.layers.Dense(
      units=1, activation="sigmoid",
      kernel_regularizer=dtensor.keras.regularizers.L2(1e-4),
  )(emb_output)
  model = dtensor.keras.Model({"features": model_input}, dense_output)

  optimizer = dtensor.keras.optimizers.legacy.RMSprop(learning_rate=0.1)
  accuracy = dtensor.keras.metrics.Accuracy()

assert len(emb_layer.weights) == 2
assert emb_layer.weights[0].shape == (4, 16384)
assert emb_layer.weights[1].shape == (4, 16384)

print(emb_layer.weights[0].device)
print(emb_layer.weights[1].device)

@dtensor.function
def step_fn(iterator):

  def replica_fn(batch_data, labels):
    with dtensor.GradientTape() as tape:
      pred = model(batch_data, training=True)
      per_example_loss = dtensor.keras.losses.BinaryCrossentropy(
          reduction=dtensor.keras.losses.Reduction.NONE)(labels, pred)
      loss = dtensor.nn.compute_average_loss(per_example_loss)
      model_losses = model.losses
      if model_losses:
        loss += dtensor.nn.scale_regularization_loss(dtensor.add_n(model_losses))
    gradients = tape.gradient(loss, model.trainable_variables)

    optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    actual_pred = dtensor.cast(dtensor.greater(pred, 0.5), dtensor.int64)
    accuracy.update_state(labels, actual_pred)
    return loss

  batch_data, labels = next(iterator)
  losses = strategy.run(replica_fn, args=(batch_data, labels))
  return strategy.reduce(dtensor.distribute.ReduceOp.SUM, losses, axis=None)

coordinator = dtensor.distribute.coordinator.ClusterCoordinator(strategy)

@dtensor.function
def per_worker_dataset_fn():
  return strategy.distribute_datasets_from_function(dataset_fn)

per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
per_worker_iterator = iter(per_worker_dataset)

num_epochs = 4
steps_per_epoch = 5
for i in range(num_epochs):
  accuracy.reset_states()
  for _ in range(steps_per_epoch):
    coordinator.schedule(step_fn, args=(per_worker_iterator,))
  # Wait at epoch boundaries.
  coordinator.join()
  print("Finished epoch %d, accuracy is %f." % (i, accuracy.result().numpy()))

loss = coordinator.schedule(step_fn, args=(per_worker_iterator,))
print("Final loss is %f" % loss.fetch())

eval_dataset = dtensor.data.Dataset.from_tensor_slices(
    feature_and_label_gen(num_examples=16)).map(
          lambda x: (
              {"features": feature_preprocess_stage(x["features"])},
              label_preprocess_stage(x["label"])
          )).batch(8)

eval_accuracy = dtensor.keras.metrics.Accuracy()

for batch_data, labels in eval_dataset:
  pred = model(batch_data, training=False)
  actual_pred = dtensor.cast(dtensor.greater(pred, 0.5), dtensor.int64)
  eval_accuracy.update_state(labels, actual_pred)

print("Evaluation accuracy: %f" % eval_accuracy.result())

with strategy.scope():
  # Define the eval metric on parameter servers.
  eval_accuracy = dtensor.keras.metrics.Accuracy()

@dtensor.function
def eval_step(iterator):
  def replica_fn(batch_data, labels):
    pred = model(batch_data, training=False)
    actual_pred = dtensor.cast(dtensor.greater(pred, 0.5), dtensor.int64)
    eval_accuracy.update_state(labels, actual_pred)
  batch_data, labels = next(iterator)
  strategy.run(replica_fn, args=(batch_data, labels))

def eval_dataset_fn():
  return dtensor.data.Dataset.from_tensor_slices(
      feature_and_label_gen(num_examples=16)).map(
          lambda x: (
              {"features": feature_preprocess_stage(x["features"])},
              label_preprocess_stage(x["label"])
          )).shuffle(16).repeat().batch(8)

per_worker_eval_dataset = coordinator.create_per_worker_dataset(eval_dataset_fn)
per_worker_eval_iterator = iter(per_worker_eval_dataset)

eval_steps_per_epoch = 2
for _ in range(eval_steps_per_epoch):
  coordinator.schedule(eval_step, args=(per_worker_eval_iterator,))
coordinator.join()
print("Evaluation accuracy: %f" % eval_accuracy.result())
