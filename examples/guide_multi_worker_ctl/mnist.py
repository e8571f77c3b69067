"""The tutorial's mnist.py (tensorflow.org/tutorials/distribute/multi_worker_with_ctl), with
`tf.` replaced by `dtensor.`; tf.keras.datasets.mnist.load_data() becomes load_data below
(synthetic data: nothing can be downloaded here)."""
import os
import dtensor
import numpy as np

def load_data():
  # dtensor.keras.datasets.mnist.load_data() replaced by synthetic data of the same dtypes
  # (no download here); N examples instead of 60000.
  n = int(os.environ.get("DTENSOR_EXAMPLE_TRAIN", 9000))
  rng = np.random.default_rng(2)
  x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
  y = rng.integers(0, 10, n, dtype=np.uint8)
  return (x, y), (x[:100], y[:100])

def mnist_dataset(batch_size):
  (x_train, y_train), _ = load_data()
  x_train = x_train / np.float32(255)
  y_train = y_train.astype(np.int64)
  train_dataset = dtensor.data.Dataset.from_tensor_slices(
      (x_train, y_train)).shuffle(60000)
  return train_dataset

def dataset_fn(global_batch_size, input_context):
  batch_size = input_context.get_per_replica_batch_size(global_batch_size)
  dataset = mnist_dataset(batch_size)
  dataset = dataset.shard(input_context.num_input_pipelines,
                          input_context.input_pipeline_id)
  dataset = dataset.batch(batch_size)
  return dataset

def build_cnn_model():
  regularizer = dtensor.keras.regularizers.L2(1e-5)
  return dtensor.keras.Sequential([
      dtensor.keras.Input(shape=(28, 28)),
      dtensor.keras.layers.Reshape(target_shape=(28, 28, 1)),
      dtensor.keras.layers.Conv2D(32, 3,
                             activation='relu',
                             kernel_regularizer=regularizer),
      dtensor.keras.layers.Flatten(),
      dtensor.keras.layers.Dense(128,
                            activation='relu',
                            kernel_regularizer=regularizer),
      dtensor.keras.layers.Dense(10, kernel_regularizer=regularizer)
  ])
