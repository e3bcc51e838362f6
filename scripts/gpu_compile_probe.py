"""test_compile's whole-model case on a GPU, in detail: which of the outputs and
parameter gradients differ between eager mode and torch.compile (aot_eager), by
how much, and whether the attention call's own dq/dk/dv differ for the same do.
    python3 scripts/gpu_compile_probe.py"""

import torch

import flashgen

module = flashgen.load("attention m { head_dim = 16; dtype = fp32; mask = causal }")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.qkv, self.out = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, 2, 16).permute(2, 0, 3, 1, 4)
        o = module.attention(q, k, v)
        return self.out(o.transpose(1, 2).reshape(b, n, 32))


g = torch.Generator().manual_seed(0)
x = torch.randn(2, 23, 32, generator=g).cuda().requires_grad_()
block = Block().cuda()
eager = block(x)
compiled = torch.compile(block, backend="aot_eager", fullgraph=True)(x)
print("forward equal", torch.equal(eager, compiled), (eager - compiled).abs().max().item())
names = [n for n, _ in block.named_parameters()] + ["x"]
params = list(block.parameters()) + [x]
ge = torch.autograd.grad(eager.sum(), params)
gc = torch.autograd.grad(compiled.sum(), params)
for n, a, b in zip(names, ge, gc):
    print(n, "equal", torch.equal(a, b), (a - b).abs().max().item())
# The attention op alone, with do contiguous and as a transposed view.
q, k, v = (torch.randn(2, 2, 23, 16, generator=g).cuda().requires_grad_() for _ in range(3))
do = torch.randn(2, 23, 2, 16, generator=g).cuda()
for name, d in (("contiguous", do.transpose(1, 2).contiguous()), ("view", do.transpose(1, 2))):
    o = module.attention(q, k, v)
    a = torch.autograd.grad(o, (q, k, v), d)
    f = torch.compile(
        lambda q, k, v: module.attention(q, k, v), backend="aot_eager", fullgraph=True
    )
    o2 = f(q, k, v)
    b = torch.autograd.grad(o2, (q, k, v), d)
    print("op", name, [(torch.equal(s, t), (s - t).abs().max().item()) for s, t in zip(a, b)])
