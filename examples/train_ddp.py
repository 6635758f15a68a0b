#!/usr/bin/env python3
"""Data-parallel training across sites through gradgate, with PyTorch DDP.

    python3 examples/train_ddp.py [--sites 3] [--ranks 2] [--steps 30] [--codec fp32] [--algorithm ring]
                                  [--lr 0.05] [--bench] [--cuda | --nccl]

Starts one gateway per site on loopback (gradgate.local.LocalSites) and
sites x ranks training processes. Each trains the same small MLP on its
own synthetic batches with DistributedDataParallel over the ranks of its
site; the gradients of every bucket are summed across all sites by the
gateways (gradgate.torch.allreduce_hook) and averaged over all ranks.

Checks, and exits 1 when one fails:
  - after the last step every rank at every site holds bit-identical
    parameters;
  - with codec fp32, they match single-process training on the
    concatenated batches of all ranks within float tolerance.
Prints the loss curve (mean over ranks) beside the single-process one.

--cuda trains on the GPU (every rank on cuda:0) and all-reduces the
buckets there (HookState(cuda=True): gg_allreduce_cuda, no host copies);
--nccl does the same through each site's NCCL communicator, which the
site's gateway is the last rank of (HookState(nccl=True):
gg_allreduce_nccl). NCCL refuses two ranks of one communicator on one GPU
of one host, and tells hosts apart by NCCL_HOSTID: with --nccl every
training process gets one of its own and the gateways theirs, so that all
share cuda:0 (NCCL then moves the data over its socket transport, on
loopback, unless NCCL_SOCKET_IFNAME, NCCL_IB_DISABLE and NCCL_NET say
otherwise). Both exit 77 when torch sees no GPU.

--bench also times one bucket's all-reduce through the hook against
torch.distributed's gloo all_reduce over the same ranks on loopback, side
by side, three times, for 1 MiB and 16 MiB buckets (min/median/max ms).

Needs python3-torch (Debian), a built tree (or gradgate installed) and
the client library: $GRADGATE_LIBRARY, else the tree's
build/gateway/client/libgradgate.so.0, else the installed one.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(TREE, "python"))
_tree_lib = os.path.join(TREE, "build", "gateway", "client", "libgradgate.so.0")
if "GRADGATE_LIBRARY" not in os.environ and os.path.exists(_tree_lib):
    os.environ["GRADGATE_LIBRARY"] = _tree_lib

try:
    import torch  # noqa: E402
except ImportError:
    # quickstart.sh installs Debian's python3-torch, for /usr/bin/python3:
    # a python3 without torch ahead of it on PATH (pyenv, a virtualenv,
    # one of /usr/bin/python3 itself too) hands the run over to it, once.
    system = "/usr/bin/python3"
    in_venv = sys.prefix != sys.base_prefix
    if os.environ.get("GRADGATE_REEXEC") or not os.path.exists(system) or (
            os.path.realpath(sys.executable) == os.path.realpath(system) and not in_venv):
        sys.exit(f"train_ddp.py: {sys.executable} has no torch (Debian: apt-get install python3-torch)")
    os.environ["GRADGATE_REEXEC"] = "1"
    os.execv(system, [system, os.path.abspath(__file__)] + sys.argv[1:])
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import gradgate  # noqa: E402
import gradgate.torch  # noqa: E402
from gradgate.local import LocalSites, free_loopback_ports  # noqa: E402

IN, HIDDEN, OUT, BATCH = 32, 640, 4, 16


def make_model():
    torch.manual_seed(0)  # every rank of every site starts from the same parameters
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, OUT))


def batch(step, global_rank):
    """The batch of one rank for one step: inputs and a smooth target."""
    g = torch.Generator().manual_seed(1000003 * step + global_rank)
    x = torch.randn(BATCH, IN, generator=g)
    w = torch.Generator().manual_seed(7)
    teacher = torch.randn(IN, OUT, generator=w) / IN ** 0.5
    return x, torch.sin(x @ teacher) + 0.1 * x[:, :OUT]


def optimizer(params, lr):
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def worker(a):
    """One training rank: rank a.rank of site a.site."""
    torch.set_num_threads(1)
    R = a.ranks
    global_rank = a.site * R + a.rank
    # One gloo group over every rank, only to form each site's group on one
    # machine and for the --bench baseline; DDP uses the site's group.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=global_rank,
                            world_size=a.sites * R)
    site_groups = [dist.new_group(list(range(s * R, s * R + R))) for s in range(a.sites)]
    device = "cuda" if a.cuda or a.nccl else "cpu"
    model = make_model().to(device)
    ddp = DDP(model, process_group=site_groups[a.site], bucket_cap_mb=0.25)
    session = gradgate.Session(a.job, a.rank, R)  # endpoint: GRADGATE_ENDPOINT
    state = gradgate.torch.HookState(session, world_size=a.sites * R, cuda=a.cuda, nccl=a.nccl)
    ddp.register_comm_hook(state, gradgate.torch.allreduce_hook)
    opt = optimizer(ddp.parameters(), a.lr)
    losses = []
    for step in range(a.steps):
        x, y = (t.to(device) for t in batch(step, global_rank))
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    result = {"params": [p.detach().cpu().clone() for p in model.parameters()], "losses": losses,
              "buckets": state.buckets, "bucket_bytes": state.bytes}
    if a.bench:
        result["bench"] = bench(state)
    state.close()
    session.close()
    torch.save(result, os.path.join(a.out, f"rank-{global_rank}.pt"))
    dist.destroy_process_group()


def bench(state, iters=5):
    """ms per all-reduce of one bucket: through the hook, and gloo's."""
    out = {}
    for mib in (1, 16):
        t = torch.ones(mib << 18)
        times = {"gradgate": [], "gloo": []}
        for rep in range(3):
            for mode in ("gradgate", "gloo"):
                dist.barrier()
                t0 = time.perf_counter()
                for i in range(iters):
                    if mode == "gradgate":
                        state.submit(t, 100000 + mib).wait()
                    else:
                        dist.all_reduce(t)
                times[mode].append((time.perf_counter() - t0) / iters * 1e3)
        out[mib] = times
    return out


def reference(a, rank_count):
    """Single-process training on the concatenated batches of all ranks."""
    torch.set_num_threads(1)
    model = make_model()
    opt = optimizer(model.parameters(), a.lr)
    losses = []
    for step in range(a.steps):
        xs, ys = zip(*(batch(step, r) for r in range(rank_count)))
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.detach() for p in model.parameters()], losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sites", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=2, help="ranks per site")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--codec", default="fp32", choices=["fp32", "bf16", "bf16-split", "int8", "int4"])
    ap.add_argument("--algorithm", default="ring", choices=["ring", "direct", "auto"])
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--bench", action="store_true", help="also time the hook against gloo per bucket")
    gpu = ap.add_mutually_exclusive_group()
    gpu.add_argument("--cuda", action="store_true", help="train on the GPU and all-reduce the buckets there")
    gpu.add_argument("--nccl", action="store_true",
                     help="train on the GPU and all-reduce the buckets through each site's NCCL communicator")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--site", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--job", default="train-ddp", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    if not 2 <= a.sites <= 8 or not 1 <= a.ranks <= 8 or a.steps < 1:
        ap.error("--sites 2-8, --ranks 1-8, --steps at least 1")
    if (a.cuda or a.nccl) and not torch.cuda.is_available():
        print(f"SKIP: {'--cuda' if a.cuda else '--nccl'}, but torch sees no CUDA device")
        return 77
    if a.nccl:
        # One GPU for all: each process a host of its own to NCCL (the
        # gateways, in separate communicators, may share one).
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_IB_DISABLE", "1")
        os.environ.setdefault("NCCL_NET", "Socket")
        os.environ["NCCL_HOSTID"] = "train-ddp-gateway"

    # The ranks' results go to a folder that goes with the run, however
    # it ends.
    with tempfile.TemporaryDirectory(prefix="train-ddp.") as out:
        return train(a, out)


def train(a, out):
    """Runs the sites' gateways and every rank; checks and prints what they
    reached. The ranks write their results to `out`."""
    n = a.sites * a.ranks
    print(f"{a.sites} sites x {a.ranks} ranks, codec {a.codec}, {a.algorithm}, {a.steps} steps, "
          f"{'on the GPU through NCCL' if a.nccl else 'on the GPU' if a.cuda else 'on the CPU'}, "
          f"library {gradgate.version()}", flush=True)
    with LocalSites(sites=a.sites, codec=a.codec, algorithm=a.algorithm) as mesh:
        port = free_loopback_ports(1)[0]
        procs = []
        for s in range(a.sites):
            for r in range(a.ranks):
                env = dict(os.environ, GRADGATE_ENDPOINT=mesh.endpoint(s))
                if a.nccl:
                    env["NCCL_HOSTID"] = f"train-ddp-{s}-{r}"
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--site", str(s), "--rank", str(r),
                       "--port", str(port), "--out", out, "--sites", str(a.sites), "--ranks", str(a.ranks),
                       "--steps", str(a.steps), "--lr", str(a.lr), "--codec", a.codec]
                cmd += (["--bench"] if a.bench else []) + (["--cuda"] if a.cuda else []) + (["--nccl"] if a.nccl else [])
                procs.append(subprocess.Popen(cmd, env=env))
        try:
            codes = [p.wait() for p in procs]
        finally:
            # Interrupted, the ranks go too, before their folder does.
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    if any(codes):
        print(f"FAIL: training ranks exited with {codes}")
        return 1

    results = [torch.load(os.path.join(out, f"rank-{r}.pt")) for r in range(n)]
    ok = True
    first = [p.numpy().tobytes() for p in results[0]["params"]]
    same = all([p.numpy().tobytes() for p in res["params"]] == first for res in results)
    print(f"parameters bit-identical at all {n} ranks: {'yes' if same else 'NO'}")
    ok &= same
    print(f"buckets per rank: {results[0]['buckets']} ({results[0]['bucket_bytes'] / a.steps:.0f} bytes a step)")

    ref_params, ref_losses = reference(a, n)
    diff = max((p - q).abs().max().item() for p, q in zip(results[0]["params"], ref_params))
    close = all(torch.allclose(p, q, rtol=1e-4, atol=1e-5) for p, q in zip(results[0]["params"], ref_params))
    print(f"max |parameter - single-process parameter|: {diff:.3g}"
          + (f" ({'within' if close else 'OUTSIDE'} rtol 1e-4, atol 1e-5)" if a.codec == "fp32" else
             " (lossy codec: not compared)"))
    if a.codec == "fp32":
        ok &= close
    print("step  loss (mean over ranks)  single-process loss")
    for step in range(a.steps):
        mean = statistics.fmean(res["losses"][step] for res in results)
        if step < 5 or step % max(1, a.steps // 10) == 0 or step == a.steps - 1:
            print(f"{step + 1:4d}  {mean:22.6f}  {ref_losses[step]:19.6f}")

    if a.bench:
        print("one bucket's all-reduce, ms (min/median/max of 3), rank 0:")
        for mib, t in results[0]["bench"].items():
            g, l = sorted(t["gradgate"]), sorted(t["gloo"])
            print(f"  {mib:2d} MiB  gradgate hook {g[0]:7.2f} {g[1]:7.2f} {g[2]:7.2f}   gloo all_reduce "
                  f"{l[0]:7.2f} {l[1]:7.2f} {l[2]:7.2f}   ratio {g[1] / l[1]:.2f}")
    print("train_ddp: ok" if ok else "train_ddp: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
