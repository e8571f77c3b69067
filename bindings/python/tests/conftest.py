"""Six CPU devices in all, as in the DTensor guide: one client with 6, or N clients with 6/N
each under mpiexec.mpich -n N (N in 1, 2, 3, 6)."""
import os

import pytest

import dtensor

CLIENTS = int(os.environ.get("PMI_SIZE", "1"))
DEVICES = 6


@pytest.fixture(scope="session", autouse=True)
def runtime():
    assert DEVICES % CLIENTS == 0, f"run with a client count that divides {DEVICES}"
    dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=DEVICES // CLIENTS)
    yield
    dtensor.shutdown_accelerator_system()


@pytest.fixture(scope="session")
def mesh_1d(runtime):
    return dtensor.create_mesh([("x", 6)], device_type="CPU")


@pytest.fixture(scope="session")
def mesh_2d(runtime):
    return dtensor.create_mesh([("x", 3), ("y", 2)], device_type="CPU")
