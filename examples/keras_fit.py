"""Keras-style training under each strategy: the same Sequential model, compiled and fit on
the same data, gives the same losses whichever strategy places it (the global batch of 10
does not divide by 6 replicas; the last batch holds 4 examples).

    python3 examples/keras_fit.py                       # one client, 6 CPU devices
    mpiexec.mpich -n 2 python3 examples/keras_fit.py    # 2 clients x 3 devices
"""
import os

import numpy as np

import dtensor
from dtensor import keras

dtensor.initialize_accelerator_system(
    "CPU", num_logical_cpu_devices=6 // int(os.environ.get("PMI_SIZE", "1")))

rng = np.random.default_rng(3)
x = rng.normal(size=(64, 5)).astype(np.float32)
y = (x[:, :3] @ np.array([1.0, -2.0, 0.5], np.float32)).reshape(-1, 1)
val = (x[:16], y[:16])

for cls in [dtensor.Strategy, dtensor.OneDeviceStrategy, dtensor.MirroredStrategy,
            dtensor.MultiWorkerMirroredStrategy, dtensor.CentralStorageStrategy]:
    keras.Layer._count = 0  # the same layer names (and seeds) in every run
    strategy = cls()
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(16, activation="tanh", input_shape=(5,)),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=dtensor.SGD(0.05, momentum=0.9), loss="mse", metrics=["mse"])
    if cls is dtensor.Strategy:
        model.summary()
    history = model.fit(x, y, batch_size=10, epochs=3, verbose=0, validation_data=val)
    losses = " ".join(f"{v:.6f}" for v in history.history["loss"])
    val_loss = history.history["val_loss"][-1]
    if dtensor.client_id() == 0:
        print(f"{cls.__name__:28} ({strategy.num_replicas_in_sync} replicas): "
              f"loss {losses}, val_loss {val_loss:.6f}")
dtensor.shutdown_accelerator_system()
