"""GPT-2 in Python: the twin of examples/gpt2.c, one model code under the sharding presets.

The same architecture as the C program (GPT-2 small by default: 12 layers, 12 heads, d_model
768, GPT-2's vocabulary of 50257 padded to a multiple of 64): learned token and position
embeddings, pre-layer-norm blocks (attention with biased projections through
``dtensor.nn.scaled_dot_product_attention``, causal; an MLP of 4 d_model with tanh GELU), a
final layer norm, the output projection tied to the token embedding, the mean next-token
cross-entropy in float32. GPT-2's initialisation from ``--seed`` (the C program's draws:
parameter i is ``stateless_normal`` with seed ``[seed, i + 1]``), or the C program's
``--save-init`` checkpoint with ``--load-init``. AdamW (betas 0.9, 0.95, weight decay 0.1 on
the matrices and embeddings only: the rest excluded with ``exclude_from_weight_decay``) after
clipping the gradients to a global norm (Keras's ``global_clipnorm``). Data: the synthetic
next-token task of examples/gpt.c at this vocabulary, or ``--tokens FILE`` (uint16 token ids) /
``--text FILE`` (bytes), the same batches as the C program's.

Each parameter is created in its preset's stored layout and relaid out to its used layout
where the forward pass reads it (an all-gather under the fully sharded presets); inputs are
split over "batch", the residual stream along the sequence over "model".

    python examples/gpt2.py --preset fsdp --layers 2 --d-model 64 --heads 4 --vocab 500 \\
        --seq 16 --batch 4 --steps 5
    mpiexec.mpich -n 2 python examples/gpt2.py --preset tensor ...

Prints each step's loss ("PRESET step N loss X", as the C program) and, at the end, one line
``csv,preset,devices,clients,tokens_per_second,peak_rss_mib,losses...`` (client 0's peak
RSS). ``--devices N``: CPU devices per client (default: DTENSOR_CPU_DEVICES, else 1).
"""
import argparse
import math
import os
import resource
import sys
import time

import numpy as np

import dtensor

U = dtensor.UNSHARDED
PRESETS = ("one", "data", "fsdp", "tensor", "2d")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="one", choices=PRESETS)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=2024)
    p.add_argument("--dtype", default="f32", choices=("f32", "bf16"))
    p.add_argument("--model-size", type=int, default=0)
    p.add_argument("--devices", type=int, default=None)
    p.add_argument("--load-init", default=None)
    data = p.add_mutually_exclusive_group()
    data.add_argument("--tokens", default=None)
    data.add_argument("--text", default=None)
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 0 or a.layers < 1 or a.heads < 1 or a.d_model < 1 or \
            a.d_model % a.heads or a.vocab < 2 or a.seq < 1 or a.batch < 1 or \
            not a.lr > 0 or not a.clip > 0 or a.model_size < 0:
        p.error("bad sizes: every count positive, heads dividing d_model, lr and clip > 0")
    a.vpad = (a.vocab + 63) // 64 * 64
    a.np_dtype = np.float32 if a.dtype == "f32" else dtensor.bfloat16
    return a


# ---- parameters ---------------------------------------------------------------------------

def describe(cfg):
    """[(name, shape, role, init scale (0: zeros, -1: ones), weight decay)], in the C
    program's order (the order gives each its random key)."""
    D, H, E, F = cfg.d_model, cfg.heads, cfg.d_model // cfg.heads, 4 * cfg.d_model
    s, out = 0.02, 0.02 / math.sqrt(2.0 * cfg.layers)
    ps = [("wte", (cfg.vpad, D), "vocab", s, True), ("wpe", (cfg.seq, D), "replicated", s, True)]
    for layer in range(cfg.layers):
        h = f"h.{layer}."
        ps += [(h + "ln_1.weight", (D,), "replicated", -1, False),
               (h + "ln_1.bias", (D,), "replicated", 0, False),
               (h + "attn.wq", (D, H, E), "column", s, True),
               (h + "attn.wk", (D, H, E), "column", s, True),
               (h + "attn.wv", (D, H, E), "column", s, True),
               (h + "attn.bq", (H, 1, E), "column_bias", 0, False),
               (h + "attn.bk", (H, 1, E), "column_bias", 0, False),
               (h + "attn.bv", (H, 1, E), "column_bias", 0, False),
               (h + "attn.wo", (H, E, D), "row", out, True),
               (h + "attn.bo", (D,), "replicated", 0, False),
               (h + "ln_2.weight", (D,), "replicated", -1, False),
               (h + "ln_2.bias", (D,), "replicated", 0, False),
               (h + "mlp.w1", (D, F), "column", s, True),
               (h + "mlp.b1", (F,), "column_bias", 0, False),
               (h + "mlp.w2", (F, D), "row", out, True),
               (h + "mlp.b2", (D,), "replicated", 0, False)]
    return ps + [("ln_f.weight", (D,), "replicated", -1, False),
                 ("ln_f.bias", (D,), "replicated", 0, False)]


class Model:
    """The parameters in their stored layouts and the forward pass."""

    def __init__(self, cfg, strategy):
        self.cfg, self.strategy = cfg, strategy
        self.mesh = strategy.mesh
        self.params = describe(cfg)
        self.layouts = [strategy.parameter_layouts(role, shape)
                        for _, shape, role, _, _ in self.params]
        self.vars = []
        described = zip(self.params, self.layouts)
        for i, ((name, shape, _, scale, _), (stored, _)) in enumerate(described):
            if cfg.load_init:
                value = dtensor.train.load_variable(cfg.load_init, "variables/" + name, stored)
                value = dtensor.cast(value, cfg.np_dtype)
            elif scale > 0:
                value = dtensor.random.stateless_normal(shape, seed=[cfg.seed, i + 1],
                                                        stddev=scale, dtype=cfg.np_dtype,
                                                        layout=stored)
            else:
                fill = dtensor.ones if scale < 0 else dtensor.zeros
                value = dtensor.call_with_layout(fill, stored, shape=shape, dtype=cfg.np_dtype)
            self.vars.append(dtensor.DVariable(value, name=name))
        self.index = {p[0]: i for i, p in enumerate(self.params)}

    def use(self, name):
        """A parameter where it is read: relaid out to its used layout (nothing moves when that
        is its stored layout)."""
        i = self.index[name]
        return dtensor.relayout(self.vars[i].read_value(), self.layouts[i][1])

    def whole(self, x):
        """x split along the sequence made whole on every model shard (tensor parallel)."""
        return dtensor.relayout(x, dtensor.Layout.batch_sharded(self.mesh, "batch", len(x.shape)))

    def norm(self, x, prefix):
        return dtensor.nn.layer_norm(x, self.use(prefix + ".weight"), self.use(prefix + ".bias"),
                                     1e-5)

    def loss(self, tok, tgt):
        """The mean next-token cross-entropy of tokens tok [B, T] against tgt [B, T]."""
        cfg, seq = self.cfg, self.strategy.sequence_layout(3)
        x = dtensor.call_with_layout(dtensor.gather_rows, seq, self.use("wte"), tok)
        x = x + self.use("wpe")
        for layer in range(cfg.layers):
            h = f"h.{layer}."
            a = self.whole(self.norm(x, h + "ln_1"))
            q, k, v = (dtensor.einsum("btd,dhe->bhte", a, self.use(h + "attn.w" + n)) +
                       self.use(h + "attn.b" + n) for n in "qkv")
            t = dtensor.nn.scaled_dot_product_attention(q, k, v, is_causal=True)
            o = dtensor.call_with_layout(dtensor.einsum, seq, "bhte,hed->btd", t,
                                         self.use(h + "attn.wo"))
            x = x + (o + self.use(h + "attn.bo"))
            a = self.whole(self.norm(x, h + "ln_2"))
            t = dtensor.nn.gelu(dtensor.matmul(a, self.use(h + "mlp.w1")) +
                                self.use(h + "mlp.b1"), approximate=True)
            u = dtensor.call_with_layout(dtensor.matmul, seq, t, self.use(h + "mlp.w2"))
            x = x + (u + self.use(h + "mlp.b2"))
        logits = dtensor.einsum("btd,vd->btv", self.whole(self.norm(x, "ln_f")), self.use("wte"))
        if cfg.np_dtype != np.float32:
            logits = dtensor.cast(logits, np.float32)
        return dtensor.reduce_mean(
            dtensor.nn.sparse_softmax_cross_entropy_with_logits(tgt, logits))


# ---- data ---------------------------------------------------------------------------------

M64 = (1 << 64) - 1


class Batches:
    """The C program's batches: B sequences of the corpus at offsets drawn by xorshift64, or of
    a fixed random permutation walked from random starts."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.corpus = None
        path = cfg.tokens or cfg.text
        if path:
            self.corpus = np.fromfile(path, np.uint16 if cfg.tokens else np.uint8).astype(
                np.int64)
            if len(self.corpus) < cfg.seq + 2:
                sys.exit(f"gpt2: {path} holds {len(self.corpus)} tokens, fewer than a sequence "
                         f"of {cfg.seq} + 2")
            if self.corpus.max() >= cfg.vocab:
                sys.exit(f"gpt2: {path}: a token is outside the vocabulary of {cfg.vocab}")
            return
        self.x = 88172645463325252
        nxt = list(range(cfg.vocab))
        for i in range(cfg.vocab - 1, 0, -1):
            j = self.rand() % (i + 1)
            nxt[i], nxt[j] = nxt[j], nxt[i]
        self.next = nxt

    def rand(self):
        x = self.x
        x ^= (x << 13) & M64
        x ^= x >> 7
        x ^= (x << 17) & M64
        self.x = x
        return x

    def __call__(self, step):
        cfg = self.cfg
        self.x = (88172645463325252 + (step + 1) * 0x9E3779B97F4A7C15) & M64
        tok = np.empty((cfg.batch, cfg.seq), np.int32)
        tgt = np.empty((cfg.batch, cfg.seq), np.int32)
        for b in range(cfg.batch):
            if self.corpus is not None:
                at = self.rand() % (len(self.corpus) - cfg.seq - 1)
                tok[b] = self.corpus[at:at + cfg.seq]
                tgt[b] = self.corpus[at + 1:at + cfg.seq + 1]
            else:
                c = self.rand() % cfg.vocab
                for t in range(cfg.seq):
                    tok[b, t] = c
                    c = self.next[c]
                    tgt[b, t] = c
        return tok, tgt


# ---- training -----------------------------------------------------------------------------

def strategy_of(cfg):
    if cfg.preset != "one":
        return dtensor.distribute.sharding_preset(cfg.preset, cfg.model_size or None
                                                  if cfg.preset == "2d" else None)
    return OneDevice()


class OneDevice:
    """One device (global device 0) as a 1 x 1 mesh "batch" x "model": everything whole."""

    def __init__(self):
        self.mesh = dtensor.create_mesh([("batch", 1), ("model", 1)], devices=["CPU:0"])

    def parameter_layouts(self, role, shape):
        rep = dtensor.Layout.replicated(self.mesh, len(shape))
        return rep, rep

    def sequence_layout(self, rank):
        return dtensor.Layout(["batch", "model"] + [U] * (rank - 2), self.mesh)


def fits(cfg, n):
    """Whether the preset splits evenly here (as the C program's check)."""
    model = {"tensor": n, "2d": cfg.model_size or 2}.get(cfg.preset, 1)
    if cfg.preset == "one":
        return True
    return n % model == 0 and cfg.batch % (n // model) == 0 and cfg.heads % model == 0 and \
        cfg.vpad % model == 0 and cfg.seq % model == 0


def train(cfg):
    strategy = strategy_of(cfg)
    model = Model(cfg, strategy)
    opt = dtensor.keras.optimizers.AdamW(cfg.lr, weight_decay=0.1, beta_1=0.9, beta_2=0.95,
                                         epsilon=1e-8, global_clipnorm=cfg.clip)
    opt.exclude_from_weight_decay(var_list=[v for v, p in zip(model.vars, model.params)
                                            if not p[4]])
    batches = Batches(cfg)
    inputs = dtensor.Layout.batch_sharded(model.mesh, "batch", 2)
    losses = []
    t0 = time.perf_counter()
    for step in range(cfg.warmup + cfg.steps):
        if step == cfg.warmup:
            dtensor.barrier()
            t0 = time.perf_counter()
        tok, tgt = (dtensor.dtensor_from_array(a, inputs) for a in batches(step))
        with dtensor.GradientTape() as tape:
            loss = model.loss(tok, tgt)
        grads = tape.gradient(loss, model.vars)
        opt.apply_gradients(zip(grads, model.vars))
        value = float(dtensor.gather(loss))
        losses.append(value)
        if dtensor.client_id() == 0:
            print(f"{cfg.preset} step {step:3d} loss {value:.9g}", flush=True)
    seconds = time.perf_counter() - t0
    return losses, seconds


def main(argv=None):
    cfg = parse(sys.argv[1:] if argv is None else argv)
    dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=cfg.devices)
    n = dtensor.num_global_devices("CPU")
    total = sum(int(np.prod(p[1])) for p in describe(cfg))
    if dtensor.client_id() == 0:
        print(f"gpt2.py: {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, "
              f"vocabulary {cfg.vocab} (embedding rows {cfg.vpad}), sequence {cfg.seq}, batch "
              f"{cfg.batch}, {cfg.dtype}, {total} parameters, {n} devices, "
              f"{dtensor.num_clients()} clients", flush=True)
    if not fits(cfg, n):
        if dtensor.client_id() == 0:
            print(f"gpt2.py: preset {cfg.preset} does not fit {n} devices with this "
                  f"configuration", file=sys.stderr)
        dtensor.shutdown_accelerator_system()
        return 2
    losses, seconds = train(cfg)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, client 0's
    if dtensor.client_id() == 0:
        tps = cfg.steps * cfg.batch * cfg.seq / seconds
        print(f"csv,{cfg.preset},{n},{dtensor.num_clients()},{tps:.1f},{rss / 1024:.1f}," +
              ",".join(f"{v:.9g}" for v in losses))
    dtensor.shutdown_accelerator_system()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    sys.exit(main())
