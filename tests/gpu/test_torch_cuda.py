"""Session.allreduce_cuda (gg_allreduce_cuda) from PyTorch against two real
gateways on loopback: CUDA tensors of 2 sites x 2 ranks summed in place on
the GPU, equal bit for bit to host all-reduces of the same inputs and the
same at every rank; tensors inside a larger allocation (as PyTorch's
caching allocator hands them out, several ranks' in one), on the current
and on a side stream; and what it and allreduce_nccl refuse (the NCCL path
itself needs a process per rank: examples/train_ddp.py --nccl). Exits 77
(skipped) without a CUDA device.

    python3 tests/gpu/test_torch_cuda.py   (GRADGATE, GRADGATE_LIBRARY and
    GRADGATE_MAKE_CERTS name the build's gateway, library and certificate script)
"""

import sys

import torch

if not torch.cuda.is_available():
    print("SKIP: torch sees no CUDA device")
    sys.exit(77)

import gradgate  # noqa: E402 (after the skip)
from gradgate.local import LocalSites  # noqa: E402

SITES, RANKS = 2, 2
CASES = [(1, torch.float32), (1000, torch.float32), ((1 << 22) + 3, torch.float32), (7, torch.bfloat16),
         (65537, torch.bfloat16), ((1 << 20) + 1, torch.bfloat16)]
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def inputs(site, rank, case, n, dtype):
    g = torch.Generator().manual_seed(1000 * site + 10 * rank + case)
    return (torch.randn(n, generator=g) * 64).to(dtype)


def rank_main(s, site, rank):
    out = []
    refusals(s)
    side = torch.cuda.Stream()
    for c, (n, dtype) in enumerate(CASES):
        x = inputs(site, rank, c, n, dtype)
        # A view 64 elements into a larger tensor, written on the side
        # stream for odd cases: the call must wait for that stream.
        big = torch.full((n + 128,), -1.0, dtype=dtype, device="cuda")
        view = big[64:64 + n]
        stream = side if c % 2 else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())  # the fill above comes first
        with torch.cuda.stream(stream):
            view.copy_(x.cuda(non_blocking=False))
        s.allreduce_cuda(view, tensor_id=2 * c, stream=stream)
        host = x.clone()
        s.allreduce(host, tensor_id=2 * c + 1)
        got = view.cpu()
        if not torch.equal(got.view(BITS[dtype]), host.view(BITS[dtype])):
            bad = (got.view(BITS[dtype]) != host.view(BITS[dtype])).nonzero()[0].item()
            raise AssertionError(f"site {site} rank {rank} case {c} ({dtype} x {n}): device {got[bad]} "
                                 f"!= host {host[bad]} at element {bad}")
        edges = torch.cat([big[:64], big[64 + n:]]).cpu()
        if not bool((edges == -1).all()):
            raise AssertionError(f"site {site} rank {rank} case {c}: elements around the tensor changed")
        out.append(got)
    return out


def refusals(s):
    """What allreduce_cuda and allreduce_nccl refuse before they send
    anything: no step taken, no NCCL communicator made."""
    for call in ("allreduce_cuda", "allreduce_nccl"):
        checks = [
            (torch.ones(4), TypeError, f"{call} takes CUDA torch tensors, not a Tensor on cpu"),
            (torch.ones(4, dtype=torch.float64, device="cuda"), TypeError, "float32 or bfloat16, not torch.float64"),
            (torch.ones(4, 4, device="cuda").t(), ValueError, "must be contiguous"),
            (torch.ones(0, device="cuda"), ValueError, "the tensor is empty"),
        ]
        if call == "allreduce_nccl":
            checks.append((torch.ones(4, dtype=torch.bfloat16, device="cuda"), gradgate.Error,
                           "GG_ERR_INVALID: step "))
        for tensor, exc, text in checks:
            try:
                getattr(s, call)(tensor, tensor_id=1)
            except exc as e:
                assert text in str(e), f"{call}: {exc.__name__} '{e}' lacks '{text}'"
                assert exc is not gradgate.Error or "NCCL steps take float32 only" in str(e), f"{call}: '{e}'"
                print(f"{call} refused: {exc.__name__}: {e}")
            else:
                raise AssertionError(f"{call} took {text!r}")


def main():
    with LocalSites(sites=SITES, codec="fp32", algorithm="ring", step_timeout="30s") as mesh:
        results = mesh.run_ranks("torch-cuda", RANKS, rank_main, timeout=120)
        for key, out in results.items():
            if isinstance(out, Exception):
                raise AssertionError(f"rank {key} failed") from out
        assert len(results) == SITES * RANKS, f"{SITES * RANKS - len(results)} ranks did not finish"
        first = results[0, 0]
        for key, out in results.items():
            for c, (a, b) in enumerate(zip(first, out)):
                assert torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype])), f"rank {key} case {c} differs"
    print(f"torch cuda: {SITES} sites x {RANKS} ranks, {len(CASES)} cases: device == host, the same everywhere")


if __name__ == "__main__":
    main()
