"""Keras-style models over DTensors: layers, Sequential and Model with compile, fit, evaluate,
predict and summary, losses, metrics, optimizers and callbacks (tf.keras's names).

Variables are DVariables created in the layout of the strategy in scope when a layer is
built (replicated on its mesh; the default strategy's otherwise). ``fit``/``evaluate``/
``predict`` run SPMD steps: each global batch (the same on every client) becomes one DTensor
split over the replicas (uneven when it does not divide), the loss is the sum of per-example
losses over the global batch divided by its size, the gradients (GradientTape, differentiated
by the C autodiff) come out all-reduced, and the optimizer updates the variables once. The
same model also runs inside ``strategy.run`` (per replica) for custom training loops.
Every method that computes is collective: every client calls it with the same data.
"""

# The modules by concern, each importing only the ones before it in this list: _base,
# _losses, _metrics, _layers, _callbacks, _models; this file re-exports their names.
# The optimizers and tensors this namespace has always held, from the package:
from .. import (Adam, AdamW, DTensor, DVariable, GradientTape, Layout, Optimizer, RMSprop, SGD,
                client_id, get_strategy, unpack)
from ._base import errors, softmax, stop_gradient
from ._losses import (BinaryCrossentropy, CategoricalCrossentropy, Loss, MeanAbsoluteError,
                      MeanSquaredError, SparseCategoricalCrossentropy, losses)
from ._metrics import (Accuracy, BinaryAccuracy, CategoricalAccuracy, Mean, MeanAbsoluteErrorMetric,
                       MeanSquaredErrorMetric, Metric, SparseCategoricalAccuracy, Sum, metrics)
from ._layers import (Activation, AveragePooling2D, Conv2D, Dense, Embedding, Flatten, Input,
                      InputLayer, KerasTensor, L1, L1L2, L2, Layer, LayerNormalization,
                      MaxPooling2D, Regularizer, Reshape, StringLookup, layers, regularizers)
from ._callbacks import (BackupAndRestore, CSVLogger, Callback, History, LambdaCallback,
                         LearningRateScheduler, ModelCheckpoint, TensorBoard, callbacks, optimizers)
from ._models import Model, Progbar, Sequential, load_model, models, utils

__all__ = ["Model", "Sequential", "layers", "losses", "metrics", "optimizers", "callbacks",
           "regularizers", "stop_gradient", "softmax", "Input", "models", "utils"]
