"""Runs flash_kda.fwd on one benchmark-shaped case a few times, for a profiler to attach to
(scripts/profile.sh). Inputs as in the benchmark: bf16 randn, A_log and dt_bias ~ U(0, 1),
lower_bound -5, fp32 states (or none: --no-state), K = V = 128."""
import argparse

import torch

import flash_kda


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--T", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--heads", type=int, default=4, help="heads H = HV")
    p.add_argument("--batch", type=int, default=1, help="sequences (fixed length)")
    p.add_argument("--calls", type=int, default=3, help="forward calls")
    p.add_argument("--no-state", action="store_true", help="no initial or final state (zero start, none kept)")
    a = p.parse_args()
    B, T, H, D = a.batch, a.T, a.heads, 128
    dev = torch.device("cuda")
    q, k, v, g = (torch.randn(B, T, H, D, dtype=torch.bfloat16, device=dev) for _ in range(4))
    beta = torch.randn(B, T, H, dtype=torch.bfloat16, device=dev)
    A_log = torch.rand(H, device=dev)
    dt_bias = torch.rand(H, D, device=dev)
    h0 = None if a.no_state else torch.randn(B, H, D, D, device=dev)
    ht = None if a.no_state else torch.empty_like(h0)
    out = torch.empty_like(v)
    for _ in range(a.calls):
        flash_kda.fwd(q, k, v, g, beta, None, out, A_log, dt_bias, -5.0, initial_state=h0, final_state=ht)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
