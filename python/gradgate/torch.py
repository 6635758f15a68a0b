"""A DistributedDataParallel communication hook that all-reduces every
gradient bucket across all sites through the site's gateway.

    import gradgate, gradgate.torch
    session = gradgate.Session("train", local_rank, local_world_size)
    state = gradgate.torch.HookState(session, world_size=sites * local_world_size)
    model = DDP(model, process_group=site_group)    # the ranks of this site
    model.register_comm_hook(state, gradgate.torch.allreduce_hook)

DDP's own process group covers the ranks of one site (it broadcasts the
initial parameters there, so every site must start from the same ones:
seed them alike). The hook hands each bucket to the gateway, which sums it
over every rank of every site; the hook divides the sum by `world_size`,
the number of ranks at all sites together, as DDP's default averaging
does over its group.

Buckets go to a worker thread of the state, which keeps up to the
session's max_inflight all-reduces in flight while backward goes on; each
bucket's torch Future completes when its result is in the bucket. CUDA
buckets go through a host copy, or stay on the GPU, one bucket at a time:
with HookState(..., cuda=True) the gateway opens and sums them there
(Session.allreduce_cuda), with HookState(..., nccl=True) the site's ranks
reduce them to the gateway through their NCCL communicator, and it
broadcasts the sum back (Session.allreduce_nccl: float32 buckets only).
The Future completes once the averaged result is in the bucket. A failed all-reduce fails the bucket's Future with
gradgate.Error: Future.wait() raises it, and DDP fails backward() with it.
DDP's reducer (torch 1.13) reads the failed Future in C++ and raises a
RuntimeError whose message carries the gradgate error's ("Unable to cast
GG_ERR_TIMEOUT: step 1 (tensor 0): step 1 of job 'train' missed its ...");
HookState.error keeps the gradgate.Error itself, with its code.
"""

import collections
import contextlib
import threading

import torch

from . import Error, ERR_CLOSED, Session, _integer

__all__ = ["HookState", "allreduce_hook"]


def _on_stream(stream):
    """Work on a CUDA bucket's stream; for a host bucket (None), nothing:
    torch.cuda.stream(None) would still set up CUDA where there is a GPU."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _mark(stream):
    """An event at this point of `stream` (None for a host bucket): waiting
    for it waits for the bucket's work, not for what backward queued
    after it."""
    if stream is None:
        return None
    event = torch.cuda.Event()
    event.record(stream)
    return event


class HookState:
    """What allreduce_hook needs: the rank's session, the global world size
    (ranks at all sites), and the deadline of each bucket's all-reduce
    (timeout_ms <= 0: the gateway's step_timeout). cuda=True all-reduces
    CUDA buckets in place on the GPU (the gateway must be built with CUDA
    and see the ranks' GPU) instead of through a host copy; nccl=True
    does so through the site's NCCL communicator (the gateway must be
    built with NCCL; every rank of the site must use it). Call close()
    (or use it as a context manager) to stop its worker thread; the
    session stays open."""

    def __init__(self, session, world_size, timeout_ms=0, cuda=False, nccl=False):
        # Its worker reads the session from the start: anything else would
        # stop it with every bucket's Future left waiting.
        if not isinstance(session, Session):
            raise TypeError(f"session must be a gradgate.Session, not {type(session).__name__}")
        world_size, timeout_ms = _integer(world_size, "world_size"), _integer(timeout_ms, "timeout_ms")
        if world_size < 1:
            raise ValueError("world_size must be at least 1")
        if cuda and nccl:
            raise ValueError("cuda=True and nccl=True exclude each other: choose how CUDA buckets go")
        self.session = session
        self.world_size = world_size
        self.timeout_ms = timeout_ms
        self.cuda = bool(cuda)
        self.nccl = bool(nccl)
        self.buckets = 0          # buckets all-reduced so far
        self.bytes = 0            # their bytes
        self.error = None         # the last failure of a bucket (gradgate.Error, or what else failed)
        self._queue = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="gradgate-hook", daemon=True)
        self._worker.start()

    def submit(self, tensor, tensor_id):
        """Queues `tensor` for an all-reduce (sum over every rank, divided by
        world_size, in place); returns a torch Future of the tensor."""
        fut = torch.futures.Future()
        # A CUDA bucket is read once the work queued so far on the caller's
        # stream (backward's) is done, and written on that stream: by the
        # gateway or NCCL on the GPU (cuda=True, nccl=True), or by the host copies.
        stream = torch.cuda.current_stream(tensor.device) if tensor.is_cuda else None
        with self._cond:
            if self._closed:
                self._failed(fut, Error(ERR_CLOSED, "the hook's state is closed"))
                return fut
            self._queue.append((tensor, tensor_id, fut, stream, (self.cuda or self.nccl) and tensor.is_cuda))
            self._cond.notify()
        return fut

    def _take(self, block):
        with self._cond:
            while block and not self._queue and not self._closed:
                self._cond.wait()
            return self._queue.popleft() if self._queue else None

    def _finish(self, item, req):
        tensor, _, fut, stream, _ = item
        try:
            with _on_stream(stream):
                req.wait()
                tensor.div_(self.world_size)
                done = _mark(stream)
            if done is not None:
                done.synchronize()
            self._done(tensor, fut)
        except Exception as e:  # noqa: BLE001 (the bucket's Future carries it; the worker goes on)
            self._failed(fut, e)
        finally:
            req.free()

    def _failed(self, fut, e):
        self.error = e
        fut.set_exception(e)

    def _done(self, tensor, fut):
        self.buckets += 1
        self.bytes += tensor.numel() * tensor.element_size()
        fut.set_result(tensor)

    def _on_gpu(self, item):
        """A CUDA bucket all-reduced where it is; the Future completes once
        the average is in it, so the caller needs no stream of ours."""
        tensor, tensor_id, fut, stream, _ = item
        allreduce = self.session.allreduce_nccl if self.nccl else self.session.allreduce_cuda
        try:
            allreduce(tensor, tensor_id, self.timeout_ms, stream)
            with torch.cuda.stream(stream):
                tensor.div_(self.world_size)
                done = _mark(stream)
            done.synchronize()
            self._done(tensor, fut)
        except Exception as e:  # noqa: BLE001 (a CUDA error too: the bucket's Future carries it)
            self._failed(fut, e)

    def _run(self):
        inflight = collections.deque()
        limit = max(1, self.session.max_inflight)
        while True:
            # Start what is queued while there is room; else wait for the oldest.
            item = self._take(block=not inflight) if len(inflight) < limit else None
            if item is not None and item[4]:
                # Buckets end in order: the host ones in flight first.
                while inflight:
                    self._finish(*inflight.popleft())
                self._on_gpu(item)
                continue
            if item is not None:
                tensor, tensor_id, fut, stream, _ = item
                try:
                    with _on_stream(stream):  # a CUDA bucket's host copy, after backward's work
                        req = self.session.allreduce_async(tensor, tensor_id, self.timeout_ms)
                    inflight.append((item, req))
                except Exception as e:  # noqa: BLE001 (refused: the bucket's Future carries it)
                    self._failed(fut, e)
                continue
            if inflight:
                self._finish(*inflight.popleft())
                continue
            with self._cond:
                if self._closed and not self._queue:
                    return

    def close(self):
        """Lets the queued buckets finish, then stops the worker thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._worker.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def allreduce_hook(state, bucket):
    """DDP communication hook (register_comm_hook(state, allreduce_hook)):
    the bucket's gradients summed over every rank of every site and divided
    by state.world_size."""
    return state.submit(bucket.buffer(), bucket.index())
