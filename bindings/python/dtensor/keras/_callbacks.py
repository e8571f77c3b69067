"""tf.keras.callbacks (History, CSVLogger, ModelCheckpoint, TensorBoard, BackupAndRestore, ...)
and tf.keras.optimizers."""

import csv as _csv
import inspect as _inspect
import os as _os
import struct as _struct
import time as _time
import types as _types

from .. import Adam, AdamW, Optimizer, RMSprop, SGD, client_id
from ._base import _d, _train, errors

# ---- callbacks ------------------------------------------------------------------------------


class Callback:
    """Hooks fit calls with the epoch's or batch's logs (a dict of floats)."""

    def set_model(self, model):
        self.model = model

    def on_train_begin(self, logs=None):
        pass

    def on_train_end(self, logs=None):
        pass

    def on_epoch_begin(self, epoch, logs=None):
        pass

    def on_epoch_end(self, epoch, logs=None):
        pass

    def on_train_batch_begin(self, batch, logs=None):
        pass

    def on_train_batch_end(self, batch, logs=None):
        pass


class History(Callback):
    """``history[name]``: the value of each log at the end of every epoch."""

    def on_train_begin(self, logs=None):
        self.history = {}
        self.epoch = []

    def on_epoch_end(self, epoch, logs=None):
        self.epoch.append(epoch)
        for k, v in (logs or {}).items():
            self.history.setdefault(k, []).append(v)


class LambdaCallback(Callback):
    def __init__(self, on_epoch_begin=None, on_epoch_end=None, on_train_batch_begin=None,
                 on_train_batch_end=None, on_train_begin=None, on_train_end=None):
        for name, fn in list(locals().items()):
            if name != "self" and fn is not None:
                setattr(self, name, fn)


class CSVLogger(Callback):
    """One row per epoch (client 0 writes the file)."""

    def __init__(self, filename, separator=",", append=False):
        self.filename, self.separator, self.append = filename, separator, append
        self._header = None

    def on_epoch_end(self, epoch, logs=None):
        if client_id() != 0:
            return
        logs = logs or {}
        keys = ["epoch"] + sorted(logs)
        mode = "a" if self.append or self._header else "w"
        with open(self.filename, mode, newline="") as f:
            w = _csv.writer(f, delimiter=self.separator)
            if self._header is None and not (self.append and f.tell()):
                w.writerow(keys)
            self._header = keys
            w.writerow([epoch] + [logs[k] for k in sorted(logs)])


class ModelCheckpoint(Callback):
    """``model.save_weights(filepath)`` at the end of each epoch (``filepath`` may contain
    ``{epoch}`` and log names, as Keras's); ``save_best_only`` keeps the best ``monitor``.
    With ``save_weights_only=False`` the optimizer's state is saved too (a dtensor checkpoint
    of ``model`` and ``optimizer``, read back with ``dtensor.train.Checkpoint``)."""

    def __init__(self, filepath, monitor="loss", save_best_only=False, mode="min",
                 save_weights_only=True, verbose=0, save_freq="epoch"):
        self.filepath, self.monitor, self.save_best_only = filepath, monitor, save_best_only
        self.save_weights_only = save_weights_only
        self.mode = mode
        self.best = None

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        value = logs.get(self.monitor)
        if self.save_best_only:
            if value is None:
                raise ValueError(f"ModelCheckpoint: monitor {self.monitor!r} is not among the "
                                 f"logs {sorted(logs)}")
            better = self.best is None or (value < self.best if self.mode == "min"
                                           else value > self.best)
            if not better:
                return
            self.best = value
        path = self.filepath.format(epoch=epoch + 1, **logs)
        if _os.path.dirname(path):
            _os.makedirs(_os.path.dirname(path), exist_ok=True)
        if self.save_weights_only or self.model.optimizer is None:
            self.model.save_weights(path)
        else:  # the training state too: resume with Checkpoint(model=, optimizer=).read
            _train().Checkpoint(model=self.model, optimizer=self.model.optimizer).write(path)


class _Progress(Callback):
    """The progress line of verbose fit, on client 0."""

    def __init__(self, epochs, steps):
        self.epochs, self.steps = epochs, steps

    def on_epoch_begin(self, epoch, logs=None):
        self.start = _time.perf_counter()
        if client_id() == 0:
            print(f"Epoch {epoch + 1}/{self.epochs}", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        if client_id() == 0:
            took = _time.perf_counter() - self.start
            parts = [f"{k}: {v:.4f}" for k, v in (logs or {}).items()]
            print(f"{self.steps}/{self.steps} - {took:.2f}s - " + " - ".join(parts), flush=True)


class LearningRateScheduler(Callback):
    """Sets the optimizer's learning rate at the start of each epoch to ``schedule(epoch)`` or
    ``schedule(epoch, lr)`` (Keras's); the epoch's logs get ``learning_rate``."""

    def __init__(self, schedule, verbose=0):
        if not callable(schedule):
            raise TypeError(f"LearningRateScheduler: schedule must be callable, got "
                            f"{type(schedule).__name__}")
        self.schedule, self.verbose = schedule, verbose

    def on_epoch_begin(self, epoch, logs=None):
        opt = self.model.optimizer
        try:
            two = len(_inspect.signature(self.schedule).parameters) >= 2
        except (TypeError, ValueError):
            two = True
        lr = self.schedule(epoch, float(opt.learning_rate)) if two else self.schedule(epoch)
        opt.learning_rate = float(lr)
        if self.verbose and client_id() == 0:
            print(f"\nEpoch {epoch + 1}: LearningRateScheduler setting learning rate to "
                  f"{float(lr)}.", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = float(self.model.optimizer.learning_rate)


def _masked_crc32c(data):
    """TFRecord's masked CRC-32C (Castagnoli) of bytes."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


_CRC32C = []
for _n in range(256):
    _c32 = _n
    for _ in range(8):
        _c32 = (_c32 >> 1) ^ 0x82F63B78 if _c32 & 1 else _c32 >> 1
    _CRC32C.append(_c32)


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, wire, payload):
    return _varint(number << 3 | wire) + payload


def _bytes_field(number, data):
    return _field(number, 2, _varint(len(data)) + data)


class _EventFile:
    """A TensorBoard event file (TFRecord of tensorflow.Event protos) with scalar summaries."""

    def __init__(self, logdir):
        _os.makedirs(logdir, exist_ok=True)
        self.path = _os.path.join(logdir, f"events.out.tfevents.{int(_time.time())}."
                                          f"{_os.uname().nodename}.{_os.getpid()}.dtensor")
        self._write(_field(1, 1, _struct.pack("<d", _time.time())) +
                    _bytes_field(3, b"brain.Event:2"))  # file_version

    def _write(self, event):
        header = _struct.pack("<Q", len(event))
        with open(self.path, "ab") as f:
            f.write(header + _struct.pack("<I", _masked_crc32c(header)) + event +
                    _struct.pack("<I", _masked_crc32c(event)))

    def scalar(self, tag, value, step):
        value_msg = _bytes_field(1, tag.encode()) + _field(2, 5, _struct.pack("<f", value))
        summary = _bytes_field(1, value_msg)
        self._write(_field(1, 1, _struct.pack("<d", _time.time())) +
                    _field(2, 0, _varint(int(step))) + _bytes_field(5, summary))


class TensorBoard(Callback):
    """Writes the epoch logs as TensorBoard scalars (``epoch_loss``, ``epoch_accuracy``, ...)
    to ``log_dir/train`` and ``log_dir/validation`` (client 0 writes)."""

    def __init__(self, log_dir="logs", **kwargs):
        self.log_dir = _os.fspath(log_dir)
        self._writers = {}

    def _writer(self, kind):
        if kind not in self._writers:
            self._writers[kind] = _EventFile(_os.path.join(self.log_dir, kind))
        return self._writers[kind]

    def on_epoch_end(self, epoch, logs=None):
        if client_id() != 0:
            return
        for k, v in (logs or {}).items():
            kind, name = ("validation", k[4:]) if k.startswith("val_") else ("train", k)
            self._writer(kind).scalar(f"epoch_{name}", float(v), epoch)


class BackupAndRestore(Callback):
    """Backs the model and its optimizer up at the end of each epoch to ``backup_dir``; a fit
    interrupted and started again resumes from the epoch after the last backup. The backup is
    deleted when fit ends (``delete_checkpoint``)."""

    def __init__(self, backup_dir, save_freq="epoch", delete_checkpoint=True):
        if save_freq != "epoch":
            raise errors().UnimplementedError(f"BackupAndRestore: save_freq {save_freq!r} "
                                              f"(only 'epoch')")
        self.backup_dir = _os.fspath(backup_dir)
        self.delete_checkpoint = delete_checkpoint

    def _path(self):
        return _os.path.join(self.backup_dir, "backup.h5")

    def _checkpoint(self):
        return _train().Checkpoint(model=self.model, optimizer=self.model.optimizer)

    def on_train_begin(self, logs=None):
        if _os.path.isfile(self._path()):
            ck = self._checkpoint()
            ck.read(self._path())
            self.model._initial_epoch = int(ck.metadata.get("epoch", -1)) + 1

    def on_epoch_end(self, epoch, logs=None):
        _os.makedirs(self.backup_dir, exist_ok=True)
        ck = self._checkpoint()
        ck.metadata = {"epoch": epoch}
        ck.write(self._path())

    def on_train_end(self, logs=None):
        if self.delete_checkpoint:
            _d().barrier()
            if client_id() == 0:
                import shutil  # noqa: PLC0415
                shutil.rmtree(self.backup_dir, ignore_errors=True)
            _d().barrier()  # gone for every client when fit returns


callbacks = _types.SimpleNamespace(Callback=Callback, History=History,
                                   LambdaCallback=LambdaCallback, CSVLogger=CSVLogger,
                                   ModelCheckpoint=ModelCheckpoint,
                                   LearningRateScheduler=LearningRateScheduler,
                                   TensorBoard=TensorBoard, BackupAndRestore=BackupAndRestore)

optimizers = _types.SimpleNamespace(Optimizer=Optimizer, SGD=SGD, Adam=Adam, AdamW=AdamW,
                                    RMSprop=RMSprop)
# TensorFlow 2.11-2.15's tf.keras.optimizers.legacy: the same optimizers (Keras semantics)
optimizers.legacy = _types.SimpleNamespace(Optimizer=Optimizer, SGD=SGD, Adam=Adam,
                                           RMSprop=RMSprop)


def _get_optimizer(o):
    if isinstance(o, Optimizer):
        return o
    table = {"sgd": SGD, "adam": Adam, "adamw": AdamW, "rmsprop": RMSprop}
    if str(o).lower() not in table:
        raise ValueError(f"unknown optimizer {o!r}; one of {sorted(table)}")
    return table[str(o).lower()]()
