"""The guide example script runs and prints the guide's values (singleton only: a script
under test cannot start its own mpiexec from inside one)."""
import pathlib
import subprocess
import sys

import pytest

from conftest import CLIENTS
from examples_run import clean_env

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "dtensor_overview.py"


@pytest.mark.skipif(CLIENTS > 1, reason="runs the example as its own single client")
def test_dtensor_overview_example():
    env = clean_env()
    out = subprocess.run([sys.executable, str(EXAMPLE)], env=env, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    assert "matmul, replicated: [[20.0, 14.0], [56.0, 41.0]], 72 multiplies, 0 collective" in out
    assert "contracting axis sharded on x: [[20.0, 14.0], [56.0, 41.0]], 24 multiplies, 1" in out
    assert "A's rows sharded on y: [[20.0, 14.0], [56.0, 41.0]], 12 multiplies, 1" in out
    assert "  Device CPU:5: [[5]]" in out
    assert "DVariable.assign with the wrong layout: DT_ERR_LAYOUT" in out
    assert "after assign_add: [2.0, 2.0, 2.0, 2.0]" in out
    assert "pack -> unpack: [[0, 1]] on every device" in out
    assert "numpy() of a sharded DTensor:" in out and "dtensor.gather" in out
    assert "v + a: Layout('x,y', Mesh(x=3,y=2, CPU:6)) first row" in out


README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


@pytest.mark.skipif(CLIENTS > 1, reason="each block runs as its own single client")
def test_readme_python_blocks_run():
    """Every Python block of the README runs as shown."""
    import re
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks
    env = clean_env()
    for block in blocks:
        subprocess.run([sys.executable, "-c", block], env=env, check=True, capture_output=True,
                       text=True, timeout=120)


def test_readme_c_program_is_the_tested_example():
    """The README's C program is examples/first_program.c (a meson test runs it at 1, 2 and 3
    clients), so what the README shows is what is tested."""
    import re
    shown = re.findall(r"```c\n(.*?)```", README.read_text(), re.S)[0]
    source = (EXAMPLE.parent / "first_program.c").read_text()
    assert shown == source[source.index("#include <dtensor.h>"):]


@pytest.mark.skipif(CLIENTS > 1, reason="the example starts its own clients")
def test_gpt_example_same_curve_under_every_sharding():
    """examples/gpt.py compare: one device, data, tensor and 2-D parallelism give one loss curve
    (within 1e-5) as one client of 4 devices and as 2 and 4 clients."""
    env = clean_env()
    example = str(EXAMPLE.parent / "gpt.py")
    for launch in ([], ["mpiexec.mpich", "-n", "2"], ["mpiexec.mpich", "-n", "4"]):
        out = subprocess.run(launch + [sys.executable, example, "compare", "20"], env=env,
                             check=True, capture_output=True, text=True, timeout=300).stdout
        assert "(<= 1e-5: yes)" in out, out
        assert out.count("first loss") == 4, out
