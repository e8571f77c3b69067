"""The parameter-server API of the talk and the guide, run by every client: variables created
in scope live on the ps tasks, ClusterCoordinator(strategy).schedule(fn, args) runs functions
on the workers, join() on every client, partitioners with TensorFlow's rules, per-worker
datasets, TFConfigClusterResolver. A coordinator needs a chief, a worker and a ps task (3
clients); with 2 (worker 0 coordinating, one ps) the strategy and its variables work and the
coordinator is refused."""
import json

import numpy as np
import pytest

import dtensor
from conftest import CLIENTS

pytestmark = pytest.mark.skipif(CLIENTS < 2, reason="a ps cluster needs at least 2 clients")
CLUSTER = {2: "worker=1,ps=1", 3: "chief=1,worker=1,ps=1"}.get(CLIENTS)
needs_3 = pytest.mark.skipif(CLIENTS != 3, reason="a coordinator needs chief, worker and ps")


def test_coordinator_needs_a_worker_besides_the_coordinator(strategy):
    if CLIENTS != 2:
        pytest.skip("the 2-client cluster")
    with strategy.scope():
        v = dtensor.Variable(np.arange(4, dtype=np.float32))
    v.assign_add(np.ones(4, np.float32))
    dtensor.barrier()
    np.testing.assert_array_equal(v.numpy(), np.arange(4) + CLIENTS)
    with pytest.raises(dtensor.DTensorError, match="needs another worker"):
        dtensor.ClusterCoordinator(strategy)
    # checkpoints of parameter-server variables: refused with a clear error, nothing written
    with pytest.raises(dtensor.DTensorError, match="not supported yet"):
        dtensor.train.Checkpoint(v=v).write("/tmp/dtensor-ps-never-written.h5")


@pytest.fixture
def strategy(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("DTENSOR_CLUSTER", CLUSTER)
    return dtensor.ParameterServerStrategy(
        variable_partitioner=dtensor.FixedShardsPartitioner(2))


@needs_3
def test_talk_example_gives_15_on_every_task(strategy):
    """A variable created in scope; five scheduled adds of 1..5; after join, 15 everywhere."""
    with strategy.scope():
        v = dtensor.Variable(initial_value=0.0)
    assert isinstance(v, dtensor.PSVariable)
    coordinator = dtensor.ClusterCoordinator(strategy)

    def add(x):
        v.assign_add(x)
        return x * 10

    results = [coordinator.schedule(add, args=(float(x),)) for x in range(1, 6)]
    coordinator.join()
    assert float(v.read_value()) == 15.0  # chief, workers and ps alike
    if dtensor.client_id() == 0:  # the chief (worker 0 without a chief task)
        assert coordinator.done()
    # after a join every client knows the results (not collective)
    assert coordinator.fetch(results) == [10.0, 20.0, 30.0, 40.0, 50.0]
    # the coordinator goes on after a join; fetch before a join waits on every client, as
    # TensorFlow's fetch waits (every client runs the program, so every client calls it)
    rv = coordinator.schedule(add, args=(5.0,))
    assert rv.fetch() == 50.0
    assert float(v.read_value()) == 20.0
    coordinator.join()
    coordinator.shutdown()


@needs_3
def test_talk_example_with_a_per_worker_dataset_20_times(strategy):
    """The talk's program: worker_fn adds the next element of a per-worker iterator over
    [1, 2, 3, 4, 5] inside strategy.run, scheduled five times, then join: 15 on every task, 20
    rounds of 20 (each element goes to one call, whichever worker runs it; strategy.run calls
    its function once per worker, a worker being one replica, as TensorFlow's, although the
    clients here have two devices each)."""
    coordinator = dtensor.ClusterCoordinator(strategy)
    assert strategy.num_replicas_in_sync == 1

    def dataset_fn():
        return dtensor.data.Dataset.from_tensor_slices([1, 2, 3, 4, 5])

    for _ in range(20):
        with strategy.scope():
            v = dtensor.Variable(initial_value=0)
        assert v.dtype == np.int32  # a Python int, as TensorFlow converts it

        def worker_fn(iterator):
            def replica_fn(x):
                v.assign_add(x)
            strategy.run(replica_fn, args=(next(iterator),))

        per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
        for _ in range(5):
            coordinator.schedule(worker_fn, args=(per_worker_iterator,))
        coordinator.join()
        assert v.read_value() == 15  # == compares values; the result works in assert
    coordinator.shutdown()


@needs_3
def test_local_iterator_passed_to_schedule_is_shared(strategy):
    """An iterator made on the coordinator (iter(dataset)) and passed to scheduled functions
    yields each element once across the cluster too; a sixth call finds it exhausted: its
    function fails with TensorFlow's OutOfRangeError, which join raises on every client and
    the chief's fetch reports."""
    coordinator = dtensor.ClusterCoordinator(strategy)
    with strategy.scope():
        v = dtensor.Variable(0.0)
    iterator = iter(dtensor.data.Dataset.from_tensor_slices([1.0, 2.0, 3.0, 4.0, 5.0]))

    def worker_fn(it):
        x = next(it)
        v.assign_add(x)
        return x

    results = [coordinator.schedule(worker_fn, args=(iterator,)) for _ in range(6)]
    with pytest.raises(dtensor.errors.OutOfRangeError, match="scheduled function 5"):
        coordinator.join()
    assert v.read_value() == 15.0
    if dtensor.client_id() == 0:
        assert sorted(r.fetch() for r in results[:5]) == [1.0, 2.0, 3.0, 4.0, 5.0]
        with pytest.raises(dtensor.DTensorError, match="End of sequence"):
            results[5].fetch()
    coordinator.join()  # the error was reported once: the next join is clean
    coordinator.shutdown()


@needs_3
def test_sharded_variable_and_asynchronous_training(strategy):
    """A [6, 2] weight in two shards; workers fit y = x @ w by SGD steps on their own
    per-worker dataset; the loss falls and the shards cover the rows."""
    rng = np.random.default_rng(0)
    w_true = rng.normal(size=(6, 2)).astype(np.float32)
    with strategy.scope():
        w = dtensor.Variable(np.zeros((6, 2), np.float32))
    shards = w.variables
    assert [s.shape for s in shards] == [(3, 2), (3, 2)]
    assert [s.offset for s in shards] == [0, 3]
    coordinator = dtensor.ClusterCoordinator(strategy)

    def dataset_fn():
        x = np.random.default_rng(dtensor.client_id()).normal(size=(200, 6)).astype(np.float32)
        return dtensor.data.Dataset.from_tensor_slices((x, x @ w_true)).batch(20).repeat()

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    def step(it):
        x, y = next(it)
        err = x @ w.numpy() - y
        w.assign_sub(0.05 * x.T @ err / len(x))
        return float((err ** 2).mean())

    losses = [coordinator.schedule(step, args=(iterator,)) for _ in range(60)]
    coordinator.join()
    if dtensor.client_id() == 0:
        got = coordinator.fetch(losses)
        assert got[-1] < 0.1 * got[0], got
    np.testing.assert_allclose(w.numpy(), w_true, atol=0.2)
    coordinator.shutdown()


@needs_3
def test_join_raises_the_first_failed_functions_error(strategy):
    """As TensorFlow's ClusterCoordinator.join: a function that raises is not run again; join
    raises the error of the first one that failed (by schedule order), on every client, once;
    the functions that succeeded did their work and the chief fetches their values."""
    coordinator = dtensor.ClusterCoordinator(strategy)
    with strategy.scope():
        v = dtensor.Variable(0.0)
    calls = []

    def bad(what):
        calls.append(what)
        raise ValueError(f"no such thing: {what}")

    def good(x):
        v.assign_add(x)
        return x

    rvs = [coordinator.schedule(good, args=(1.0,)), coordinator.schedule(bad, args=("a",)),
           coordinator.schedule(good, args=(2.0,)), coordinator.schedule(bad, args=("b",))]
    with pytest.raises(ValueError, match="scheduled function 1 raised ValueError: no such "
                                         "thing: a"):
        coordinator.join()
    assert v.read_value() == 3.0
    # each bad function ran once, on some worker (the one worker of this cluster)
    assert calls == (["a", "b"] if strategy.task_type == "worker" else [])
    if dtensor.client_id() == 0:
        assert rvs[0].fetch() == 1.0 and rvs[2].fetch() == 2.0
        with pytest.raises(ValueError, match="no such thing: b"):
            rvs[3].fetch()
    coordinator.join()
    coordinator.shutdown()


def test_partitioners_follow_tensorflow():
    assert dtensor.FixedShardsPartitioner(4)((10, 3), np.float32) == [4, 1]
    assert dtensor.FixedShardsPartitioner(4)((2, 3), np.float32) == [2, 1]
    # 10 x 1000 f32 = 40000 bytes
    assert dtensor.MinSizePartitioner(min_shard_bytes=10000, max_shards=8)(
        (10, 1000), np.float32) == [4, 1]
    assert dtensor.MinSizePartitioner(min_shard_bytes=10000)((10, 1000), np.float32) == [1, 1]
    assert dtensor.MaxSizePartitioner(max_shard_bytes=10000)((10, 1000), np.float32) == [4, 1]
    assert dtensor.MaxSizePartitioner(max_shard_bytes=15000)((10, 1000), np.float32) == [3, 1]
    assert dtensor.MaxSizePartitioner(max_shard_bytes=1, max_shards=5)(
        (10, 1000), np.float32) == [5, 1]
    with pytest.raises(ValueError):
        dtensor.MinSizePartitioner(min_shard_bytes=0)
    with pytest.raises(TypeError, match="variable_partitioner"):
        dtensor.ParameterServerStrategy(variable_partitioner={"fixed_shards": 2})


@pytest.mark.parametrize("partitioner, rows", [
    (dtensor.MinSizePartitioner(min_shard_bytes=10000, max_shards=8), [3, 3, 2, 2]),
    (dtensor.MaxSizePartitioner(max_shard_bytes=15000), [4, 3, 3]),
])
def test_partitioners_shard_variables(monkeypatch, partitioner, rows):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("DTENSOR_CLUSTER", CLUSTER)
    s = dtensor.ParameterServerStrategy(variable_partitioner=partitioner)
    with s.scope():
        v = dtensor.Variable(np.ones((10, 1000), np.float32))
    assert [sh.shape[0] for sh in v.variables] == rows
    assert float(v.read_value().numpy().sum()) == 10000.0


def test_tf_config_cluster_resolver(monkeypatch):
    rank = dtensor.client_id()
    roles = ["worker", "ps"] if CLIENTS == 2 else ["chief", "worker", "ps"]
    config = {"cluster": {r: [f"h:{i}"] for i, r in enumerate(roles)},
              "task": {"type": roles[rank], "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    monkeypatch.delenv("DTENSOR_CLUSTER", raising=False)
    resolver = dtensor.TFConfigClusterResolver()
    assert resolver.cluster_spec() == config["cluster"]
    assert (resolver.task_type, resolver.task_id) == (roles[rank], 0)
    s = dtensor.ParameterServerStrategy(cluster_resolver=resolver)
    assert s.task_type == roles[rank]


def test_parameter_server_example():
    """examples/parameter_server.py at chief=1,worker=2,ps=1 (started from the singleton run)."""
    import subprocess
    import sys
    from pathlib import Path

    from examples_run import clean_env
    if CLIENTS != 3 or dtensor.client_id() != 0:
        pytest.skip("run once, from client 0 of the 3-client run")
    env = clean_env(DTENSOR_CLUSTER="chief=1,worker=2,ps=1")
    example = Path(__file__).resolve().parents[3] / "examples" / "parameter_server.py"
    out = subprocess.run(["mpiexec.mpich", "-n", "4", sys.executable, str(example)], env=env,
                         check=True, capture_output=True, text=True, timeout=300).stdout
    for task in ["chief:0", "worker:0", "worker:1", "ps:0"]:
        assert f"{task} reads 15.0" in out, out
    assert "w shards [(2, 1), (2, 1)]" in out, out
    loss = out.split("loss ")[1].split(" ")
    assert float(loss[2]) < 0.01 * float(loss[0]), out


def test_strategy_without_arguments_reads_tf_config(monkeypatch):
    """ParameterServerStrategy() takes the cluster from TF_CONFIG, as TensorFlow's; a variable
    in its scope names its ps task's device and prints its value."""
    rank = dtensor.client_id()
    roles = ["worker", "ps"] if CLIENTS == 2 else ["chief", "worker", "ps"]
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {r: [f"localhost:{2300 + i}"] for i, r in enumerate(roles)},
        "task": {"type": roles[rank], "index": 0}}))
    monkeypatch.delenv("DTENSOR_CLUSTER", raising=False)
    s = dtensor.ParameterServerStrategy()
    assert (s.task_type, s.task_index) == (roles[rank], 0)
    with s.scope():
        v = dtensor.Variable(2.5)
    assert isinstance(v, dtensor.PSVariable) and v.dtype == np.float32
    assert v.device == "/job:ps/replica:0/task:0/device:CPU:0"
    assert repr(v) == "<dtensor.Variable 'Variable:0' shape=() dtype=float32, numpy=2.5>"
    assert v == 2.5


@needs_3
def test_parameter_server_variables_clipped_as_keras(strategy):
    """Keras's clipping and AdamW's exclude_from_weight_decay on parameter-server variables
    (updated on the host): two variables, global_clipnorm over both, one excluded from decay;
    three steps against numpy."""
    coordinator = dtensor.ClusterCoordinator(strategy)
    w0 = [np.arange(6, dtype=np.float32).reshape(3, 2) / 10, np.ones(4, np.float32)]
    with strategy.scope():
        opt = dtensor.AdamW(0.1, weight_decay=0.5, global_clipnorm=1.0)
        ws = [dtensor.Variable(w, name=n) for w, n in zip(w0, ["kernel", "bias"])]
    opt.exclude_from_weight_decay(var_names=["bias"])
    grads = [[np.full(w.shape, k + 1, np.float32) for w in w0] for k in range(3)]

    def step(gs):
        def replica_fn(*gs):
            opt.apply_gradients(zip(gs, ws))
        strategy.run(replica_fn, args=tuple(dtensor.constant(g) for g in gs))
    for gs in grads:
        coordinator.schedule(step, args=(gs,))
        coordinator.join()
    w = [x.astype(np.float64) for x in w0]
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    for t, gs in enumerate(grads, 1):
        norm = np.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for g in gs))
        for i, g in enumerate(gs):
            g = g * (1.0 / max(norm, 1.0))
            if i == 0:
                w[i] = w[i] - 0.1 * 0.5 * w[i]
            m[i], v[i] = 0.9 * m[i] + 0.1 * g, 0.999 * v[i] + 0.001 * g * g
            w[i] = w[i] - 0.1 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m[i] / (
                np.sqrt(v[i]) + 1e-7)
    for x, want in zip(ws, w):
        np.testing.assert_allclose(x.numpy(), want, rtol=1e-5)


@needs_3
def test_optimizers_update_parameter_server_variables_as_keras(strategy):
    """Optimizers made in the strategy's scope keep their slots on the ps tasks too; a worker's
    apply_gradients inside strategy.run (as the tutorial's replica_fn) follows Keras's rules:
    three steps of SGD with momentum, Adam and RMSprop with momentum, against numpy."""
    coordinator = dtensor.ClusterCoordinator(strategy)
    w0 = np.arange(6, dtype=np.float32).reshape(3, 2) / 10
    with strategy.scope():
        opts = {"sgd": dtensor.SGD(0.1, momentum=0.9),
                "adam": dtensor.Adam(0.1),
                "rms": dtensor.RMSprop(0.1, momentum=0.5)}
        ws = {k: dtensor.Variable(w0) for k in opts}
    grads = [np.full((3, 2), k + 1, np.float32) * np.array([[1, -1]], np.float32)
             for k in range(3)]

    def step(g, name):
        def replica_fn(g):
            opts[name].apply_gradients([(g, ws[name])])
        strategy.run(replica_fn, args=(dtensor.constant(g),))
    for g in grads:
        for name in opts:
            coordinator.schedule(step, args=(g, name))
        coordinator.join()
    w, u = w0.astype(np.float64), np.zeros((3, 2))
    for g in grads:
        u = 0.9 * u - 0.1 * g
        w = w + u
    np.testing.assert_allclose(ws["sgd"].numpy(), w, rtol=1e-6)
    w, m, v = w0.astype(np.float64), np.zeros((3, 2)), np.zeros((3, 2))
    for t, g in enumerate(grads, 1):
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        w = w - 0.1 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m / (np.sqrt(v) + 1e-7)
    np.testing.assert_allclose(ws["adam"].numpy(), w, rtol=1e-5)
    w, s, u = w0.astype(np.float64), np.zeros((3, 2)), np.zeros((3, 2))
    for g in grads:
        s = 0.9 * s + 0.1 * g * g
        u = 0.5 * u + 0.1 * g / np.sqrt(s + 1e-7)
        w = w - u
    np.testing.assert_allclose(ws["rms"].numpy(), w, rtol=1e-5)
    coordinator.shutdown()
