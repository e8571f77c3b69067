"""tf.GradientTape over dtensor's ops.

While a tape is active on a thread, every op of that thread (``_ops._op``: matmul, the
elementwise and reduction ops, transpose, reshape, slice, concat, relayout, copy_to_mesh and
the ops built on them) is recorded with its operands, and every read of a trainable variable
is noted. ``gradient(target, sources)`` does not differentiate in Python: it replays the
recorded ops that ``target`` depends on into a traced C function (``dt_function_begin``), asks
the C autodiff for its gradient function (``dt_function_gradient``, the same rules as
``dtensor.function(...).gradient``) and runs it on the recorded values. Gradients come out in
their source's layout, all-reduced by the expansion where the forward pass sharded the batch.
The expanded gradient program is cached by the recorded structure (ops, attributes, layouts,
shapes, dtypes and wiring), so a training step that repeats records, but never re-expands.
"""

import threading

from . import _dtensor as _c
from . import errors

_local = threading.local()
_cache = {}  # structure signature -> (forward function, gradient function)
_CACHE_MAX = 256


def _tapes():
    return getattr(_local, "tapes", ())


def record(op, inputs, mesh_handle, text, attrs, out):
    """Called by every op (_ops._op) after it ran: note it on this thread's active tapes."""
    for tape in _tapes():
        if tape._recording:
            tape._ops.append((op, tuple(inputs), mesh_handle, text, tuple(attrs), out))


def note_read(variable, tensor):
    """Called for each read of a variable: the value read stands for the variable."""
    for tape in _tapes():
        if tape._recording and (variable.trainable and tape._watch_accessed or
                                id(variable) in tape._watched):
            tape._reads[id(tensor)] = variable
            tape._keep.append(tensor)
            tape._variables.setdefault(id(variable), variable)


class _Node:
    """A recorded value that no DTensor holds (the product with output_gradients)."""


class GradientTape:
    """Records ops for automatic differentiation (tf.GradientTape)::

        with dtensor.GradientTape() as tape:
            loss = dtensor.reduce_sum(model(x))
        grads = tape.gradient(loss, model.trainable_variables)

    Trainable variables read inside the block are watched; DTensors are watched with
    ``watch``. A tape answers one ``gradient`` call unless ``persistent=True``."""

    def __init__(self, persistent=False, watch_accessed_variables=True):
        self._persistent = bool(persistent)
        self._watch_accessed = bool(watch_accessed_variables)
        self._ops = []
        self._reads = {}  # id(value read) -> variable
        self._variables = {}  # id(variable) -> variable, in first-read order
        self._watched = {}  # id(tensor or variable) -> it
        self._keep = []  # values read (their ids stay unique while the tape lives)
        self._recording = False
        self._used = False

    def __enter__(self):
        _local.tapes = _tapes() + (self,)
        self._recording = True
        return self

    def __exit__(self, *exc):
        _local.tapes = tuple(t for t in _tapes() if t is not self)
        self._recording = False
        return False

    def watch(self, tensor):
        """Watch a DTensor, a variable, or a (nested) list of them."""
        for t in _flatten(tensor):
            self._watched[id(t)] = t
            if hasattr(t, "_handle") and type(t).__name__ == "DVariable":
                self._variables.setdefault(id(t), t)

    def watched_variables(self):
        return tuple(self._variables.values())

    def reset(self):
        """Forget everything recorded so far."""
        self._ops.clear()
        self._reads.clear()
        self._keep.clear()
        self._variables.clear()

    class _Paused:
        def __init__(self, tape):
            self.tape = tape

        def __enter__(self):
            self.was, self.tape._recording = self.tape._recording, False

        def __exit__(self, *exc):
            self.tape._recording = self.was
            return False

    def stop_recording(self):
        """A context in which ops are not recorded."""
        return GradientTape._Paused(self)

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients="none"):
        """d(sum of target) / d(source) for each source (same nesting as ``sources``); None
        for a source the target does not depend on (zeros with
        ``unconnected_gradients="zero"``). ``output_gradients``: a DTensor of target's shape
        weighting target's elements (the vector of a vector-Jacobian product)."""
        from . import DTensor, DVariable, zeros_like
        if self._used and not self._persistent:
            raise errors.FailedPreconditionError(
                "GradientTape.gradient can only be called once on a non-persistent tape "
                "(create it with persistent=True)")
        self._used = True
        mode = str(getattr(unconnected_gradients, "value", unconnected_gradients)).lower()
        if mode not in ("none", "zero"):
            raise ValueError(f"unconnected_gradients must be 'none' or 'zero', got "
                             f"{unconnected_gradients!r}")
        flat, rebuild = _flatten_with(sources)
        for s in flat:
            if not isinstance(s, (DTensor, DVariable)):
                raise TypeError(f"GradientTape.gradient: a source is a {type(s).__name__}, "
                                f"not a DTensor or DVariable")
        if isinstance(target, DVariable):
            target = target.read_value()
        if not isinstance(target, DTensor):
            raise TypeError(f"GradientTape.gradient: the target is a {type(target).__name__}, "
                            f"not a DTensor")
        ops = list(self._ops)
        target_key = target
        if output_gradients is not None:
            og = output_gradients
            if not isinstance(og, DTensor) or og.shape != target.shape:
                raise ValueError(f"output_gradients must be a DTensor of the target's shape "
                                 f"{target.shape}")
            product, total = _Node(), _Node()
            ops.append(("binary", (target, og), None, None, (_c.BINARY_MUL,), product))
            ops.append(("reduce", (product,), None, None, (_c.REDUCE_SUM, [], 0), total))
            target_key = total
        grads = self._replay(ops, target_key, flat)
        out = []
        for s, g in zip(flat, grads):
            if g is None and mode == "zero":
                g = zeros_like(s.read_value() if isinstance(s, DVariable) else s)
            out.append(g)
        return rebuild(out)

    def _replay(self, ops, target, sources):
        """The gradients of target with respect to sources (None where unconnected)."""
        from . import DVariable
        from ._ops import _result
        # a source variable is every value read from it; a source tensor is itself (even when
        # an op produced it: the graph is cut there)
        source_of = {}
        for k, s in enumerate(sources):
            if isinstance(s, DVariable):
                for key, var in self._reads.items():
                    if var is s:
                        source_of[key] = k
            elif id(s) in self._watched or any(o is s for *_, o in ops):
                source_of[id(s)] = k
        producer = {id(e[5]): i for i, e in enumerate(ops)}
        needed, stack = set(), [id(target)]
        while stack:
            key = stack.pop()
            i = producer.get(key)
            if i is None or i in needed or key in source_of:
                continue
            needed.add(i)
            stack.extend(id(x) for x in ops[i][1])
        order = sorted(needed)
        # leaves: one symbolic input per source and per other value the ops read
        slot, leaves, leaf_values = {}, [], []  # id -> input slot; slot -> group key
        group_slot = {}
        for i in order:
            for x in ops[i][1]:
                key = id(x)
                if key in slot or (key in producer and producer[key] in needed and
                                   key not in source_of):
                    continue
                group = ("source", source_of[key]) if key in source_of else ("value", key)
                if group not in group_slot:
                    group_slot[group] = len(leaves)
                    leaves.append(group)
                    leaf_values.append(x)
                slot[key] = group_slot[group]
        if id(target) not in producer or producer[id(target)] not in needed:
            # the target was not computed by a recorded op: only itself has a gradient
            return [_ones(target) if id(s) == id(target) else None for s in sources]
        wrt = [group_slot[("source", k)] for k in range(len(sources))
               if ("source", k) in group_slot]
        if not wrt:
            return [None] * len(sources)
        position = {id(ops[i][5]): n for n, i in enumerate(order)}

        def ref(x):
            return ("in", slot[id(x)]) if id(x) in slot else ("op", position[id(x)])

        signature = (
            tuple((v.layout._text, id(v.layout.mesh._handle), str(v.dtype), v.shape)
                  for v in leaf_values),
            tuple((ops[i][0], ops[i][3], None if ops[i][2] is None else id(ops[i][2]),
                   _freeze(ops[i][4]), tuple(ref(x) for x in ops[i][1])) for i in order),
            tuple(wrt))
        entry = _cache.get(signature)
        if entry is None:
            entry = self._build(ops, order, leaf_values, slot, position, wrt)
            if len(_cache) >= _CACHE_MAX:
                _cache.pop(next(iter(_cache)))
            _cache[signature] = entry
        _, g, meshes = entry
        handles = _c.function_run(g, [v._handle for v in leaf_values], 1 + len(wrt))
        handles[0].free()
        results = [_result(h, m) for h, m in zip(handles[1:], meshes)]
        by_source = {}
        for n, s in enumerate(wrt):
            by_source[leaves[s][1]] = results[n]
        return [by_source.get(k) for k in range(len(sources))]

    @staticmethod
    def _build(ops, order, leaf_values, slot, position, wrt):
        from ._dtypes import _code
        f = _c.function_begin()
        symbols = []
        try:
            inputs = [_c.function_input(f, v.layout.mesh._handle, v.layout._text, _code(v.dtype),
                                        list(v.shape)) for v in leaf_values]
            symbols.extend(inputs)
            outs = []
            for i in order:
                op, args, mesh_handle, text, attrs, _ = ops[i]
                handles = [inputs[slot[id(x)]] if id(x) in slot else outs[position[id(x)]]
                           for x in args]
                outs.append(_c.apply(op, handles, mesh_handle, text, False, *attrs))
            symbols.extend(outs)
            _c.function_end(f, [outs[-1]])
            g = _c.function_gradient(f, 0, wrt)
        except BaseException:
            f.free()
            raise
        finally:
            for h in symbols:
                h.free()
        return f, g, [leaf_values[s].layout.mesh for s in wrt]


def _ones(t):
    from . import ones_like
    return ones_like(t)


def _freeze(x):
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(v) for v in x)
    return x


def _flatten(x):
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _flatten(v)]
    if isinstance(x, dict):
        return [y for k in sorted(x) for y in _flatten(x[k])]
    return [x]


def _flatten_with(x):
    """The leaves of a nested list/tuple/dict and a function rebuilding the nesting."""
    if isinstance(x, (list, tuple)):
        parts = [_flatten_with(v) for v in x]
        counts = [len(p[0]) for p in parts]

        def rebuild(values, parts=parts, counts=counts, kind=type(x)):
            out, at = [], 0
            for (_, r), n in zip(parts, counts):
                out.append(r(values[at:at + n]))
                at += n
            return out if kind is list else tuple(out)
        return [y for p in parts for y in p[0]], rebuild
    if isinstance(x, dict):
        keys = sorted(x)
        flat, rebuild_list = _flatten_with([x[k] for k in keys])
        return flat, lambda values: dict(zip(keys, rebuild_list(values)))
    return [x], lambda values: values[0]
