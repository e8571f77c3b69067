"""The sharding presets for transformers (dtensor.DataParallelStrategy, FullyShardedStrategy,
TensorParallelStrategy, FullyShardedTensorParallelStrategy): their meshes and the layouts of
parameters by role and of activations, against the rules they document (6 devices in all);
a layer computed under each preset from its stored layouts equals numpy's."""
import numpy as np
import pytest

import dtensor

U = dtensor.UNSHARDED
D, F = 8, 12  # a small width and MLP hidden size


def specs(layout):
    return list(layout.sharding_specs)


@pytest.mark.parametrize("cls,name,shape", [
    (dtensor.DataParallelStrategy, "data_parallel", (6, 1)),
    (dtensor.FullyShardedStrategy, "fully_sharded", (6, 1)),
    (dtensor.TensorParallelStrategy, "tensor_parallel", (1, 6)),
    (dtensor.FullyShardedTensorParallelStrategy, "fully_sharded_tensor_parallel", (3, 2)),
])
def test_meshes(runtime, cls, name, shape):
    s = cls()
    assert s.name == name
    assert tuple(s.mesh.dim_names) == ("batch", "model")
    assert (s.mesh.dim_size("batch"), s.mesh.dim_size("model")) == shape
    assert s.num_replicas_in_sync == shape[0]
    assert specs(s.input_layout(2)) == ["batch", U]
    assert specs(s.sequence_layout(3)) == ["batch", "model", U]


# per role: (shape, the used layout under tensor parallelism, the stored layout under the 2-D
# preset's "batch" axis of 3)
ROLES = {
    "column": ((D, F), [U, "model"], ["batch", "model"]),
    "column_bias": ((F,), ["model"], ["model"]),
    "row": ((F, D), ["model", U], ["model", "batch"]),
    "vocab": ((30, D), ["model", U], ["model", "batch"]),
    "replicated": ((D,), [U], ["batch"]),
}


@pytest.mark.parametrize("role", sorted(ROLES))
def test_parameter_layouts(runtime, role):
    shape, tensor_used, two_d_stored = ROLES[role]
    rep = [U] * len(shape)
    stored, used = dtensor.DataParallelStrategy().parameter_layouts(role, shape)
    assert specs(stored) == rep and specs(used) == rep
    stored, used = dtensor.FullyShardedStrategy().parameter_layouts(role, shape)
    assert specs(stored) == ["batch"] + rep[1:] and specs(used) == rep
    stored, used = dtensor.TensorParallelStrategy().parameter_layouts(role, shape)
    assert specs(stored) == tensor_used and specs(used) == tensor_used
    s = dtensor.FullyShardedTensorParallelStrategy(model_size=2)
    stored, used = s.parameter_layouts(role, shape)
    assert specs(used) == tensor_used and specs(stored) == two_d_stored
    assert s.parameter_layout(role, shape) == stored


def test_short_first_axis_stays_whole(runtime):
    """A first axis shorter than the "batch" axis is not split: the next one is, or none."""
    s = dtensor.FullyShardedStrategy()
    assert specs(s.parameter_layout("replicated", (4, 12))) == [U, "batch"]
    assert specs(s.parameter_layout("replicated", (4, 5))) == [U, U]


def test_by_name(runtime):
    for name, cls in [("data", dtensor.DataParallelStrategy), ("fsdp",
                      dtensor.FullyShardedStrategy), ("tensor", dtensor.TensorParallelStrategy),
                      ("2d", dtensor.FullyShardedTensorParallelStrategy),
                      ("fully_sharded", dtensor.FullyShardedStrategy)]:
        assert type(dtensor.distribute.sharding_preset(name)) is cls
    assert dtensor.distribute.FullyShardedStrategy is dtensor.FullyShardedStrategy


@pytest.mark.parametrize("preset", ["data", "fsdp", "tensor", "2d"])
def test_mlp_under_each_preset(runtime, preset):
    """One model code: parameters created in their stored layouts, relaid out where used; the
    activations [batch, sequence, D] in the sequence layout. Same result as numpy."""
    s = dtensor.distribute.sharding_preset(preset)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 6, D))
    w1, b1, w2 = rng.standard_normal((D, F)), rng.standard_normal(F), rng.standard_normal((F, D))
    params = {}
    for name, role, a in [("w1", "column", w1), ("b1", "column_bias", b1), ("w2", "row", w2)]:
        stored, used = s.parameter_layouts(role, a.shape)
        params[name] = (dtensor.DVariable(dtensor.dtensor_from_array(a, stored)), used)

    def use(name):
        v, used = params[name]
        return dtensor.relayout(v.read_value(), used)

    seq = s.sequence_layout(3)
    h = dtensor.relayout(dtensor.dtensor_from_array(x, seq), s.input_layout(3))
    y = dtensor.call_with_layout(dtensor.matmul, seq,
                                 dtensor.nn.relu(dtensor.matmul(h, use("w1")) + use("b1")),
                                 use("w2"))
    assert y.layout == seq
    np.testing.assert_allclose(dtensor.gather(y), np.maximum(x @ w1 + b1, 0) @ w2, rtol=1e-12,
                               atol=1e-12)


def test_errors(runtime):
    with pytest.raises(dtensor.errors.InvalidArgumentError, match="model axis of 4"):
        dtensor.FullyShardedTensorParallelStrategy(model_size=4)  # 4 does not divide 6
    with pytest.raises(dtensor.errors.InvalidArgumentError, match="model_size 2 given"):
        dtensor.DataParallelStrategy(model_size=2)
    with pytest.raises(dtensor.errors.InvalidArgumentError, match="model_size 0"):
        dtensor.FullyShardedTensorParallelStrategy(model_size=0)
    with pytest.raises(dtensor.errors.InvalidArgumentError, match="model_size 2147483648"):
        dtensor.FullyShardedTensorParallelStrategy(model_size=2**31)
    with pytest.raises(dtensor.errors.InvalidArgumentError, match="rank 1: expected"):
        dtensor.DataParallelStrategy().sequence_layout(1)
    with pytest.raises(dtensor.errors.InvalidArgumentError, match="rank 2147483648"):
        dtensor.DataParallelStrategy().sequence_layout(2**31)
    with pytest.raises(dtensor.errors.InvalidArgumentError, match="role 'colum'"):
        dtensor.TensorParallelStrategy().parameter_layouts("colum", (2, 2))
    with pytest.raises(dtensor.errors.InvalidArgumentError, match=r"shape \(2, -1\)"):
        dtensor.TensorParallelStrategy().parameter_layouts("row", (2, -1))
    with pytest.raises(dtensor.errors.InvalidArgumentError, match="'zero3'"):
        dtensor.distribute.sharding_preset("zero3")
    with pytest.raises(TypeError, match="abstract"):
        dtensor.presets.ShardingPreset()
