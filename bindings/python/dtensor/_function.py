"""tf.function: a Python function traced into a C program of ops and run as one."""

from . import _dtensor as _c
from . import _replicas, _tape, errors
from ._dtypes import _code
from ._tensor import DTensor
from ._ops import _result, _state, _tracing
from ._variables import DVariable

# ---- functions (tf.function) -----------------------------------------------------------------


class _Trace:
    """The function being recorded on this thread: the concrete tensors and the variables its
    ops use become inputs of their own (captures), bound at every run, as tf.function captures
    them: a tensor by value, a variable by reference (its value when the function runs)."""

    def __init__(self, f):
        self.f = f
        self.bound = {}  # id(concrete DTensor or DVariable) -> (it, its symbolic input)
        self.captures = []  # () -> the concrete DTensor to bind, in input order

    def _input(self, layout, dtype, shape):
        t = DTensor(_c.function_input(self.f, layout.mesh._handle, layout._text, _code(dtype),
                                      list(shape)), layout)
        return t

    def symbolic(self, t):
        """An operand as this function's tensor: a concrete one is captured (by value)."""
        if t._local_shapes is None:
            return t
        hit = self.bound.get(id(t))
        if hit is None:
            hit = self.bound[id(t)] = (t, self._input(t.layout, t.dtype, t.shape))
            self.captures.append(lambda t=t: t)
        return hit[1]

    def variable(self, v):
        """A read of a variable: an input bound to its value at each run."""
        hit = self.bound.get(id(v))
        if hit is None:
            hit = self.bound[id(v)] = (v, self._input(v.layout, v.dtype, v.shape))
            self.captures.append(v.read_value)
        return hit[1]


def _flatten_outputs(out):
    """A traced function's result as (its tensors, a rebuild of the structure from their
    values): DTensors and variables (read) in lists, tuples and dicts; None when anything else
    is in it."""
    if isinstance(out, (DTensor, DVariable)):
        return [out], lambda vals: vals[0]
    if isinstance(out, (list, tuple)):
        parts = [_flatten_outputs(v) for v in out]
        if any(p is None for p in parts):
            return None
        flat, sizes = [], []
        for f, _ in parts:
            flat.extend(f)
            sizes.append(len(f))

        def rebuild(vals, kind=type(out)):
            items, at = [], 0
            for (_, r), n in zip(parts, sizes):
                items.append(r(vals[at:at + n]))
                at += n
            return kind(items) if kind in (list, tuple) else kind(*items)
        return flat, rebuild
    if isinstance(out, dict):
        keys = list(out)
        inner = _flatten_outputs([out[k] for k in keys])
        if inner is None:
            return None
        return inner[0], lambda vals: dict(zip(keys, inner[1](vals)))
    return None


class Function:
    """A traced function (tf.function): the first call with a new input signature (layouts,
    dtypes, shapes) records the ops, propagates layouts and expands once; later calls only
    run. Concrete tensors the function uses are captured by value, variables it reads by
    reference, as TensorFlow captures them. A function that a trace cannot record (one that
    assigns variables, reads values on the host, calls strategy.run or a GradientTape, or
    returns something other than tensors) runs as the Python function it wraps for that
    signature; the first such call runs its Python code twice (the trace, then the run)."""

    def __init__(self, fn):
        self._fn = fn
        self._traces = {}
        self._eager = set()  # signatures whose trace failed: they run as Python
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", "function")

    @staticmethod
    def _signature(args):
        return tuple((a.layout._text, id(a.layout.mesh._handle), str(a.dtype), a.shape)
                     for a in args)

    def _trace(self, args):
        """The trace of this signature, or None when the function cannot be traced."""
        sig = self._signature(args)
        if sig in self._traces:
            return self._traces[sig]
        f = _c.function_begin()
        trace = _Trace(f)
        _state.trace = trace
        try:
            inputs = [trace._input(a.layout, a.dtype, a.shape) for a in args]
            flat = _flatten_outputs(self._fn(*inputs))
            outs = [trace.variable(o) if isinstance(o, DVariable) else trace.symbolic(o)
                    for o in flat[0]] if flat else None
        except Exception:  # noqa: BLE001 (the eager run raises a real error again)
            outs = None
        finally:
            _state.trace = None
        if not outs:
            f.free()
            return None
        _c.function_end(f, [o._handle for o in outs])
        trace = (f, len(outs), flat[1], [o.layout.mesh for o in outs], trace.captures)
        self._traces[sig] = trace
        return trace

    def __call__(self, *args, **kwargs):
        # traced when it has arguments and every one is a DTensor; otherwise (strategy.run
        # inside, PerReplica, Python or no arguments), under a GradientTape (which records the
        # ops one by one) and inside another trace (which records its ops) it runs as the
        # Python function it wraps
        if kwargs or not args or _tape._tapes() or _replicas.current() is not None or \
                _tracing() is not None or not all(isinstance(a, DTensor) for a in args):
            return self._fn(*args, **kwargs)
        sig = self._signature(args)
        trace = None if sig in self._eager else self._trace(args)
        if trace is None:
            self._eager.add(sig)
            return self._fn(*args)
        f, n, rebuild, meshes, captures = trace
        bound = list(args) + [c() for c in captures]
        results = [_result(h, m) for h, m in zip(_c.function_run(f, [a._handle for a in bound],
                                                                 n), meshes)]
        return rebuild(results)

    def _traced(self, args, what):
        trace = self._trace(args)
        if trace is None:
            raise errors.UnimplementedError(
                f"{what}: {self.__name__} cannot be traced (it assigns variables, reads values "
                f"on the host or returns something other than tensors); it runs as Python")
        return trace

    def program(self, *args):
        """The expanded program for these arguments' signature as text, with its totals:
        (text, multiplies summed over devices, collectives, largest bytes a device sends)."""
        return _c.function_program(self._traced(args, "program")[0])


def function(fn=None):
    """Decorator like tf.function: ``@dtensor.function``."""
    return Function(fn) if fn is not None else Function
