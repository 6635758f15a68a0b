"""One rank of gradgate-bench wan's gloo baseline.

gradgate-bench wan starts K*R of these, rank r in the network namespace of
site r // R, so PyTorch's gloo ring runs over the same shaped links as the
gateways. Every rank all-reduces a float32 tensor of random normal values
(seeded per site and rank); each timed step starts after a barrier. Rank 0
prints one JSON object: per-step times (the slowest rank's, per step), the
CPU seconds all ranks spent in the timed steps, and the time set-up took.

    wan_gloo.py --rank R --world N --ranks-per-site R --master IP:PORT
                --count C --steps T --warmup W [--timeout-s S]
"""
import argparse
import json
import sys
import time
from datetime import timedelta


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--ranks-per-site", type=int, required=True)
    p.add_argument("--master", required=True, help="IP:PORT of rank 0's rendezvous")
    p.add_argument("--count", type=int, required=True, help="float32 elements")
    p.add_argument("--steps", type=int, required=True, help="timed steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    p.add_argument("--timeout-s", type=float, default=300, help="gloo's deadline for one operation")
    a = p.parse_args()

    t_start = time.monotonic()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://" + a.master, rank=a.rank, world_size=a.world,
                            timeout=timedelta(seconds=a.timeout_s))
    site, local = divmod(a.rank, a.ranks_per_site)
    gen = torch.Generator().manual_seed(0x5eed0000 + site * 4096 + local)
    grads = torch.randn(a.count, generator=gen, dtype=torch.float32)
    buf = torch.empty_like(grads)
    setup_s = time.monotonic() - t_start

    # all_reduce works in place: a fresh copy of the gradients each step,
    # as a backward pass would write them.
    for _ in range(a.warmup):
        buf.copy_(grads)
        dist.barrier()
        dist.all_reduce(buf)
    step_s = []
    cpu0 = time.process_time()
    for _ in range(a.steps):
        buf.copy_(grads)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        step_s.append(time.perf_counter() - t0)
    cpu = time.process_time() - cpu0

    if not all(map(lambda x: x == x, buf[:1024].tolist())):
        print("wan_gloo: rank %d: the result holds NaN" % a.rank, file=sys.stderr)
        return 1
    slowest = torch.tensor(step_s + [setup_s], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    cpu_all = torch.tensor([cpu], dtype=torch.float64)
    dist.all_reduce(cpu_all)
    if a.rank == 0:
        print(json.dumps({"ranks": a.world, "count": a.count, "steps": a.steps,
                          "step_ms": [round(x * 1e3, 3) for x in slowest.tolist()[:-1]],
                          "cpu_s": round(cpu_all.item(), 4),
                          "setup_s": round(slowest[-1].item(), 3),
                          "torch": torch.__version__}, separators=(",", ":")))
        sys.stdout.flush()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
