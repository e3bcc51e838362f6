"""Train a small GPT with flashgen's causal attention and with PyTorch's SDPA,
from the same seed on the same data, and compare the loss curves and speed.

    python examples/train_gpt.py                       # GPU: bf16, 6 layers, 300 steps
    python examples/train_gpt.py --steps 20 --jsonl results.jsonl

The data is synthetic and bundled in the sense that it is generated here: a
first-order Markov chain over a small vocabulary with a seeded random
transition matrix, so the loss falls towards the chain's entropy (printed)
and both runs see the same batches.  Each run builds the model from the same
seed, so step 0 starts from the same weights; after that the curves may part
by rounding alone (bf16), and they should agree within that noise.

Needs torch, triton and flashgen (the attention module is built from a spec
with `flashgen.load`); runs on the CPU under TRITON_INTERPRET=1 with --device
cpu --dtype fp32 and tiny sizes (the tests do that).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

import flashgen

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def markov_batches(vocab: int, batch: int, length: int, seed: int, device: str):
    """An endless stream of (inputs, targets) from a seeded Markov chain, and
    the chain's entropy rate in nats (the loss a perfect model reaches)."""
    g = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(vocab, vocab, generator=g)
    probs = torch.softmax(logits, -1)
    stationary = torch.full((vocab,), 1.0 / vocab)
    for _ in range(200):
        stationary = stationary @ probs
    entropy = -(stationary[:, None] * probs * probs.clamp_min(1e-30).log()).sum().item()

    def stream():
        while True:
            tokens = torch.empty(batch, length + 1, dtype=torch.long)
            tokens[:, 0] = torch.multinomial(stationary, batch, replacement=True, generator=g)
            for t in range(length):
                tokens[:, t + 1] = torch.multinomial(probs[tokens[:, t]], 1, generator=g)[:, 0]
            tokens = tokens.to(device)
            yield tokens[:, :-1], tokens[:, 1:]

    return stream(), entropy


class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int, attend):
        super().__init__()
        self.heads, self.attend = heads, attend
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        x = x + self.proj(self.attend(q, k, v).transpose(1, 2).reshape(b, n, c))
        return x + self.mlp(self.norm2(x))


class GPT(torch.nn.Module):
    def __init__(self, vocab: int, length: int, width: int, heads: int, layers: int, attend):
        super().__init__()
        self.tokens, self.positions = torch.nn.Embedding(vocab, width), torch.nn.Embedding(
            length, width
        )
        self.blocks = torch.nn.ModuleList(Block(width, heads, attend) for _ in range(layers))
        self.norm, self.head = torch.nn.LayerNorm(width), torch.nn.Linear(width, vocab, bias=False)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def train(attend, args, dtype) -> dict:
    """Losses per step and tokens per second (after the first 10% of steps)."""
    torch.manual_seed(args.seed)
    width = args.heads * args.head_dim
    model = GPT(args.vocab, args.length, width, args.heads, args.layers, attend).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    batches, entropy = markov_batches(args.vocab, args.batch, args.length, args.seed, args.device)
    losses, start, warm = [], None, max(1, args.steps // 10)
    autocast = dtype != torch.float32
    for step in range(args.steps):
        if step == warm:
            if args.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        ids, targets = next(batches)
        with torch.autocast(args.device, dtype=dtype, enabled=autocast):
            logits = model(ids)
        loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"  step {step:4d}  loss {losses[-1]:.4f}", flush=True)
    if args.device == "cuda":
        torch.cuda.synchronize()
    timed = args.steps - warm
    seconds = time.perf_counter() - start if start is not None else float("nan")
    tokens = timed * args.batch * args.length
    return dict(losses=losses, tokens_per_s=tokens / seconds if timed else None, entropy=entropy)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--jsonl", help="append the run's record to this file")
    args = parser.parse_args(argv)
    dtype = DTYPES[args.dtype]
    spec = f"attention gpt {{ head_dim = {args.head_dim}; dtype = {args.dtype}; mask = causal }}"
    module = flashgen.load(spec)
    runs = {}
    for name, attend in (
        ("flashgen", module.attention),
        ("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    ):
        print(f"{name}:", flush=True)
        runs[name] = train(attend, args, dtype)
    ours, sdpa = runs["flashgen"]["losses"], runs["sdpa"]["losses"]
    tail = max(1, args.steps // 10)
    summary = dict(
        steps=args.steps,
        entropy=runs["flashgen"]["entropy"],
        first_loss=(ours[0], sdpa[0]),
        last_losses_mean=(sum(ours[-tail:]) / tail, sum(sdpa[-tail:]) / tail),
        max_abs_loss_difference=max(abs(a - b) for a, b in zip(ours, sdpa)),
        tokens_per_s=(runs["flashgen"]["tokens_per_s"], runs["sdpa"]["tokens_per_s"]),
    )
    print(f"chain entropy {summary['entropy']:.4f} nats (the best loss)")
    print(f"step 0 loss: flashgen {ours[0]:.6f}, sdpa {sdpa[0]:.6f}")
    print(
        f"mean loss of the last {tail} steps: flashgen {summary['last_losses_mean'][0]:.4f}, "
        f"sdpa {summary['last_losses_mean'][1]:.4f}; largest difference at any step "
        f"{summary['max_abs_loss_difference']:.4f}"
    )
    speed = summary["tokens_per_s"]
    if speed[0] and speed[1] and math.isfinite(speed[0]):
        print(
            f"tokens/s: flashgen {speed[0]:,.0f}, sdpa {speed[1]:,.0f} ({speed[0] / speed[1]:.2f}x)"
        )
    if args.jsonl:
        record = dict(vars(args), **summary, losses={k: r["losses"] for k, r in runs.items()})
        with open(args.jsonl, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    return summary


if __name__ == "__main__":
    main()
