"""Runs flash_kda.fwd on one benchmark-shaped case a few times, for a profiler to attach to
(scripts/profile.sh). Inputs as in the benchmark: bf16 randn, A_log and dt_bias ~ U(0, 1),
lower_bound -5, fp32 states (or none: --no-state), K = V = 128. With --train, each call is a
training step instead: flash_kda.chunk_kda (the same gate and states) forward and backward,
so the backward's kernels appear in the profile beside the forward's recompute. The last call
runs between cudaProfilerStart and cudaProfilerStop, so that a profiler started with
`--profile-from-start off` sees that call alone (warm caches, no first-launch setup)."""
import argparse

import torch

import flash_kda


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--T", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--heads", type=int, default=4, help="heads H = HV")
    p.add_argument("--batch", type=int, default=1, help="sequences (fixed length)")
    p.add_argument("--calls", type=int, default=3, help="forward calls (training steps with --train)")
    p.add_argument("--no-state", action="store_true", help="no initial or final state (zero start, none kept)")
    p.add_argument("--train", action="store_true", help="forward + backward through chunk_kda instead of fwd")
    a = p.parse_args()
    B, T, H, D = a.batch, a.T, a.heads, 128
    dev = torch.device("cuda")
    q, k, v, g = (torch.randn(B, T, H, D, dtype=torch.bfloat16, device=dev) for _ in range(4))
    beta = torch.randn(B, T, H, dtype=torch.bfloat16, device=dev)
    A_log = torch.rand(H, device=dev)
    dt_bias = torch.rand(H, D, device=dev)
    h0 = None if a.no_state else torch.randn(B, H, D, D, device=dev)
    ht = None if a.no_state else torch.empty_like(h0)
    if a.train:
        train(a, q, k, v, g, beta, A_log, dt_bias, h0)
        return
    out = torch.empty_like(v)
    for i in range(a.calls):
        with last_call(i == a.calls - 1):
            flash_kda.fwd(q, k, v, g, beta, None, out, A_log, dt_bias, -5.0, initial_state=h0, final_state=ht)
    torch.cuda.synchronize()


class last_call:
    """Brackets the call in cudaProfilerStart / cudaProfilerStop when `on` (synchronised on both
    sides, so no other call's kernels fall inside)."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def __enter__(self) -> None:
        if self.on:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()

    def __exit__(self, *exc) -> None:
        if self.on:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()


def train(a, q, k, v, g, beta, A_log, dt_bias, h0) -> None:
    """a.calls training steps of chunk_kda: gradients of every input against a fixed d_out."""
    leaves = [x.requires_grad_() for x in (q, k, v, g, beta, A_log, dt_bias) + ((h0,) if h0 is not None else ())]
    d_out = torch.randn_like(v)
    for i in range(a.calls):
        with last_call(i == a.calls - 1):
            o, _ = flash_kda.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=h0 is not None,
                                       use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                       use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0,
                                       state_v_first=True, A_log=A_log, dt_bias=dt_bias)
            torch.autograd.grad(o, leaves, d_out)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
