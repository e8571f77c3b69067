"""The DTensor guide (dtensor_overview) in Python, with numpy in place of tf.Tensor.

    PYTHONPATH=build/bindings/python build/venv/bin/python examples/dtensor_overview.py
    mpiexec.mpich -n 2 build/venv/bin/python examples/dtensor_overview.py   # 2 clients x 3

Six CPU devices in all: one client with 6, or N clients with 6/N each. Client 0 prints; the
output is the same for any client count.
"""
import os

import numpy as np

import dtensor

clients = int(os.environ.get("PMI_SIZE", "1"))
dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=6 // clients)


def say(*args):
    if dtensor.client_id() == 0:
        print(*args, flush=True)


def show_components(t):
    """Each device's component, in global device order across clients."""
    lines = "".join(f"  Device CPU:{dev}: {c.tolist()}\n"
                    for dev, c in zip(t.layout.mesh.local_device_ids(), dtensor.unpack(t)))
    dtensor.print_ordered(lines)


# Mesh and Layout
mesh_1d = dtensor.create_mesh([("x", 6)], device_type="CPU")
mesh_2d = dtensor.create_mesh([("x", 3), ("y", 2)], device_type="CPU")
say(mesh_1d, mesh_2d)

# A first DTensor: [0, 1] replicated on every device of the 1-D mesh
layout = dtensor.Layout([dtensor.UNSHARDED], mesh_1d)
my_first_dtensor = dtensor.dtensor_from_array(np.array([0, 1], dtype=np.int32), layout)
say("my_first_dtensor:", my_first_dtensor, my_first_dtensor.numpy().tolist())
show_components(my_first_dtensor)

# pack: the same DTensor from one component per local device (each client passes its own)
packed = dtensor.pack([np.array([0, 1], dtype=np.int32)] * len(mesh_1d.local_device_ids()),
                      layout)
say("pack -> unpack:", [c.tolist() for c in dtensor.unpack(packed)][:1], "on every device")

# Sharding a 3x2 tensor on the 3x2 mesh
values = np.arange(6, dtype=np.int32).reshape(3, 2)
for title, specs in [("fully sharded", ["x", "y"]),
                     ("fully replicated", [dtensor.UNSHARDED, dtensor.UNSHARDED]),
                     ("hybrid", ["x", dtensor.UNSHARDED])]:
    t = dtensor.dtensor_from_array(values, dtensor.Layout(specs, mesh_2d))
    say(f"{title}: {t.layout}")
    show_components(t)
    if title == "fully sharded":  # numpy() of a sharded DTensor is an error, as in TensorFlow
        try:
            t.numpy()
        except dtensor.DTensorError as e:
            say("numpy() of a sharded DTensor:", e)

# DTensor as operands: [[1,2,3],[4,5,6]] @ [[6,5],[4,3],[2,1]] under three layouts
a_host = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
b_host = np.array([[6, 5], [4, 3], [2, 1]], dtype=np.float32)
mm = dtensor.function(lambda a, b: a @ b)
for title, la, lb in [
        ("replicated", ["unsharded", "unsharded"], ["unsharded", "unsharded"]),
        ("contracting axis sharded on x", ["unsharded", "x"], ["x", "unsharded"]),
        ("and A's rows sharded on y", ["y", "x"], ["x", "unsharded"])]:
    a = dtensor.dtensor_from_array(a_host, dtensor.Layout(la, mesh_2d))
    b = dtensor.dtensor_from_array(b_host, dtensor.Layout(lb, mesh_2d))
    c = mm(a, b)
    program, multiplies, collectives, _ = mm.program(a, b)
    say(f"matmul, {title}: {dtensor.gather(c).tolist()}, {multiplies:.0f} multiplies, "
        f"{collectives} collective(s)")
    say(program)

# DTensor as output: creation ops through call_with_layout
ones = dtensor.call_with_layout(dtensor.ones, dtensor.Layout(["x", "y"], mesh_2d), shape=(6, 4))
say("ones:", ones)
show_components(ones)
uniform = dtensor.call_with_layout(dtensor.random.stateless_uniform,
                                   dtensor.Layout(["x", dtensor.UNSHARDED], mesh_2d),
                                   shape=(3, 4), seed=(1, 2))
say("stateless_uniform (the same global values under every layout):")
say(np.round(dtensor.gather(uniform), 4))

# A DVariable initialised from stateless_normal in its layout, used in an expression
layout_v = dtensor.Layout(["x", "y"], mesh_2d)
v = dtensor.DVariable(dtensor.call_with_layout(dtensor.random.stateless_normal, layout_v,
                                               shape=(6, 4), seed=(1, 1)))
a = dtensor.call_with_layout(dtensor.ones, layout_v, shape=(6, 4))
b = v + a  # a DTensor in the variable's layout
say("v + a:", b.layout, "first row", np.round(dtensor.gather(b)[0], 4).tolist())

# A DVariable keeps its layout: assigning a value of another layout is an error
v = dtensor.DVariable(ones)
try:
    v.assign(dtensor.relayout(ones, dtensor.Layout.replicated(mesh_2d, 2)))
except dtensor.DTensorError as e:
    say("DVariable.assign with the wrong layout:", e.status, "-", e)
v.assign_add(ones)
say("after assign_add:", dtensor.gather(v.read_value())[0].tolist())
