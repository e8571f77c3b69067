"""Running a program of examples/ as TensorFlow users start theirs: one process, several
clients under mpiexec.mpich, or an MPMD launch giving each task its TF_CONFIG."""
import json
import os
import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples"


# What a process manager gives its processes (MPICH's hydra: PMI_RANK, PMI_FD, PMI_SIZE,
# MPIR_CVAR_*, HYDRA_*; a PMIx launcher: PMIX_*). A program started from a test that itself runs
# under mpiexec (even -n 1) would take them for its own and connect to the test's process
# manager: it must start as a user starts it, from a clean environment.
LAUNCHER_VARIABLES = ("PMI_", "PMIX_", "HYDRA_", "MPIR_")


def clean_env(**extra):
    """os.environ without the launcher's variables, with OPENBLAS_NUM_THREADS=1 and ``extra``:
    the environment every program a test starts (an example, mpiexec.mpich) gets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARIABLES)}
    env.update(OPENBLAS_NUM_THREADS="1", **extra)
    return env


def run(tmp_path, example, clients=1, tasks=None, env=None, timeout=600, args=()):
    """Each client's stdout, in client order; the program runs in tmp_path with the command
    line arguments ``args``. ``tasks``: each rank's TF_CONFIG (an MPMD launch, one environment
    per task, as TensorFlow's tasks start). Every client's output goes to a file of its own."""
    base = clean_env(**(env or {}))
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
