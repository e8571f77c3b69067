"""A GPT-style decoder trained on a 2-D mesh batch x model, as Megatron-LM shards it (the Python
twin of examples/gpt.c, with the same initial parameters: the same Philox seeds): the batch over
`batch`; attention heads and the MLP's hidden axis over `model` (column- then row-parallel
projections: one all-reduce over `model` after attention and one after the MLP); the token
embedding and the tied output projection split over the vocabulary, with a vocabulary-parallel
cross-entropy (the logits are never gathered). GradientTape and AdamW.

    python3 examples/gpt.py [1|data|model|2d] [steps]     # one client of 4 CPU devices
    python3 examples/gpt.py compare [steps]                # every sharding: the same curve
    mpiexec.mpich -n 2 python3 examples/gpt.py compare     # 2 clients x 2 devices
"""
import os
import sys

import numpy as np

import dtensor

V, T, D, H, F, NL, B = 512, 16, 64, 4, 256, 2, 8
E = D // H
U = dtensor.UNSHARDED
SHARDINGS = {"1": (1, 1), "data": (4, 1), "model": (1, 4), "2d": (2, 2)}


def param_specs():
    """(name, shape, layout axes, scale): N(0, scale) from Philox (seed 2024, key index + 1);
    scale 0 zeros, -1 ones, in the order of examples/gpt.c."""
    s, out = 0.02, 0.02 / np.sqrt(2.0 * NL)
    specs = [("wte", (V, D), ("model", U), s), ("wpe", (T, D), (U, U), s)]
    for l in range(NL):
        specs += [(f"h{l}.ln1.gamma", (D,), (U,), -1), (f"h{l}.ln1.beta", (D,), (U,), 0),
                  (f"h{l}.wq", (D, H, E), (U, "model", U), s),
                  (f"h{l}.wk", (D, H, E), (U, "model", U), s),
                  (f"h{l}.wv", (D, H, E), (U, "model", U), s),
                  (f"h{l}.wo", (H, E, D), ("model", U, U), out),
                  (f"h{l}.ln2.gamma", (D,), (U,), -1), (f"h{l}.ln2.beta", (D,), (U,), 0),
                  (f"h{l}.w1", (D, F), (U, "model"), s), (f"h{l}.b1", (F,), ("model",), 0),
                  (f"h{l}.w2", (F, D), ("model", U), out), (f"h{l}.b2", (D,), (U,), 0)]
    return specs + [("lnf.gamma", (D,), (U,), -1), ("lnf.beta", (D,), (U,), 0)]


def make_params(mesh):
    params = {}
    for i, (name, shape, axes, scale) in enumerate(param_specs()):
        layout = dtensor.Layout(list(axes), mesh)
        if scale > 0:
            value = dtensor.random.stateless_normal(shape, (2024, i + 1), stddev=scale,
                                                    layout=layout)
        else:
            value = dtensor.fill(shape, 1.0 if scale < 0 else 0.0, np.float32, layout)
        params[name] = dtensor.DVariable(value, name=name)
    return params


def forward(p, tok, tgt, causal):
    """Mean next-token cross-entropy of tok [B, T] against tgt [B, T]."""
    x = dtensor.nn.embedding_lookup(p["wte"], tok) + p["wpe"]
    for l in range(NL):
        h = dtensor.nn.layer_norm(x, p[f"h{l}.ln1.gamma"], p[f"h{l}.ln1.beta"])
        q, k, v = (dtensor.einsum("btd,dhe->bthe", h, p[f"h{l}.w{n}"]) for n in "qkv")
        s = dtensor.einsum("bthe,bshe->bhts", q, k) * (1.0 / np.sqrt(E))
        s = dtensor.nn.softmax(dtensor.where(causal, s, -1e9), axis=-1)
        x = x + dtensor.einsum("bthe,hed->btd", dtensor.einsum("bhts,bshe->bthe", s, v),
                               p[f"h{l}.wo"])
        h = dtensor.nn.layer_norm(x, p[f"h{l}.ln2.gamma"], p[f"h{l}.ln2.beta"])
        m = dtensor.nn.gelu(dtensor.matmul(h, p[f"h{l}.w1"]) + p[f"h{l}.b1"])
        x = x + (dtensor.matmul(m, p[f"h{l}.w2"]) + p[f"h{l}.b2"])
    logits = dtensor.einsum("btd,vd->btv",
                            dtensor.nn.layer_norm(x, p["lnf.gamma"], p["lnf.beta"]), p["wte"])
    return dtensor.reduce_mean(dtensor.nn.sparse_softmax_cross_entropy_with_logits(tgt, logits))


def batch_of(step, nxt):
    """B sequences of the permutation walk from random starts (the same on every client)."""
    rng = np.random.default_rng(step + 1)
    tok = np.empty((B, T), np.int32)
    c = rng.integers(0, V, B)
    for t in range(T):
        tok[:, t] = c
        c = nxt[c]
    tgt = np.concatenate([tok[:, 1:], nxt[tok[:, -1:]]], axis=1)
    return tok, tgt


def train(name, steps, everywhere):
    batch, model = SHARDINGS[name]
    mesh = dtensor.create_mesh([("batch", batch), ("model", model)], device_type="CPU",
                               devices=[f"CPU:{i}" for i in range(batch * model)])
    params = make_params(mesh)
    optimizer = dtensor.AdamW(learning_rate=3e-3, weight_decay=0.01)
    causal = dtensor.dtensor_from_array(np.tril(np.ones((T, T), bool)),
                                        dtensor.Layout.replicated(mesh, 2))
    rows = dtensor.Layout(["batch", U], mesh)
    nxt = np.random.default_rng(0).permutation(V)
    losses = []
    for step in range(steps):
        tok, tgt = batch_of(step, nxt)
        with dtensor.GradientTape() as tape:
            loss = forward(params, dtensor.dtensor_from_array(tok, rows),
                           dtensor.dtensor_from_array(tgt, rows), causal)
        names = list(params)
        grads = tape.gradient(loss, [params[n] for n in names])
        optimizer.apply_gradients(zip(grads, [params[n] for n in names]))
        # the loss through a copy on every device: under "1" the other clients hold none of it
        losses.append(float(dtensor.gather(dtensor.copy_to_mesh(loss, everywhere))))
    return losses


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "2d"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    clients = int(os.environ.get("PMI_SIZE", "1"))
    dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=4 // clients)
    everywhere = dtensor.Layout.replicated(
        dtensor.create_mesh([("x", 4)], device_type="CPU"), 0)
    me = dtensor.client_id() == 0
    rc = 0
    if mode == "compare":
        curves = {name: train(name, steps, everywhere) for name in SHARDINGS}
        worst = max(abs(a - b) / abs(b) for name in SHARDINGS
                    for a, b in zip(curves[name], curves["1"]))
        for name, curve in curves.items():
            if me:
                print(f"{name:5} batch={SHARDINGS[name][0]},model={SHARDINGS[name][1]}: "
                      f"first loss {curve[0]:.6f}, last {curve[-1]:.6f}")
        ok = worst <= 1e-5 and curves["1"][-1] < curves["1"][0]
        if me:
            print(f"largest relative difference from one device's curve: {worst:.2e} "
                  f"(<= 1e-5: {'yes' if ok else 'NO'})")
        rc = 0 if ok else 1
    elif mode in SHARDINGS:
        for step, loss in enumerate(train(mode, steps, everywhere)):
            if me:
                print(f"{mode} step {step:2d} loss {loss:.6f}")
    else:
        print(f"gpt.py: unknown mode {mode} (1, data, model, 2d, compare)", file=sys.stderr)
        rc = 2
    dtensor.shutdown_accelerator_system()
    return rc


if __name__ == "__main__":
    sys.exit(main())
