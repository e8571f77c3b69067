"""MultiWorkerMirroredStrategy with TF_CONFIG, as the multi-worker tutorial runs it: every
worker runs this same program with its own TF_CONFIG (here each rank of mpiexec writes its
own, task index = rank), builds the model in the strategy's scope and calls Keras fit.

    mpiexec.mpich -n 2 python3 examples/multi_worker.py

Each worker feeds the whole global batch from the same dataset; the strategy keeps each
worker's rows. Prints the loss of each epoch (client 0), the same for any worker count.
"""
import json
import os

import numpy as np

import dtensor
from dtensor import keras

workers = int(os.environ.get("PMI_SIZE", "1"))
rank = int(os.environ.get("PMI_RANK", "0"))
os.environ["TF_CONFIG"] = json.dumps({
    "cluster": {"worker": [f"localhost:{12345 + i}" for i in range(workers)]},
    "task": {"type": "worker", "index": rank}})

dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=6 // workers)
strategy = dtensor.MultiWorkerMirroredStrategy()
resolver = strategy.cluster_resolver
assert (resolver.task_type, resolver.task_id) == ("worker", rank), resolver

rng = np.random.default_rng(0)
x = rng.normal(size=(60, 8)).astype(np.float32)
y = (x @ rng.normal(size=(8, 1)) > 0).astype(np.float32)

with strategy.scope():
    model = keras.Sequential([keras.layers.Dense(16, activation="relu", input_shape=(8,)),
                              keras.layers.Dense(1)])
    model.compile(optimizer=dtensor.Adam(0.01),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=["accuracy"])
history = model.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0)
if dtensor.client_id() == 0:
    for epoch, (loss, acc) in enumerate(zip(history.history["loss"],
                                            history.history["accuracy"])):
        print(f"epoch {epoch + 1}: loss {loss:.6f} accuracy {acc:.4f}")
dtensor.shutdown_accelerator_system()
