"""The baseline of the GPT example's benchmark (examples/gpt.c, `gpt bench`): the same
decoder in PyTorch eager on one device, so that dtensor's steps per second under the sharding
"1" (one device) read against it in the same run.

The same model: 2 blocks, d_model 64, 4 heads, vocabulary 512, sequence 16, batch 8; layer
norms, causal attention written with the example's einsums, an erf gelu MLP, a tied output
projection, the cross-entropy in f32, AdamW (lr 3e-3, weight decay 0.01), the same synthetic
next-token task. Parameters and activations in f32 or bf16 (as `gpt ... bf16`).

    python benchmarks/gpt_torch.py --steps 50 --dtype bf16 --device cuda
prints `pytorch,<steps per second>,<first loss>,<last loss>,<steps per second of CPU time>`
(the last the figure to compare on a loaded machine). Exits 3 when PyTorch is missing.
"""
import argparse
import math
import sys
import time

try:
    import torch
except ImportError:
    print("gpt_torch: PyTorch is not importable", file=sys.stderr)
    sys.exit(3)

V, T, D, H, NL, B = 512, 16, 64, 4, 2, 8
E, F = D // H, 4 * D


def batches(steps):
    """Each step's B sequences of a fixed permutation walk, as examples/gpt.c draws them."""
    mask = (1 << 64) - 1

    def walk(x):
        x ^= (x << 13) & mask
        x ^= x >> 7
        x ^= (x << 17) & mask
        return x

    x = 88172645463325252
    nxt = list(range(V))
    for i in range(V - 1, 0, -1):
        x = walk(x)
        j = x % (i + 1)
        nxt[i], nxt[j] = nxt[j], nxt[i]
    for step in range(steps):
        x = (88172645463325252 + (step + 1) * 0x9E3779B97F4A7C15) & mask
        tok, tgt = [], []
        for _ in range(B):
            x = walk(x)
            c = x % V
            row_tok, row_tgt = [], []
            for _ in range(T):
                row_tok.append(c)
                c = nxt[c]
                row_tgt.append(c)
            tok.append(row_tok)
            tgt.append(row_tgt)
        yield tok, tgt


def make_params(dtype, device):
    g = torch.Generator().manual_seed(2024)
    s, out = 0.02, 0.02 / math.sqrt(2.0 * NL)

    def normal(shape, scale):
        return (torch.randn(shape, generator=g) * scale).to(dtype).to(device).requires_grad_()

    def const(shape, v):
        return torch.full(shape, v, dtype=dtype, device=device, requires_grad=True)

    p = {"wte": normal((V, D), s), "wpe": normal((T, D), s),
         "lnf.g": const((D,), 1.0), "lnf.b": const((D,), 0.0)}
    for l in range(NL):
        p.update({f"{l}.ln1.g": const((D,), 1.0), f"{l}.ln1.b": const((D,), 0.0),
                  f"{l}.wq": normal((D, H, E), s), f"{l}.wk": normal((D, H, E), s),
                  f"{l}.wv": normal((D, H, E), s), f"{l}.wo": normal((H, E, D), out),
                  f"{l}.ln2.g": const((D,), 1.0), f"{l}.ln2.b": const((D,), 0.0),
                  f"{l}.w1": normal((D, F), s), f"{l}.b1": const((F,), 0.0),
                  f"{l}.w2": normal((F, D), out), f"{l}.b2": const((D,), 0.0)})
    return p


def forward(p, tok, tgt, causal):
    ln = torch.nn.functional.layer_norm
    x = p["wte"][tok] + p["wpe"]
    for l in range(NL):
        h = ln(x, (D,), p[f"{l}.ln1.g"], p[f"{l}.ln1.b"], 1e-5)
        q, k, v = (torch.einsum("btd,dhe->bthe", h, p[f"{l}.w{n}"]) for n in "qkv")
        s = torch.einsum("bthe,bshe->bhts", q, k) * (1.0 / math.sqrt(E))
        s = torch.softmax(torch.where(causal, s, torch.full_like(s, -1e9)), dim=-1)
        c = torch.einsum("bhts,bshe->bthe", s, v)
        x = x + torch.einsum("bthe,hed->btd", c, p[f"{l}.wo"])
        h = ln(x, (D,), p[f"{l}.ln2.g"], p[f"{l}.ln2.b"], 1e-5)
        m = torch.nn.functional.gelu(h @ p[f"{l}.w1"] + p[f"{l}.b1"])
        x = x + (m @ p[f"{l}.w2"] + p[f"{l}.b2"])
    logits = torch.einsum("btd,vd->btv", ln(x, (D,), p["lnf.g"], p["lnf.b"], 1e-5),
                          p["wte"]).float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpt_torch: no CUDA device", file=sys.stderr)
        sys.exit(3)
    torch.set_num_threads(1)  # one device, as dtensor's sharding "1" on one CPU device
    dtype = torch.float32 if a.dtype == "f32" else torch.bfloat16
    p = make_params(dtype, a.device)
    opt = torch.optim.AdamW(p.values(), lr=3e-3, weight_decay=0.01)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device))
    data = [(torch.tensor(t, device=a.device), torch.tensor(g, device=a.device))
            for t, g in batches(a.steps + 3)]
    losses = []

    def step(tok, tgt):
        opt.zero_grad(set_to_none=True)
        loss = forward(p, tok, tgt, causal)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # a sync per step, as dtensor's example reads its loss

    for tok, tgt in data[:3]:
        step(tok, tgt)
    t0, c0 = time.perf_counter(), time.process_time()
    for tok, tgt in data[3:]:
        step(tok, tgt)
    t, c = time.perf_counter() - t0, time.process_time() - c0
    print(f"pytorch,{a.steps / t:.2f},{losses[0]:.6f},{losses[-1]:.6f},{a.steps / c:.2f}")


if __name__ == "__main__":
    main()
