#!/usr/bin/env python3
"""Train a small model of fla's KimiDeltaAttention layers twice from the same seed and data,
once on fla's Triton chunk_kda and once through flash_kda (fla's backend registry dispatches
its chunk_kda to flash_kda.chunk_kda, forward and backward), plus a second Triton run from
another seed for the run-to-run spread; write the three loss and accuracy curves to a JSON and
a PNG and say whether the flash_kda curve lies within that spread.

The model: token embedding, LAYERS blocks of (RMSNorm, fla.layers.kda.KimiDeltaAttention with
hidden 512, 4 heads of 128, mode "chunk"; RMSNorm, a 4x GELU MLP), each with a residual, a
final RMSNorm and a linear head. The task: multi-query associative recall (Zoology's MQAR):
each sequence lists PAIRS key-value pairs (keys from the lower half of the vocabulary bar token
0, values from the upper half), then FILLER tokens (0) up to --seq-len (none by default), then
QUERIES of its keys in random order; the loss is the cross entropy
of each query position's prediction of the value paired with that key, the accuracy the
fraction of query positions whose argmax is that value (chance: 2 / VOCAB). Batches come from
one fixed data seed, so every run sees the same batches in the same order; the model seed sets
the initial weights. Training: AdamW, linear warm-up then cosine decay to 10%, bf16 autocast
with fp32 weights (A_log and dt_bias, which KDA reads in fp32, stay fp32), gradient clipping
at 1.

Why these settings (8 pairs, 8 queries, vocabulary 128, no filler: 24 tokens a sequence; peak
lr 3e-3, warm-up 20, 300 steps, batch 64): the comparison means something only if the model
learns within the run, since two runs that sit at chance have the same flat loss whatever the
gradients are. Larger settings (96 pairs, 64 queries, vocabulary 512, lr 1e-3, warm-up 30)
leave all three runs on an H200 at chance after 300 steps: loss 6.39 -> 5.547 = ln 256 (uniform
over the 256 values), query accuracy 0.004. MQAR is learned in a jump: the loss first drops to
about ln(VOCAB / 2) (the model learns that a query's answer is some value) and stays there
until the layers form the recall circuit (the short convolution binds each value to its key,
the delta-rule state stores the pair, the query reads it), which takes longer the more pairs
and values there are and the farther the queries are from the pairs. Settings were chosen on
CPU with a stand-in of this model (the same sizes, projections, short convolutions, gates and
gated output norm, the KDA recurrence in plain fp32 torch, the same training loop, batch 16):
  - 8 pairs, vocabulary 128 (chance 1/64), no filler: near the plateau (loss 4.3, ln 64 =
    4.16) until about step 70, then query accuracy 0.87 at step 100 (loss 0.69), 0.99 at step
    140 (loss 0.05), loss 0.01 from step 160 on; model seed 1 the same (0.81 at step 100, 1.00
    at step 120, last-50-step accuracy 0.996);
  - the same with 24 filler tokens (--seq-len 48): the jump starts at step 150-170 (accuracy
    0.63 and 0.27 at step 200 for seeds 0 and 1, last-50-step accuracy 0.90 and 0.72); with 72
    (--seq-len 96): accuracy 0.09 and 0.13 at steps 220-240: learnable, but too late in 300
    steps for a check that must not fail for want of learning;
  - 16 pairs, vocabulary 256: at chance (loss 4.9, ln 128 = 4.85) until step 170, accuracy
    0.93 only at step 260.
Batch 64 on the GPU sees four times the data a step, so the jump comes no later. The 24 tokens
are two of flash_kda's 16-token chunks, the pairs in the first and the queries in the second, so
every answer is read through the state flash_kda carries from one chunk to the next (fla's
Triton path, the reference, has one 64-token chunk); --seq-len puts filler between pairs and
queries to stretch recall over more chunks (with more --steps). A run is seconds on an H200;
most of the wall time of a first run is fla's Triton autotuning.

The script fails (exit 1) when the reference fla run's query accuracy over its last TAIL
steps is below --min-accuracy (0.5): chance is 2 / VOCAB (0.016 here) and a run that formed
the recall circuit ends near 1, so 0.5 separates "learned" from "did not" with a wide margin
either way, and a comparison of runs that did not learn proves nothing about the gradients.

"Within the spread": over the steps after warm-up, the moving average (window SMOOTH) of
|loss_flash_kda - loss_fla| is compared with that of |loss_fla_seed2 - loss_fla|; the script
reports both means, the final losses and each run's query accuracy over its last TAIL steps,
and says "within the spread" when the first mean is at most the second. It exits 1 when the
flash_kda run did not dispatch to flash_kda (fla's verifier refused its calls: run with INFO
logging on the logger fla.backends for the reason), when the reference run did not learn, or
when the flash_kda curve is outside the spread.

Needs an sm_90 GPU, flash_kda built with its kernels, and flash-linear-attention 0.6.x
(fla.layers.kda).

    python scripts/train_compare.py                      # docs/train-compare.json and .png
    python scripts/train_compare.py --steps 600 --layers 4 --seq-len 96 --json out.json --png out.png
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
VOCAB = 128
PAIRS = 8
QUERIES = 8
SMOOTH = 20
TAIL = 50
MIN_ACCURACY = 0.5
IGNORE = -100
FILLER = 0
REPO = Path(__file__).resolve().parents[1]


def make_batch(gen: torch.Generator, batch: int, pairs: int = PAIRS, queries: int = QUERIES,
               vocab: int = VOCAB, seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One MQAR batch on the host: (tokens [batch, seq_len] int64, targets of the same shape: the
    value paired with the queried key at each query position, IGNORE elsewhere). Each sequence is
    the `pairs` key-value pairs, then FILLER tokens up to seq_len - queries (none when seq_len is
    None: seq_len = 2 * pairs + queries), then the `queries` keys. Keys are distinct within a
    sequence, drawn from [1, vocab / 2) (0 is FILLER); values from [vocab / 2, vocab)."""
    half = vocab // 2
    if pairs > half - 1 or queries > pairs:
        raise ValueError(f"need pairs <= vocab / 2 - 1 ({half - 1}) and queries <= pairs, got {pairs}, {queries}")
    seq_len = 2 * pairs + queries if seq_len is None else seq_len
    if seq_len < 2 * pairs + queries:
        raise ValueError(f"need seq_len >= 2 * pairs + queries ({2 * pairs + queries}), got {seq_len}")
    keys = 1 + torch.argsort(torch.rand(batch, half - 1, generator=gen), dim=1)[:, :pairs]
    values = torch.randint(half, vocab, (batch, pairs), generator=gen)
    pick = torch.argsort(torch.rand(batch, pairs, generator=gen), dim=1)[:, :queries]
    context = torch.stack([keys, values], dim=2).reshape(batch, 2 * pairs)
    gap = torch.full((batch, seq_len - 2 * pairs - queries), FILLER, dtype=torch.int64)
    tokens = torch.cat([context, gap, torch.gather(keys, 1, pick)], dim=1)
    targets = torch.full_like(tokens, IGNORE)
    targets[:, seq_len - queries:] = torch.gather(values, 1, pick)
    return tokens, targets


def build_model(layers: int, safe_gate: bool, vocab: int = VOCAB):
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
            self.embed = nn.Embedding(vocab, HIDDEN)
            self.blocks = nn.ModuleList(Block(i) for i in range(layers))
            self.norm = nn.RMSNorm(HIDDEN)
            self.head = nn.Linear(HIDDEN, vocab, bias=False)

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
    """One training run: {"label", "losses" and "accuracies" (per step: the query positions' cross
    entropy and the fraction of them whose argmax is the right value), "accuracy" (the mean of the
    last TAIL steps' accuracies), "seconds", "flash_kda_calls" (calls fla dispatched to
    flash_kda.chunk_kda)}."""
    from flash_kda.bench.impls import count_flash_kda_calls

    os.environ["FLA_FLASH_KDA"] = "1" if through_flash_kda else "0"  # fla reads it at every dispatch
    os.environ["FLA_FLASH_KDA_TRAIN"] = "1" if through_flash_kda else "0"  # training dispatch is opt-in
    torch.manual_seed(model_seed)
    model = build_model(args.layers, args.safe_gate, args.vocab)
    no_decay = [p for p in model.parameters() if getattr(p, "_no_weight_decay", False) or p.ndim < 2]
    decay = [p for p in model.parameters() if not (getattr(p, "_no_weight_decay", False) or p.ndim < 2)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.data_seed)
    losses, accuracies = [], []
    start = time.perf_counter()
    with count_flash_kda_calls() as calls:  # fla's backend looks flash_kda.chunk_kda up at call time
        for step in range(args.steps):
            tokens, targets = (t.cuda(non_blocking=True)
                               for t in make_batch(gen, args.batch, args.pairs, args.queries, args.vocab, args.seq_len))
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
            mask = targets != IGNORE
            accuracies.append(float((logits.detach().argmax(-1)[mask] == targets[mask]).float().mean()))
            if step % 50 == 0 or step == args.steps - 1:
                print(f"[train_compare] {label} step {step}: loss {losses[-1]:.4f}, query accuracy "
                      f"{accuracies[-1]:.3f}", file=sys.stderr, flush=True)
    torch.cuda.synchronize()
    return {"label": label, "through_flash_kda": through_flash_kda, "model_seed": model_seed, "losses": losses,
            "accuracies": accuracies, "accuracy": tail_mean(accuracies), "seconds": time.perf_counter() - start,
            "flash_kda_calls": calls[0]}


def tail_mean(xs: list[float], window: int = TAIL) -> float:
    """Mean of the last `window` entries (all of them when fewer): a run's end-of-training figure
    that one noisy batch does not decide."""
    tail = xs[-window:]
    return sum(tail) / len(tail) if tail else float("nan")


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
    with_acc = all("accuracies" in r for r in runs)
    fig, axes = plt.subplots(1, 2 if with_acc else 1, figsize=(13 if with_acc else 8, 4.5), squeeze=False)
    ax = axes[0][0]
    for r in runs:
        ax.plot(smooth(r["losses"]), label=f"{r['label']} (final {r['losses'][-1]:.3f})", linewidth=1.4)
    ax.set_xlabel("step")
    ax.set_ylabel(f"loss (moving average of {SMOOTH})")
    ax.set_title("KimiDeltaAttention on associative recall: fla Triton vs flash_kda", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    if with_acc:
        ax = axes[0][1]
        for r in runs:
            ax.plot(smooth(r["accuracies"]), label=f"{r['label']} (last {TAIL}: {tail_mean(r['accuracies']):.3f})",
                    linewidth=1.4)
        ax.set_xlabel("step")
        ax.set_ylabel(f"query accuracy (moving average of {SMOOTH})")
        ax.set_ylim(0, 1)
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
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--pairs", type=int, default=PAIRS, help="key-value pairs a sequence lists")
    p.add_argument("--queries", type=int, default=QUERIES, help="keys a sequence queries (at most --pairs)")
    p.add_argument("--vocab", type=int, default=VOCAB, help="vocabulary: token 0 the filler, keys the rest of "
                   "the lower half, values the upper half")
    p.add_argument("--seq-len", type=int, default=None, help="tokens a sequence: the pairs, filler tokens, the "
                   "queries (default 2 * pairs + queries: no filler)")
    p.add_argument("--min-accuracy", type=float, default=MIN_ACCURACY,
                   help="the reference fla run's last-%d-step query accuracy below which the comparison is "
                   "void (exit 1): runs that did not learn the task compare nothing" % TAIL)
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
    if not 1 <= args.queries <= args.pairs <= args.vocab // 2 - 1:
        p.error("need 1 <= --queries <= --pairs <= --vocab / 2 - 1")
    if args.seq_len is not None and args.seq_len < 2 * args.pairs + args.queries:
        p.error("need --seq-len >= 2 * --pairs + --queries")
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
    learned = runs[0]["accuracy"] >= args.min_accuracy
    result = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()} | {
                  "hidden": HIDDEN, "heads": HEADS, "head_dim": HEAD_DIM, "chance_accuracy": 2 / args.vocab,
                  "tail": TAIL, "smooth": SMOOTH, "gpu": torch.cuda.get_device_name(),
                  "torch": torch.__version__, "flash_kda": flash_kda.__version__},
              "runs": runs, "comparison": verdict, "dispatched": dispatched, "learned": learned}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    drawn = plot(runs, args.png)
    for r in runs:
        print(f"{r['label']}: final loss {r['losses'][-1]:.4f} (last {TAIL} steps {tail_mean(r['losses']):.4f}), "
              f"query accuracy over the last {TAIL} steps {r['accuracy']:.3f} (chance {2 / args.vocab:.3f}), "
              f"{r['seconds']:.0f} s, flash_kda calls {r['flash_kda_calls']}")
    print(f"mean |flash_kda - fla| {verdict['mean_abs_diff_flash_kda']:.4f} vs run-to-run spread "
          f"{verdict['mean_abs_diff_seed']:.4f} over {verdict['steps_compared']} steps: "
          + ("within the spread" if verdict["within_spread"] else "OUTSIDE the spread"))
    print(f"wrote {args.json}" + (f" and {args.png}" if drawn else " (no PNG: matplotlib is not installed)"))
    if not dispatched:
        print("the flash_kda run did not dispatch to flash_kda (or the Triton run did): enable INFO logging "
              "of the logger fla.backends for fla's reason", file=sys.stderr)
        return 1
    if not learned:
        print(f"the reference fla run did not learn the task: query accuracy {runs[0]['accuracy']:.3f} over its "
              f"last {TAIL} steps, below --min-accuracy {args.min_accuracy}; curves of runs that learned nothing "
              "say nothing about the gradients (fewer --pairs, more --steps or a higher --lr)", file=sys.stderr)
        return 1
    return 0 if verdict["within_spread"] else 1


if __name__ == "__main__":
    sys.exit(main())
