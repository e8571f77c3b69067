"""Meshes and layouts (tf.experimental.dtensor.Mesh, Layout), the collective algorithm of a mesh
and the communication ledger."""

import builtins as _builtins
import itertools
import re as _re
import types as _types
import weakref

import numpy as np

from . import _dtensor as _c
from . import errors
from ._dtypes import UNSHARDED, _live
from ._runtime import (_DEVICE_TYPES, _agree, _allgather_json, _ensure_init, client_id, num_clients,
                       num_local_devices)

# ---- mesh ------------------------------------------------------------------------------------


class Mesh:
    """Devices on named axes, in row-major order. Create with :func:`create_mesh`."""

    def __init__(self, handle, device_ids=None, name="", local=False):
        self._handle = handle
        info = _c.mesh_info(handle)
        self._names = tuple(info["names"])
        self._sizes = tuple(info["sizes"])
        self._local_ids = tuple(info["local_ids"])  # mesh ids of this client's devices
        self._device_type = "GPU" if info["device_type"] == "CUDA" else "CPU"
        # the runtime's global device id of each mesh device, in row-major order
        self._device_ids = tuple(info["device_ids"] if device_ids is None else device_ids)
        self._name = name
        self._local = local  # this client's alone: its tensors move to other meshes by host
        self._layouts = {}  # canonical layout text -> Layout, for op results
        _live.add(self)
        if not local:  # a client-local mesh (one replica's device) is no global mesh's twin
            _meshes.setdefault(self._key(), weakref.WeakSet()).add(self)
            _created[self] = next(_serial)

    def _key(self):
        return (self._names, self._sizes, self._device_type, self._device_ids)

    @property
    def dim_names(self):
        return list(self._names)

    def shape(self):
        return list(self._sizes)

    @property
    def size(self):
        return int(np.prod(self._sizes))

    def dim_size(self, dim_name):
        if dim_name not in self._names:
            raise ValueError(f"{dim_name!r} is not a dimension of {self}")
        return self._sizes[self._names.index(dim_name)]

    def device_type(self):
        return self._device_type

    def local_device_ids(self):
        return list(self._local_ids)

    def num_local_devices(self):
        return len(self._local_ids)

    def local_devices(self):
        """This client's devices of the mesh as "CPU:<global device id>"."""
        return [f"{self._device_type}:{self._device_ids[i]}" for i in self._local_ids]

    def global_device_ids(self):
        """The global device id of every mesh device, shaped as the mesh."""
        return np.array(self._device_ids).reshape(self._sizes)

    @property
    def name(self):
        return self._name

    def to_string(self):
        """TensorFlow's text form, ``name|x=3,y=2|ids|local ids|local devices``: the third
        field holds the runtime's global device id of each mesh device (0..n-1 for a mesh over
        every device, as TensorFlow writes it), so :meth:`from_string` rebuilds the same
        placement; the local devices are this client's, by TensorFlow's device names."""
        dims = ",".join(f"{n}={s}" for n, s in zip(self._names, self._sizes))
        first = _c.global_device_id(_DEVICE_TYPES[self._device_type], 0)
        job = "localhost" if num_clients() == 1 else "worker"
        local = [f"/job:{job}/replica:0/task:{client_id()}/device:{self._device_type}:"
                 f"{self._device_ids[i] - first}" for i in self._local_ids]
        return "|".join([self._name, dims, ",".join(map(str, self._device_ids)),
                         ",".join(map(str, self._local_ids)), ",".join(local)])

    @staticmethod
    def from_string(mesh_str):
        """The mesh of a :meth:`to_string` text (TensorFlow's form; ``|x=2|*CPU`` means every
        CPU device). The oldest live mesh with the same axes, type and devices is returned as
        is; otherwise one is created, which is collective."""
        if not isinstance(mesh_str, str):
            raise TypeError(f"Mesh.from_string: expected a string, got {type(mesh_str).__name__}")
        fields = mesh_str.strip().split("|")
        if len(fields) < 3:
            raise ValueError(f"cannot parse mesh {mesh_str!r}: expected "
                             f"'name|x=2,y=3|device ids|local ids|local devices'")
        dims = []
        for d in fields[1].split(","):
            n, eq, size = d.partition("=")
            if not eq or not size.strip().isdigit():
                raise ValueError(f"cannot parse mesh dimension {d!r} in {mesh_str!r}")
            dims.append((n.strip(), int(size)))
        ids_text = fields[2].strip()
        if ids_text.startswith("*"):
            kind, ids = ids_text[1:].upper() or "CPU", None
        else:
            found = _re.findall(r"device:([A-Za-z]+):", "|".join(fields[4:]))
            kind = found[0].upper() if found else "CPU"
            try:
                ids = tuple(int(i) for i in ids_text.split(","))
            except ValueError:
                raise ValueError(f"cannot parse device ids {ids_text!r} in {mesh_str!r}") \
                    from None
        if kind not in _DEVICE_TYPES:
            raise ValueError(f"device type {kind!r} in {mesh_str!r} is not CPU or GPU")
        kind = "GPU" if _DEVICE_TYPES[kind] == _c.DEVICE_CUDA else "CPU"
        key_ids = ids if ids is not None else tuple(
            _builtins.range(int(np.prod([s for _, s in dims]))))
        twins = _meshes.get((tuple(n for n, _ in dims), tuple(s for _, s in dims), kind, key_ids))
        if twins:  # the oldest live one, whichever were made and dropped since
            return min(twins, key=_created.__getitem__)
        return _make_mesh(dims, kind, ids, fields[0])

    def __contains__(self, dim_name):
        return dim_name in self._names

    def __getitem__(self, dim_name):
        """The dimension ``(name, size)`` (TensorFlow's MeshDimension)."""
        return MeshDimension(dim_name, self.dim_size(dim_name))

    @property
    def strides(self):
        """Row-major strides of the mesh: a device's coordinates are (id // strides) % shape."""
        return [int(np.prod(self._sizes[k + 1:])) for k in _builtins.range(len(self._sizes))]

    def unravel_index(self):
        """{mesh device index: {dimension name: coordinate}} for every device of the mesh."""
        return {i: dict(zip(self._names, (int(c) for c in np.unravel_index(i, self._sizes))))
                for i in _builtins.range(self.size)}

    def coords(self, device_idx):
        """The mesh coordinates of device ``device_idx`` (an index into the mesh)."""
        return [int(c) for c in np.unravel_index(int(device_idx), self._sizes)]

    def local_device_locations(self):
        """The coordinates ({dimension name: index}) of this client's devices, in local
        order."""
        where = self.unravel_index()
        return [where[i] for i in self._local_ids]

    def min_global_device_id(self):
        return min(self._device_ids)

    def is_remote(self):
        """True when this client owns none of the mesh's devices."""
        return not self._local_ids

    def host_mesh(self):
        """The mesh's CPU twin (TensorFlow's host mesh): itself for a CPU mesh."""
        if self._device_type == "CPU":
            return self
        raise errors.UnimplementedError(f"host_mesh of {self}: a GPU mesh's host mesh")

    def __eq__(self, other):
        return isinstance(other, Mesh) and other._handle is self._handle

    def __hash__(self):
        return id(self._handle)

    def __repr__(self):
        dims = ",".join(f"{n}={s}" for n, s in zip(self._names, self._sizes))
        return f"Mesh({dims}, {self._device_type}:{self.size})"


# (names, sizes, type, device ids) -> the live meshes of that key, and each one's creation serial
_meshes = {}
_created = weakref.WeakKeyDictionary()
_serial = itertools.count()


class MeshDimension(_types.SimpleNamespace):
    """A mesh dimension: ``name`` and ``size``."""

    def __init__(self, name, size):
        super().__init__(name=name, size=size)

    def __iter__(self):
        return iter((self.name, self.size))


def _make_mesh(dims, kind, device_ids=None, name=""):
    """A Mesh over every device of the type, or over ``device_ids`` (collective)."""
    names, sizes = [], []
    for d in dims:
        if not isinstance(d, (list, tuple)) or len(d) != 2:
            raise TypeError(f"mesh dimension {d!r}: expected a (name, size) pair")
        n, size = d
        if not isinstance(n, str):
            raise TypeError(f"mesh dimension {d!r}: the name must be a string")
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise TypeError(f"mesh dimension {d!r}: the size must be an integer, got "
                            f"{type(size).__name__}")
        names.append(n)
        sizes.append(int(size))
    ids = None if device_ids is None else list(device_ids)
    return Mesh(_c.mesh_create(names, sizes, _DEVICE_TYPES[kind], ids), ids, name)


def _device_index(device, kind):
    """The device number of "CPU:3", "/device:CPU:3" or "/job:w/replica:0/task:1/device:CPU:3"
    and its task (None without one)."""
    m = _re.fullmatch(r"(?:.*/)?(?:device:)?([A-Za-z]+):(\d+)", str(device).strip())
    if not m or m.group(1).upper() not in _DEVICE_TYPES or \
            _DEVICE_TYPES[m.group(1).upper()] != _DEVICE_TYPES[kind]:
        raise ValueError(f"device {device!r} is not a {kind} device name like '{kind}:0'")
    task = _re.search(r"/task:(\d+)", str(device))
    return int(m.group(2)), None if task is None else int(task.group(1))


def _mesh_args(mesh_dims, device_type):
    _ensure_init()
    if mesh_dims is None:
        raise ValueError("mesh_dims is required, e.g. [('x', 6)]")
    kind = (device_type or "CPU").upper()
    if kind not in _DEVICE_TYPES:
        raise ValueError(f"device_type {device_type!r} is not CPU or GPU")
    return list(mesh_dims.items()) if isinstance(mesh_dims, dict) else list(mesh_dims), kind


def _check_order(devices, ids):
    if any(b <= a for a, b in zip(ids, ids[1:])):
        raise ValueError(
            f"devices {list(devices)} (global ids {list(ids)}) must be in increasing order "
            f"without repeats: each client's devices are one contiguous block of the mesh, so "
            f"another order cannot be honoured (list them in increasing order)")


def create_mesh(mesh_dims=None, mesh_name="", devices=None, device_type=None,
                use_xla_spmd=False):
    """A mesh over every device of the type on every client (collective).

    ``mesh_dims``: a list of ``(name, size)`` pairs or a dict. ``devices``, when given, lists
    the mesh's devices in row-major order, as global ids (``"CPU:3"``) or TensorFlow names with
    a task (``"/job:worker/replica:0/task:1/device:CPU:0"``: client 1's first device): a subset
    of the devices is fine; the order must be increasing (another order raises ValueError
    naming the devices, it is never silently replaced). ``use_xla_spmd`` is accepted for
    compatibility."""
    dims, kind = _mesh_args(mesh_dims, device_type)
    if devices is None:
        return _make_mesh(dims, kind, name=mesh_name)
    # a task's devices start at the sum of the earlier clients' device counts
    counts = _allgather_json(num_local_devices(kind))
    firsts = [sum(counts[:c]) for c in _builtins.range(len(counts))]
    ids, error = [], None
    try:
        for d in devices:
            i, task = _device_index(d, kind)
            if task is not None and not 0 <= task < len(firsts):
                raise ValueError(f"device {d!r}: task {task} is not one of the "
                                 f"{len(firsts)} clients")
            ids.append(i if task is None else firsts[task] + i)
        _check_order(devices, ids)
    except ValueError as e:
        error = e
    _agree(error)
    return _make_mesh(dims, kind, ids, mesh_name)


def create_distributed_mesh(mesh_dims, mesh_name="", local_devices=None, device_type=None,
                            use_xla_spmd=False):
    """A mesh spanning the clients (collective). ``local_devices``, when given, lists this
    client's devices of the mesh by local number (``"CPU:0"`` is this client's first device);
    the mesh takes every client's list in client order (a client may list none), each in
    increasing order; without it, every device of every client."""
    if local_devices is None:
        return create_mesh(mesh_dims, mesh_name=mesh_name, device_type=device_type)
    dims, kind = _mesh_args(mesh_dims, device_type)
    ids, error = [], None
    try:
        local = [_device_index(d, kind)[0] for d in local_devices]
        for d, i in zip(local_devices, local):
            if not 0 <= i < num_local_devices(kind):
                raise ValueError(f"local device {d!r} is not one of this client's "
                                 f"{num_local_devices(kind)} {kind} devices")
        ids = [_c.global_device_id(_DEVICE_TYPES[kind], i) for i in local]
        _check_order(local_devices, ids)
    except ValueError as e:
        error = e
    every = [i for client_ids in _agree(error, ids) for i in client_ids]
    return _make_mesh(dims, kind, every, mesh_name)


# ---- layout ----------------------------------------------------------------------------------


def _rank_arg(rank):
    """A tensor rank: an integer in 0..8; TypeError or ValueError otherwise."""
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise TypeError(f"rank must be an integer, got {type(rank).__name__}")
    if not 0 <= rank <= 8:
        raise ValueError(f"rank {rank} is outside 0..8")
    return int(rank)


class Layout:
    """Per tensor axis the mesh dimension that shards it, or ``UNSHARDED``.

    ``partial`` names mesh dimensions holding pending reductions, e.g. ``{"y": "sum"}`` (one
    reduction for all of them)."""

    def __init__(self, sharding_specs, mesh, partial=None):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh must be a dtensor.Mesh, got {type(mesh).__name__}")
        if isinstance(sharding_specs, str) or not isinstance(sharding_specs, (list, tuple)):
            raise TypeError(f"sharding_specs must be a list of mesh dimension names or "
                            f"UNSHARDED, got {type(sharding_specs).__name__}")
        if not all(isinstance(sp, str) for sp in sharding_specs):
            raise TypeError(f"sharding_specs {list(sharding_specs)}: each entry is a mesh "
                            f"dimension name or UNSHARDED")
        self._specs = [str(s) for s in sharding_specs]
        self._mesh = mesh
        self._partial = dict(partial or {})
        ops = set(self._partial.values())
        if len(ops) > 1:
            raise ValueError(f"partial dimensions must share one reduction, got {sorted(ops)}")
        text = ",".join(self._specs)
        if self._partial:
            text += f";partial_{ops.pop()}=" + "+".join(self._partial)
        self._text, rank = _c.layout_check(mesh._handle, text)
        assert rank == len(self._specs)

    @classmethod
    def replicated(cls, mesh, rank):
        return cls([UNSHARDED] * _rank_arg(rank), mesh)

    @classmethod
    def fully_replicated(cls, mesh, rank):
        return cls.replicated(mesh, rank)

    @classmethod
    def batch_sharded(cls, mesh, batch_dim, rank, axis=0):
        specs = [UNSHARDED] * _rank_arg(rank)
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or \
                not -len(specs) <= axis < len(specs):
            raise ValueError(f"batch_sharded: axis {axis!r} is not an axis of rank {rank}")
        specs[axis] = batch_dim
        return cls(specs, mesh)

    @classmethod
    def inner_sharded(cls, mesh, inner_dim, rank):
        return cls.batch_sharded(mesh, inner_dim, rank, axis=rank - 1)

    @classmethod
    def from_string(cls, layout_str, mesh=None):
        """Parse TensorFlow's form ``"sharding_specs:x,unsharded, mesh:|x=2|0,1|0,1|..."``
        (the mesh is found among the live meshes, or created: see :meth:`Mesh.from_string`),
        or the short form ``"x,unsharded"`` (optionally ``";partial_sum=y"``) on ``mesh``."""
        if not isinstance(layout_str, str):
            raise TypeError(f"Layout.from_string: expected a string, got "
                            f"{type(layout_str).__name__}")
        if mesh is not None and not isinstance(mesh, Mesh):
            raise TypeError(f"Layout.from_string: mesh must be a dtensor.Mesh, got "
                            f"{type(mesh).__name__}")
        text = layout_str.strip()
        if text.startswith("sharding_specs:"):
            specs, sep, mesh_str = text[len("sharding_specs:"):].partition(", mesh:")
            if not sep:
                raise ValueError(f"cannot parse layout {layout_str!r}: no ', mesh:'")
            carried = Mesh.from_string(mesh_str)
            if mesh is not None and mesh is not carried:
                raise ValueError(f"layout {layout_str!r} is on {carried}, not on {mesh}")
            mesh, text = carried, specs
        if mesh is None:
            raise ValueError(f"layout {layout_str!r} carries no mesh: pass mesh=")
        text, _, partial = text.replace(" ", "").partition(";")
        specs = text.split(",") if text else []
        parts = {}
        if partial:
            op, _, axes = partial.partition("=")
            if not op.startswith("partial_"):
                raise ValueError(f"cannot parse layout {layout_str!r}")
            parts = {a: op[len("partial_"):] for a in axes.split("+")}
        return cls(specs, mesh, partial=parts)

    def to_string(self):
        """TensorFlow's form: ``"sharding_specs:x,unsharded, mesh:<Mesh.to_string()>"`` (partial
        axes, an extension, follow the specs as in the short form)."""
        return f"sharding_specs:{self._text}, mesh:{self._mesh.to_string()}"

    def short_string(self):
        """The short form ``"x,unsharded"`` (``";partial_sum=y"`` for partial axes)."""
        return self._text

    @property
    def sharding_specs(self):
        return list(self._specs)

    @property
    def mesh(self):
        return self._mesh

    @property
    def rank(self):
        return len(self._specs)

    @property
    def partial(self):
        return dict(self._partial)

    @property
    def shape(self):
        """The number of shards of each tensor axis (TensorFlow's Layout.shape)."""
        return [self.num_shards(i) for i in _builtins.range(self.rank)]

    def delete(self, dims):
        """The layout without the tensor axes ``dims`` (its sharding of the others kept)."""
        dims = {int(d) % self.rank if self.rank else int(d) for d in dims}
        return Layout([s for i, s in enumerate(self.sharding_specs) if i not in dims],
                      self.mesh)

    def is_fully_replicated(self):
        return not self._partial and all(s == UNSHARDED for s in self._specs)

    def num_shards(self, idx):
        """How many shards split tensor axis ``idx`` (1 when unsharded)."""
        if isinstance(idx, bool) or not isinstance(idx, (int, np.integer)):
            raise TypeError(f"num_shards: axis must be an integer, got {type(idx).__name__}")
        if not -len(self._specs) <= idx < len(self._specs):
            raise ValueError(f"num_shards: axis {idx} is outside the layout's rank "
                             f"{len(self._specs)}")
        spec = self._specs[idx]
        return 1 if spec == UNSHARDED else self._mesh.dim_size(spec)

    def local_shape(self, global_shape, device):
        """(local shape, global offset) of a global device's shard; uneven splits allowed."""
        from ._tensor import _shape_arg  # noqa: PLC0415 (a later module)
        shape = _shape_arg(global_shape, "Layout.local_shape")
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)) or \
                not 0 <= device < self._mesh.size:
            raise ValueError(f"Layout.local_shape: device {device!r} is not one of the mesh's "
                             f"{self._mesh.size}")
        return _c.layout_local_shape(self._mesh._handle, self._text, shape, int(device))

    def __eq__(self, other):
        return (isinstance(other, Layout) and other._mesh == self._mesh
                and other._text == self._text)

    def __hash__(self):
        return hash((self._text, id(self._mesh._handle)))

    def __repr__(self):
        return f"Layout({self._text!r}, {self._mesh})"


def _layout_arg(layout, what):
    if not isinstance(layout, Layout):
        raise TypeError(f"{what}: layout must be a dtensor.Layout, got {type(layout).__name__}")
    return layout


def _layout_of(text, mesh):
    """The Layout of a canonical text on a mesh, cached on the mesh (results of ops)."""
    layout = mesh._layouts.get(text)
    if layout is None:
        layout = mesh._layouts[text] = Layout.from_string(text, mesh)
    return layout


# ---- collectives and the communication ledger ------------------------------------------------


def set_collective_algorithm(mesh, algorithm):
    """'auto', 'ring', 'nccl', 'hierarchical_copy' or 'reduction_to_one_device' (every client
    must set the same before its next collective on the mesh)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"set_collective_algorithm: mesh must be a dtensor.Mesh, got "
                        f"{type(mesh).__name__}")
    _c.mesh_set_algorithm(mesh._handle, algorithm)


def ledger_text():
    """This client's communication ledger as a table, per step."""
    return _c.ledger(False)


def ledger():
    """This client's communication ledger: {"client", "dropped", "entries": [...]}."""
    import json
    return json.loads(_c.ledger(True))


def ledger_clear():
    _c.ledger_clear()


def ledger_next_step():
    return _c.ledger_next_step()
