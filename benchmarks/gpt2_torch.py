"""The PyTorch side of benchmarks/gpt2.sh: examples/gpt2.c's model in PyTorch, from the same
initial weights (the dtensor checkpoint `gpt2 --save-init PATH` writes, read with h5py), on the
same batches, with the same optimizer, so that tokens per second, peak memory and the loss of
every step read against dtensor's in the same run.

The model: learned token and position embeddings, pre-layer-norm blocks (causal attention
through scaled_dot_product_attention, an MLP with tanh GELU), a final layer norm, the output
projection tied to the token embedding, the mean cross-entropy in f32. AdamW (betas 0.9, 0.95,
weight decay 0.1 on the matrices and embeddings, none on biases and norms) after clipping the
gradients to a global norm (clip_grad_norm_'s max_norm / (norm + 1e-6), at most 1; dtensor's
is Keras's global_clipnorm, c / max(norm, c): about 1e-6 / norm relative apart). dtensor's Adam
is Keras's (epsilon added to sqrt(v) before the bias correction of the step size); PyTorch's
adds it after, so its epsilon is set each step to epsilon / sqrt(1 - beta_2^t), which makes the
two updates the same.

    python gpt2_torch.py --init ckpt.h5 --mode eager|compile|ddp|fsdp|tp [model flags]
        [--device cpu|cuda] [--dtype f32|bf16]
Modes ddp, fsdp (FSDP2's fully_shard per block and at the root) and tp (parallelize_module:
ColwiseParallel q, k, v and the MLP's first projection, RowwiseParallel the output
projections) run under torchrun with the gloo backend. Prints each step's loss and one line
`csv,torch-<mode>,<processes>,<tokens/s>,<peak RSS MiB (largest process)>,,,,<losses...>`.
Exits 3 when PyTorch (or h5py) is missing.
"""
import argparse
import math
import os
import resource
import sys
import time

try:
    import h5py
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"gpt2_torch: {e}", file=sys.stderr)
    sys.exit(3)


def batches(a, vocab, steps):
    """Each step's batch as examples/gpt2.c draws it (xorshift64; the permutation walk, or
    windows of a token file)."""
    mask = (1 << 64) - 1

    def walk(x):
        x ^= (x << 13) & mask
        x ^= x >> 7
        x ^= (x << 17) & mask
        return x

    corpus = None
    if a.tokens:
        corpus = np.fromfile(a.tokens, dtype="<u2").astype(np.int64)
    elif a.text:
        corpus = np.fromfile(a.text, dtype=np.uint8).astype(np.int64)
    nxt = None
    if corpus is None:
        x = 88172645463325252
        nxt = list(range(vocab))
        for i in range(vocab - 1, 0, -1):
            x = walk(x)
            j = x % (i + 1)
            nxt[i], nxt[j] = nxt[j], nxt[i]
    out = []
    for step in range(steps):
        x = (88172645463325252 + (step + 1) * 0x9E3779B97F4A7C15) & mask
        tok, tgt = [], []
        for _ in range(a.batch):
            x = walk(x)
            if corpus is not None:
                at = x % (len(corpus) - a.seq - 1)
                tok.append(corpus[at:at + a.seq])
                tgt.append(corpus[at + 1:at + a.seq + 1])
            else:
                c = x % vocab
                rt, rg = [], []
                for _ in range(a.seq):
                    rt.append(c)
                    c = nxt[c]
                    rg.append(c)
                tok.append(rt)
                tgt.append(rg)
        out.append((torch.tensor(np.array(tok)), torch.tensor(np.array(tgt))))
    return out


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.e = heads, d // heads
        self.ln_1 = torch.nn.LayerNorm(d, eps=1e-5)
        self.q = torch.nn.Linear(d, d)
        self.k = torch.nn.Linear(d, d)
        self.v = torch.nn.Linear(d, d)
        self.o = torch.nn.Linear(d, d)
        self.ln_2 = torch.nn.LayerNorm(d, eps=1e-5)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.proj = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.ln_1(x)
        # heads: those of this rank's shard under tensor parallelism (-1)
        q, k, v = (f(h).view(b, t, -1, self.e).transpose(1, 2) for f in (self.q, self.k, self.v))
        c = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(c.transpose(1, 2).reshape(b, t, -1))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self, a, vpad):
        super().__init__()
        self.wte = torch.nn.Embedding(vpad, a.d_model)
        self.wpe = torch.nn.Embedding(a.seq, a.d_model)
        self.h = torch.nn.ModuleList(Block(a.d_model, a.heads) for _ in range(a.layers))
        self.ln_f = torch.nn.LayerNorm(a.d_model, eps=1e-5)

    def forward(self, tok, tgt):
        x = self.wte(tok) + self.wpe.weight
        for blk in self.h:
            x = blk(x)
        logits = (self.ln_f(x) @ self.wte.weight.t()).float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))


def load(model, path, a):
    """The dtensor checkpoint's /variables into the model's parameters (dtensor keeps
    wq [D, H, E] and w1 [D, F]: nn.Linear's weight is their transpose)."""
    d = a.d_model
    with h5py.File(path, "r") as f:
        v = f["variables"]

        def get(name):
            x = np.asarray(v[name])
            kind = v[name].attrs.get("dtype", b"")
            kind = kind.decode() if isinstance(kind, bytes) else str(kind)
            if kind in ("bf16", "bfloat16"):  # raw 16 bits: the high half of an f32
                x = (x.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            return torch.from_numpy(np.asarray(x, dtype=np.float32))

        with torch.no_grad():
            model.wte.weight.copy_(get("wte"))
            model.wpe.weight.copy_(get("wpe"))
            model.ln_f.weight.copy_(get("ln_f.weight"))
            model.ln_f.bias.copy_(get("ln_f.bias"))
            for i, blk in enumerate(model.h):
                p = f"h.{i}."
                for n in "qkv":
                    getattr(blk, n).weight.copy_(get(p + f"attn.w{n}").reshape(d, d).t())
                    getattr(blk, n).bias.copy_(get(p + f"attn.b{n}").reshape(d))
                blk.o.weight.copy_(get(p + "attn.wo").reshape(d, d).t())
                blk.o.bias.copy_(get(p + "attn.bo"))
                blk.ln_1.weight.copy_(get(p + "ln_1.weight"))
                blk.ln_1.bias.copy_(get(p + "ln_1.bias"))
                blk.ln_2.weight.copy_(get(p + "ln_2.weight"))
                blk.ln_2.bias.copy_(get(p + "ln_2.bias"))
                blk.fc.weight.copy_(get(p + "mlp.w1").t())
                blk.fc.bias.copy_(get(p + "mlp.b1"))
                blk.proj.weight.copy_(get(p + "mlp.w2").t())
                blk.proj.bias.copy_(get(p + "mlp.b2"))


def clip(params, max_norm):
    """torch.nn.utils.clip_grad_norm_, also over a mix of tensors and tensor-parallel DTensors
    (whose norms are computed shard-wise and gathered as scalars)."""
    grads = [p.grad for p in params if p.grad is not None]
    norms = [torch.linalg.vector_norm(g) for g in grads]
    norms = [n.full_tensor() if hasattr(n, "full_tensor") else n for n in norms]
    total = torch.linalg.vector_norm(torch.stack(norms))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", required=True)
    ap.add_argument("--mode", choices=["eager", "compile", "ddp", "fsdp", "tp"], default="eager")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--tokens")
    ap.add_argument("--text")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    vpad = (a.vocab + 63) // 64 * 64
    dist = a.mode in ("ddp", "fsdp", "tp")
    rank, world = 0, 1
    if dist:
        import torch.distributed as tdist
        tdist.init_process_group("gloo")
        rank, world = tdist.get_rank(), tdist.get_world_size()
    torch.manual_seed(0)
    model = GPT(a, vpad)
    load(model, a.init, a)
    # --device cuda (eager mode, one process): the model and batches on the GPU; --dtype bf16:
    # parameters and activations in bf16 as examples/gpt2.c's --dtype bf16 (the loss in f32)
    dev = torch.device(a.device)
    model = model.to(device=dev, dtype=torch.bfloat16 if a.dtype == "bf16" else torch.float32)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    # the batch rows this process computes: its share under ddp and fsdp, all under tp
    lo, hi = 0, a.batch
    if a.mode in ("ddp", "fsdp"):
        lo, hi = rank * a.batch // world, (rank + 1) * a.batch // world
    if a.mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif a.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for blk in model.h:
            fully_shard(blk)
        fully_shard(model)
    elif a.mode == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)
        mesh = init_device_mesh("cpu", (world,))
        plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
                "o": RowwiseParallel(), "fc": ColwiseParallel(), "proj": RowwiseParallel()}
        for blk in model.h:
            parallelize_module(blk, mesh, plan)
    step_fn = model
    if a.mode == "compile":
        step_fn = torch.compile(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    plain = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": plain, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    data = batches(a, a.vocab, a.warmup + a.steps)
    losses = []
    t0 = time.perf_counter()
    for step, (tok, tgt) in enumerate(data):
        if step == a.warmup:
            if dist:
                tdist.barrier()
            sync()
            t0 = time.perf_counter()
        tok, tgt = tok.to(dev), tgt.to(dev)
        for g in opt.param_groups:  # Keras's epsilon placement (see the module docstring)
            g["eps"] = 1e-8 / math.sqrt(1 - 0.95 ** (step + 1))
        opt.zero_grad(set_to_none=True)
        loss = step_fn(tok[lo:hi], tgt[lo:hi])
        loss.backward()
        clip(model.parameters(), a.clip)
        opt.step()
        value = loss.detach()
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        if a.mode in ("ddp", "fsdp"):  # the mean over every token of the global batch
            value = value.clone() * (hi - lo) / a.batch
            tdist.all_reduce(value)
        losses.append(float(value))
        if rank == 0:
            print(f"torch-{a.mode} step {step:3d} loss {losses[-1]:.6f}", flush=True)
    sync()
    seconds = time.perf_counter() - t0
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss], dtype=torch.float64)
    if dist:
        tdist.all_reduce(rss, op=tdist.ReduceOp.MAX)
    if rank == 0:
        tps = a.steps * a.batch * a.seq / seconds
        print(f"csv,torch-{a.mode},{world},{world},{tps:.1f},{float(rss) / 1024:.1f},,,,"
              + ",".join(f"{x:.7g}" for x in losses))
    if dist:
        tdist.destroy_process_group()


if __name__ == "__main__":
    main()
