"""Running a program of examples/ as TensorFlow users start theirs: one process, several
clients under mpiexec.mpich, or an MPMD launch giving each task its TF_CONFIG."""
import json
import os
import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples"


def run(tmp_path, example, clients=1, tasks=None, env=None, timeout=600, args=()):
    """Each client's stdout, in client order; the program runs in tmp_path with the command
    line arguments ``args``. ``tasks``: each rank's TF_CONFIG (an MPMD launch, one environment
    per task, as TensorFlow's tasks start). Every client's output goes to a file of its own."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_"))}
    base.update(OPENBLAS_NUM_THREADS="1", **(env or {}))
    script = [sys.executable, str(EXAMPLES / example), *args]
    out = tmp_path / "out"
    if tasks is not None:
        cmd = ["mpiexec.mpich", "-outfile-pattern", f"{out}.%r"]
        for i, task in enumerate(tasks):
            cmd += ([":"] if i else []) + ["-n", "1", "-env", "TF_CONFIG", json.dumps(task)] + \
                script
    elif clients > 1:
        cmd = ["mpiexec.mpich", "-n", str(clients), "-outfile-pattern", f"{out}.%r"] + script
    else:
        r = subprocess.run(script, env=base, capture_output=True, text=True, timeout=timeout,
                           cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        return [r.stdout]
    r = subprocess.run(cmd, env=base, capture_output=True, text=True, timeout=timeout,
                       cwd=tmp_path)
    # a client that printed nothing has no file
    files = [pathlib.Path(f"{out}.{k}") for k in range(len(tasks or range(clients)))]
    outs = [f.read_text() if f.exists() else "" for f in files]
    assert r.returncode == 0, "\n".join(outs) + r.stderr
    return outs
