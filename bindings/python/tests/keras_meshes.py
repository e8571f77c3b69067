"""The meshes and layouts the Keras cross-entropy tests (test_keras_sparse_xent.py,
test_keras_metrics.py) run on: meshes of n CPU devices (2x2 at 4) and the (rows, classes)
specs of each."""
import dtensor

U = dtensor.UNSHARDED


def mesh_of(n):
    if n == 4:
        return dtensor.create_mesh([("x", 2), ("y", 2)], devices=[f"CPU:{i}" for i in range(4)])
    return dtensor.create_mesh([("x", n)], devices=[f"CPU:{i}" for i in range(n)])


def layouts(n):
    """(rows, classes) specs: replicated, rows sharded, classes sharded, both (on 4)."""
    if n == 4:
        return [(U, U), ("x", U), (U, "y"), ("x", "y")]
    return [(U, U), ("x", U), (U, "x")]
