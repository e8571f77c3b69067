"""The DTensor concepts guide (tensorflow.org/guide/dtensor_overview) as a TensorFlow user types
it, with `tf.` replaced by `dtensor.` (README, "Where the guides' names live"):

    python3 examples/guide_dtensor.py                   # one client with 6 CPU devices
    mpiexec.mpich -n 2 python3 examples/guide_dtensor.py    # 2 clients x 3 devices

One line differs from the guide: it configures 6 CPU devices in all, divided among the clients
(the guide's program is a single client), so that its meshes span every client. Every client
prints; bindings/python/tests/test_guides.py checks the values against the guide's.
"""
import dtensor
from dtensor.experimental import dtensor  # noqa: F811 (tensorflow.experimental.dtensor)

print('TensorFlow version:', dtensor.__version__)


def configure_virtual_cpus(ncpu):
    phy_devices = dtensor.config.list_physical_devices('CPU')
    dtensor.config.set_logical_device_configuration(phy_devices[0], [
        dtensor.config.LogicalDeviceConfiguration(),
    ] * ncpu)


configure_virtual_cpus(6 // dtensor.num_clients())  # the guide: configure_virtual_cpus(6)
DEVICES = [f'CPU:{i}' for i in range(6)]

dtensor.config.list_logical_devices('CPU')

mesh_1d = dtensor.create_mesh([('x', 6)], devices=DEVICES)
print(mesh_1d)

mesh_2d = dtensor.create_mesh([('x', 3), ('y', 2)], devices=DEVICES)
print(mesh_2d)

layout = dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh_1d)
layout = dtensor.Layout([dtensor.UNSHARDED, 'x'], mesh_1d)
layout = dtensor.Layout(['y', 'x'], mesh_2d)
layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh_2d)


def dtensor_from_array(arr, layout, shape=None, dtype=None):
    """Convert a DTensor from something that looks like an array or Tensor.

    This function is convenient for quick doodling DTensors from a known,
    unsharded data object in a single-client environment. This is not the
    most efficient way of creating a DTensor, but it will do for this
    tutorial.
    """
    if shape is not None or dtype is not None:
        arr = dtensor.constant(arr, shape=shape, dtype=dtype)

    # replicate the input to the mesh
    a = dtensor.copy_to_mesh(arr,
                             layout=dtensor.Layout.replicated(layout.mesh, rank=layout.rank))
    # shard the copy to the desirable layout
    return dtensor.relayout(a, layout=layout)


mesh = dtensor.create_mesh([("x", 6)], devices=DEVICES)
layout = dtensor.Layout([dtensor.UNSHARDED], mesh)

my_first_dtensor = dtensor_from_array([0, 1], layout)

# Examine the DTensor content
print(my_first_dtensor)
print("global shape:", my_first_dtensor.shape)
print("dtype:", my_first_dtensor.dtype)

print(dtensor.fetch_layout(my_first_dtensor))
assert layout == dtensor.fetch_layout(my_first_dtensor)

for component_tensor in dtensor.unpack(my_first_dtensor):
    print("Device:", component_tensor.device, ",", component_tensor)

packed_dtensor = dtensor.pack(
    [[0, 1], [0, 1], [0, 1],
     [0, 1], [0, 1], [0, 1]],
    layout=layout
)
print(packed_dtensor)

mesh = dtensor.create_mesh([("x", 3), ("y", 2)], devices=DEVICES)

fully_sharded_dtensor = dtensor_from_array(
    dtensor.reshape(dtensor.range(6), (3, 2)),
    layout=dtensor.Layout(["x", "y"], mesh))

for raw_component in dtensor.unpack(fully_sharded_dtensor):
    print("Device:", raw_component.device, ",", raw_component)

fully_replicated_dtensor = dtensor_from_array(
    dtensor.reshape(dtensor.range(6), (3, 2)),
    layout=dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh))
# Or, layout=tensor.Layout.fully_replicated(mesh, rank=2)

for component_tensor in dtensor.unpack(fully_replicated_dtensor):
    print("Device:", component_tensor.device, ",", component_tensor)

hybrid_sharded_dtensor = dtensor_from_array(
    dtensor.reshape(dtensor.range(6), (3, 2)),
    layout=dtensor.Layout(['x', dtensor.UNSHARDED], mesh))

for component_tensor in dtensor.unpack(hybrid_sharded_dtensor):
    print("Device:", component_tensor.device, ",", component_tensor)

print(fully_replicated_dtensor.numpy())

try:
    fully_sharded_dtensor.numpy()
except dtensor.errors.UnimplementedError:
    print("got an error as expected for fully_sharded_dtensor")

try:
    hybrid_sharded_dtensor.numpy()
except dtensor.errors.UnimplementedError:
    print("got an error as expected for hybrid_sharded_dtensor")

mesh = dtensor.create_mesh([("x", 6)], devices=DEVICES)
layout = dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh)
a = dtensor_from_array([[1, 2, 3], [4, 5, 6]], layout=layout)
b = dtensor_from_array([[6, 5], [4, 3], [2, 1]], layout=layout)

c = dtensor.matmul(a, b)  # runs 6 identical matmuls in parallel on 6 devices

# `c` is a DTensor replicated on all devices (same as `a` and `b`)
print('Sharding spec:', dtensor.fetch_layout(c).sharding_specs)
print("components:")
for component_tensor in dtensor.unpack(c):
    print(component_tensor.device, component_tensor.numpy())

mesh = dtensor.create_mesh([("x", 3), ("y", 2)], devices=DEVICES)
a_layout = dtensor.Layout([dtensor.UNSHARDED, 'x'], mesh)
a = dtensor_from_array([[1, 2, 3], [4, 5, 6]], layout=a_layout)
b_layout = dtensor.Layout(['x', dtensor.UNSHARDED], mesh)
b = dtensor_from_array([[6, 5], [4, 3], [2, 1]], layout=b_layout)

c = dtensor.matmul(a, b)
# `c` is a DTensor replicated on all devices (same as `a` and `b`)
print('Sharding spec:', dtensor.fetch_layout(c).sharding_specs)

mesh = dtensor.create_mesh([("x", 3), ("y", 2)], devices=DEVICES)

a_layout = dtensor.Layout(['y', 'x'], mesh)
a = dtensor_from_array([[1, 2, 3], [4, 5, 6]], layout=a_layout)
b_layout = dtensor.Layout(['x', dtensor.UNSHARDED], mesh)
b = dtensor_from_array([[6, 5], [4, 3], [2, 1]], layout=b_layout)

c = dtensor.matmul(a, b)
# The sharding of `a` on the first axis is carried to `c'
print('Sharding spec:', dtensor.fetch_layout(c).sharding_specs)
print("components:")
for component_tensor in dtensor.unpack(c):
    print(component_tensor.device, component_tensor.numpy())

help(dtensor.call_with_layout)

help(dtensor.ones)

mesh = dtensor.create_mesh([("x", 3), ("y", 2)], devices=DEVICES)
ones = dtensor.call_with_layout(dtensor.ones, dtensor.Layout(['x', 'y'], mesh), shape=(6, 4))
print(ones)

help(dtensor.random.stateless_normal)

ones = dtensor.call_with_layout(
    dtensor.function(dtensor.random.stateless_normal),
    dtensor.Layout(['x', 'y'], mesh),
    shape=(6, 4),
    seed=(1, 1))
print(ones)

ones = dtensor.call_with_layout(
    dtensor.function(dtensor.ones),
    dtensor.Layout(['x', 'y'], mesh),
    shape=(6, 4))
print(ones)

mesh = dtensor.create_mesh([("x", 6)], devices=DEVICES)
layout = dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh)

v = dtensor.DVariable(
    initial_value=dtensor.call_with_layout(
        dtensor.function(dtensor.random.stateless_normal),
        layout=layout,
        shape=dtensor.TensorShape([64, 32]),
        seed=[1, 1],
        dtype=dtensor.float32))

print(v.handle)
assert layout == dtensor.fetch_layout(v)

a = dtensor.call_with_layout(dtensor.ones, layout=layout, shape=(64, 32))
b = v + a  # add DVariable and DTensor
print(b)

v.assign(a)  # assign a DTensor to a DVariable
print(a)

# variable's layout is immutable.
another_mesh = dtensor.create_mesh([("x", 3), ("y", 2)], devices=DEVICES)
b = dtensor.call_with_layout(dtensor.ones,
                             layout=dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED],
                                                   another_mesh),
                             shape=(64, 32))
try:
    v.assign(b)
except:  # noqa: E722 (the guide's bare except)
    print("exception raised")
