#!/usr/bin/python3
"""apart vs PyTorch on one training step (forward + backward) of the same GPT, same shapes, same threads.

Runs bench_profile_speed (apart's CPU runtime on `apart zoo gpt2-small` at --seq, batch --batch) and the
equivalent GPT written in plain torch (GPT-2 layout as models/transformers.cpp builds it: learned
positions, pre-LN blocks, fused qkv, causal softmax attention, erf GELU MLP, tied head, mean cross-entropy),
and prints both with the ratio. Use Debian's torch: /usr/bin/python3 bench/speed_vs_torch.py.
Set OMP_NUM_THREADS for both (default here: 2). See docs/profiling.md.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time


def torch_step_seconds(layers, hidden, heads, seq, vocab, batch, threads, warmup, repeats):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(hidden, eps=1e-5)
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.ln2 = nn.LayerNorm(hidden, eps=1e-5)
            self.fc = nn.Linear(hidden, 4 * hidden)
            self.out = nn.Linear(4 * hidden, hidden)

        def forward(self, x, mask):
            b, s, h = x.shape
            hd = h // heads
            q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
            q = q.view(b, s, heads, hd).transpose(1, 2)
            k = k.view(b, s, heads, hd).transpose(1, 2)
            v = v.view(b, s, heads, hd).transpose(1, 2)
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
            scores = scores.masked_fill(mask, float("-inf"))
            ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, h)
            x = x + self.proj(ctx)
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, hidden)
            self.wpe = nn.Embedding(seq, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.lnf = nn.LayerNorm(hidden, eps=1e-5)
            self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))
            self.register_buffer("pos", torch.arange(seq))

        def forward(self, ids, labels):
            x = self.wte(ids) + self.wpe(self.pos)
            for blk in self.blocks:
                x = blk(x, self.mask)
            logits = self.lnf(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.view(-1, vocab), labels.view(-1))

    model = GPT()
    ids = torch.randint(0, vocab, (batch, seq))
    labels = torch.randint(0, vocab, (batch, seq))
    times = []
    for r in range(warmup + repeats):
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        model(ids, labels).backward()
        dt = time.perf_counter() - t
        if r >= warmup:
            times.append(dt)
    return statistics.median(times), torch.__version__, torch.get_num_threads()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--apart-bench", default=os.path.join(here, "..", "build", "pf-rel", "bench", "bench_profile_speed"))
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
    os.environ.update(OMP_NUM_THREADS=str(a.threads))

    cmd = [a.apart_bench, "--batch", str(a.batch), "--seq", str(a.seq), "--repeats", str(a.repeats), "--json"]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    ap = json.loads(out.strip().splitlines()[-1])

    # gpt2-small: 12 layers, hidden 768, 12 heads, vocab 50257; positions = seq (the zoo's gpt with --seq).
    ts, version, nthreads = torch_step_seconds(12, 768, 12, a.seq, 50257, a.batch, a.threads, a.warmup, a.repeats)
    gflop = ap["gflop"]
    print(f"gpt2-small fwd+bwd, seq {a.seq}, batch {a.batch}, {a.threads} threads; {gflop:.1f} GFLOP/step (analytic); "
          f"sgemm {ap['sgemm_gflops']:.1f} GFLOP/s")
    print(f"{'':8} {'step ms':>9} {'samples/s':>10} {'GFLOP/s':>8} {'of sgemm':>9}")
    for name, s in (("apart", ap["step_s"]), (f"torch", ts)):
        print(f"{name:8} {1e3 * s:9.1f} {a.batch / s:10.3f} {gflop / s:8.1f} {100 * gflop / s / ap['sgemm_gflops']:8.0f}%")
    print(f"apart/torch speed: {ts / ap['step_s']:.2f}x   (torch {version}, {nthreads} threads)")
    print("apart time by op type (ms): " + ", ".join(f"{k} {1e3 * v:.1f}" for k, v in list(ap["by_op_s"].items())[:10]))


if __name__ == "__main__":
    sys.exit(main())
