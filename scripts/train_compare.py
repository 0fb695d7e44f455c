#!/usr/bin/env python3
"""Train a small model of fla's KimiDeltaAttention layers twice from the same seed and data,
once on fla's Triton chunk_kda and once through flash_kda (fla's backend registry dispatches
its chunk_kda to flash_kda.chunk_kda, forward and backward), plus a second Triton run from
another seed for the run-to-run spread; write the three loss curves to a JSON and a PNG and
say whether the flash_kda curve lies within that spread.

The model: token embedding, LAYERS blocks of (RMSNorm, fla.layers.kda.KimiDeltaAttention with
hidden 512, 4 heads of 128, mode "chunk"; RMSNorm, a 4x GELU MLP), each with a residual, a
final RMSNorm and a linear head. The task: multi-query associative recall (Zoology's MQAR):
each sequence lists PAIRS key-value pairs (keys from the lower half of the vocabulary, values
from the upper half), then QUERIES of its keys in random order; the loss is the cross entropy
of each query position's prediction of the value paired with that key. Batches come from one
fixed data seed, so every run sees the same batches in the same order; the model seed sets the
initial weights. Training: AdamW, linear warm-up then cosine decay, bf16 autocast with fp32
weights (A_log and dt_bias, which KDA reads in fp32, stay fp32), gradient clipping at 1.

"Within the spread": over the steps after warm-up, the moving average (window SMOOTH) of
|loss_flash_kda - loss_fla| is compared with that of |loss_fla_seed2 - loss_fla|; the script
reports both means and the final losses and says "within the spread" when the first mean is at
most the second. It exits 1 when the flash_kda run did not dispatch to flash_kda (fla's
verifier refused its calls: run with INFO logging on the logger fla.backends for the reason).

Needs an sm_90 GPU, flash_kda built with its kernels, and flash-linear-attention 0.6.x
(fla.layers.kda). A few minutes on an H200 (most of it fla's Triton autotuning on the first
steps of a fresh machine).

    python scripts/train_compare.py                      # docs/train-compare.json and .png
    python scripts/train_compare.py --steps 600 --layers 4 --json out.json --png out.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

HIDDEN = 512
HEADS = 4
HEAD_DIM = 128
VOCAB = 512
PAIRS = 96
QUERIES = 64
SMOOTH = 20
IGNORE = -100
REPO = Path(__file__).resolve().parents[1]


def make_batch(gen: torch.Generator, batch: int, pairs: int = PAIRS, queries: int = QUERIES,
               vocab: int = VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """One MQAR batch on the host: (tokens [batch, 2 * pairs + queries] int64, targets of the
    same shape: the value paired with the queried key at each query position, IGNORE elsewhere).
    Keys are distinct within a sequence, drawn from [0, vocab / 2); values from [vocab / 2, vocab)."""
    half = vocab // 2
    if pairs > half or queries > pairs:
        raise ValueError(f"need pairs <= vocab / 2 ({half}) and queries <= pairs, got {pairs}, {queries}")
    keys = torch.argsort(torch.rand(batch, half, generator=gen), dim=1)[:, :pairs]
    values = torch.randint(half, vocab, (batch, pairs), generator=gen)
    pick = torch.argsort(torch.rand(batch, pairs, generator=gen), dim=1)[:, :queries]
    context = torch.stack([keys, values], dim=2).reshape(batch, 2 * pairs)
    tokens = torch.cat([context, torch.gather(keys, 1, pick)], dim=1)
    targets = torch.full_like(tokens, IGNORE)
    targets[:, 2 * pairs:] = torch.gather(values, 1, pick)
    return tokens, targets


def build_model(layers: int, safe_gate: bool):
    """The model (fla's KimiDeltaAttention blocks) on the GPU in fp32."""
    from fla.layers.kda import KimiDeltaAttention
    from torch import nn

    gate = dict(safe_gate=True, lower_bound=-5.0) if safe_gate else {}

    class Block(nn.Module):
        def __init__(self, i: int):
            super().__init__()
            self.norm1, self.norm2 = nn.RMSNorm(HIDDEN), nn.RMSNorm(HIDDEN)
            self.attn = KimiDeltaAttention(hidden_size=HIDDEN, head_dim=HEAD_DIM, num_heads=HEADS, mode="chunk",
                                           layer_idx=i, **gate)
            self.mlp = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN))

        def forward(self, x):
            x = x + self.attn(self.norm1(x))[0]
            return x + self.mlp(self.norm2(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, HIDDEN)
            self.blocks = nn.ModuleList(Block(i) for i in range(layers))
            self.norm = nn.RMSNorm(HIDDEN)
            self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for b in self.blocks:
                x = b(x)
            return self.head(self.norm(x))

    return Model().cuda()


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak` over `warmup` steps, then cosine decay to 10% of it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(steps - warmup, 1)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def train_run(label: str, through_flash_kda: bool, model_seed: int, args) -> dict:
    """One training run: {"label", "losses" (per step), "accuracy" (of the last step's queries),
    "seconds", "flash_kda_calls" (calls fla dispatched to flash_kda.chunk_kda)}."""
    from flash_kda.bench.impls import count_flash_kda_calls

    os.environ["FLA_FLASH_KDA"] = "1" if through_flash_kda else "0"  # fla reads it at every dispatch
    os.environ["FLA_FLASH_KDA_TRAIN"] = "1" if through_flash_kda else "0"  # training dispatch is opt-in
    torch.manual_seed(model_seed)
    model = build_model(args.layers, args.safe_gate)
    no_decay = [p for p in model.parameters() if getattr(p, "_no_weight_decay", False) or p.ndim < 2]
    decay = [p for p in model.parameters() if not (getattr(p, "_no_weight_decay", False) or p.ndim < 2)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.data_seed)
    losses, accuracy = [], float("nan")
    start = time.perf_counter()
    with count_flash_kda_calls() as calls:  # fla's backend looks flash_kda.chunk_kda up at call time
        for step in range(args.steps):
            tokens, targets = (t.cuda(non_blocking=True) for t in make_batch(gen, args.batch))
            for group in opt.param_groups:
                group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(tokens)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                                                     ignore_index=IGNORE)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(float(loss))
            if step == args.steps - 1:
                mask = targets != IGNORE
                accuracy = float((logits.argmax(-1)[mask] == targets[mask]).float().mean())
            if step % 50 == 0 or step == args.steps - 1:
                print(f"[train_compare] {label} step {step}: loss {losses[-1]:.4f}", file=sys.stderr, flush=True)
    torch.cuda.synchronize()
    return {"label": label, "through_flash_kda": through_flash_kda, "model_seed": model_seed, "losses": losses,
            "accuracy": accuracy, "seconds": time.perf_counter() - start, "flash_kda_calls": calls[0]}


def smooth(xs: list[float], window: int = SMOOTH) -> list[float]:
    """Trailing moving average (the first entries average what there is)."""
    out, total = [], 0.0
    for i, x in enumerate(xs):
        total += x
        if i >= window:
            total -= xs[i - window]
        out.append(total / min(i + 1, window))
    return out


def compare(reference: list[float], candidate: list[float], other_seed: list[float], skip: int) -> dict:
    """The spread test: mean over steps >= skip of the smoothed |candidate - reference| and of
    the smoothed |other_seed - reference| (the run-to-run spread), and whether the first is at
    most the second."""
    n = min(len(reference), len(candidate), len(other_seed))
    dev = smooth([abs(candidate[i] - reference[i]) for i in range(n)])[skip:]
    spread = smooth([abs(other_seed[i] - reference[i]) for i in range(n)])[skip:]
    if not dev:
        raise ValueError(f"no steps after the first {skip}")
    mean_dev, mean_spread = sum(dev) / len(dev), sum(spread) / len(spread)
    return {"mean_abs_diff_flash_kda": mean_dev, "mean_abs_diff_seed": mean_spread,
            "within_spread": mean_dev <= mean_spread, "steps_compared": len(dev)}


def plot(runs: list[dict], path: Path) -> bool:
    """The smoothed loss curves in one PNG; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in runs:
        ax.plot(smooth(r["losses"]), label=f"{r['label']} (final {r['losses'][-1]:.3f})", linewidth=1.4)
    ax.set_xlabel("step")
    ax.set_ylabel(f"loss (moving average of {SMOOTH})")
    ax.set_title("KimiDeltaAttention on associative recall: fla Triton vs flash_kda")
    ax.grid(alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--layers", type=int, default=2, choices=(2, 3, 4))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--seed", type=int, default=0, help="model seed of the compared runs")
    p.add_argument("--spread-seed", type=int, default=1, help="model seed of the second Triton run")
    p.add_argument("--data-seed", type=int, default=1234)
    p.add_argument("--safe-gate", action="store_true",
                   help="the lower-bound gate (safe_gate=True, lower_bound=-5) instead of the layer's default "
                   "softplus gate")
    p.add_argument("--json", type=Path, default=REPO / "docs" / "train-compare.json")
    p.add_argument("--png", type=Path, default=REPO / "docs" / "train-compare.png")
    args = p.parse_args(argv)
    if args.steps < 2 * SMOOTH or args.warmup >= args.steps:
        p.error(f"--steps must be at least {2 * SMOOTH} and above --warmup")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import flash_kda
    from flash_kda import _fla_chunk

    if not flash_kda.cuda_available():
        print("train_compare needs an sm_90 GPU and flash_kda built with its kernels", file=sys.stderr)
        return 2
    import fla.layers.kda  # noqa: F401  (registers flash_kda's backend, flash_kda being imported)

    print(f"[train_compare] flash_kda backend: {_fla_chunk.status}", file=sys.stderr)
    runs = [train_run("fla Triton", False, args.seed, args),
            train_run("flash_kda", True, args.seed, args),
            train_run(f"fla Triton, seed {args.spread_seed}", False, args.spread_seed, args)]
    verdict = compare(runs[0]["losses"], runs[1]["losses"], runs[2]["losses"], skip=args.warmup)
    dispatched = runs[1]["flash_kda_calls"] > 0 and runs[0]["flash_kda_calls"] == 0
    result = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()} | {
                  "hidden": HIDDEN, "heads": HEADS, "head_dim": HEAD_DIM, "vocab": VOCAB, "pairs": PAIRS,
                  "queries": QUERIES, "smooth": SMOOTH, "gpu": torch.cuda.get_device_name(),
                  "torch": torch.__version__, "flash_kda": flash_kda.__version__},
              "runs": runs, "comparison": verdict, "dispatched": dispatched}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    drawn = plot(runs, args.png)
    for r in runs:
        print(f"{r['label']}: final loss {r['losses'][-1]:.4f}, last-step query accuracy {r['accuracy']:.3f}, "
              f"{r['seconds']:.0f} s, flash_kda calls {r['flash_kda_calls']}")
    print(f"mean |flash_kda - fla| {verdict['mean_abs_diff_flash_kda']:.4f} vs run-to-run spread "
          f"{verdict['mean_abs_diff_seed']:.4f} over {verdict['steps_compared']} steps: "
          + ("within the spread" if verdict["within_spread"] else "OUTSIDE the spread"))
    print(f"wrote {args.json}" + (f" and {args.png}" if drawn else " (no PNG: matplotlib is not installed)"))
    if not dispatched:
        print("the flash_kda run did not dispatch to flash_kda (or the Triton run did): enable INFO logging "
              "of the logger fla.backends for fla's reason", file=sys.stderr)
        return 1
    return 0 if verdict["within_spread"] else 1


if __name__ == "__main__":
    sys.exit(main())
