"""TensorFlow's error classes (tf.errors), each a subclass of :class:`dtensor.DTensorError`, so
that ``except dtensor.errors.InvalidArgumentError`` and ``except dtensor.DTensorError`` both
catch what the library raises.

A failing C call raises the class of its status:

====================================================  ======================================
C status                                              class
====================================================  ======================================
DT_ERR_ARG, DT_ERR_SHAPE, DT_ERR_DTYPE, DT_ERR_LAYOUT,  InvalidArgumentError (also a ValueError)
DT_ERR_MESH, DT_ERR_MISMATCH
DT_ERR_UNSUPPORTED                                    UnimplementedError
DT_ERR_STATE                                          FailedPreconditionError
DT_ERR_NOMEM                                          ResourceExhaustedError
DT_ERR_COMM                                           UnavailableError
DT_ERR_DEVICE                                         InternalError
DT_ERR_IO                                             NotFoundError
====================================================  ======================================

``numpy()`` of a sharded tensor raises UnimplementedError, as TensorFlow's DTensor does.
"""

from ._dtensor import DTensorError

__all__ = ["OpError", "CancelledError", "UnknownError", "InvalidArgumentError",
           "DeadlineExceededError", "NotFoundError", "AlreadyExistsError",
           "PermissionDeniedError", "UnauthenticatedError", "ResourceExhaustedError",
           "FailedPreconditionError", "AbortedError", "OutOfRangeError", "UnimplementedError",
           "InternalError", "UnavailableError", "DataLossError"]


class OpError(DTensorError):
    """tf.errors.OpError: the base of TensorFlow's error classes. ``message`` is the text;
    ``status`` and ``code`` are the C status when a C call failed (None otherwise)."""

    status = None
    code = None

    @property
    def message(self):
        return str(self)


class CancelledError(OpError):
    pass


class UnknownError(OpError):
    pass


class InvalidArgumentError(OpError, ValueError):
    """A bad argument: also a ValueError, as the package's own argument checks raise."""


class DeadlineExceededError(OpError):
    pass


class NotFoundError(OpError):
    pass


class AlreadyExistsError(OpError):
    pass


class PermissionDeniedError(OpError):
    pass


class UnauthenticatedError(OpError):
    pass


class ResourceExhaustedError(OpError):
    pass


class FailedPreconditionError(OpError):
    pass


class AbortedError(OpError):
    pass


class OutOfRangeError(OpError):
    pass


class UnimplementedError(OpError):
    pass


class InternalError(OpError):
    pass


class UnavailableError(OpError):
    pass


class DataLossError(OpError):
    pass


#: The class each C status raises (the extension reads this table).
BY_STATUS = {
    "DT_ERR_ARG": InvalidArgumentError,
    "DT_ERR_SHAPE": InvalidArgumentError,
    "DT_ERR_DTYPE": InvalidArgumentError,
    "DT_ERR_LAYOUT": InvalidArgumentError,
    "DT_ERR_MESH": InvalidArgumentError,
    "DT_ERR_MISMATCH": InvalidArgumentError,
    "DT_ERR_UNSUPPORTED": UnimplementedError,
    "DT_ERR_STATE": FailedPreconditionError,
    "DT_ERR_NOMEM": ResourceExhaustedError,
    "DT_ERR_COMM": UnavailableError,
    "DT_ERR_DEVICE": InternalError,
    "DT_ERR_IO": NotFoundError,
}
