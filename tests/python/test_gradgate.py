"""The Python package (python/gradgate) against real gateways on loopback:
results bit for bit, errors by code and message, the DDP hook.

    python3 tests/python/test_gradgate.py VERSION   (GRADGATE, GRADGATE_LIBRARY
    and GRADGATE_MAKE_CERTS name the build's gateway, library and certificate script)
"""

import gc
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import warnings
import weakref

import numpy as np
import torch

import gradgate
import gradgate.torch
from gradgate.local import LocalSites, free_loopback_ports

VERSION = sys.argv.pop(1) if len(sys.argv) > 1 else None
SITES, RANKS = 2, 2


def values(site, rank, n, step=0):
    """Multiples of 1/64 below 2^10: every sum is exact in float32."""
    i = np.arange(n, dtype=np.int64)
    return (((i * 2654435761 + site * 40503 + rank * 977 + step * 131) % 4096) - 2048).astype(np.float32) / 64


def on_every_rank(mesh, job, fn):
    """Runs fn(session, site, rank) on a thread per rank, each with its own
    session; returns the results by (site, rank), re-raising the first
    exception that is not a gradgate.Error (those are returned)."""
    out = mesh.run_ranks(job, RANKS, fn)
    for v in out.values():
        if isinstance(v, Exception) and not isinstance(v, gradgate.Error):
            raise v
    return out


class Library(unittest.TestCase):
    def test_version(self):
        self.assertEqual(gradgate.version(), VERSION)

    def test_no_gateway(self):
        with self.assertRaises(gradgate.Error) as cm:
            gradgate.Session("job", 0, 1, endpoint="unix:/nonexistent/gradgate.sock")
        self.assertEqual(cm.exception.code, gradgate.ERR_CONNECT)
        self.assertEqual(cm.exception.name, "GG_ERR_CONNECT")
        self.assertIn("unix:/nonexistent/gradgate.sock", cm.exception.message)

    def test_error_pickles(self):
        e = pickle.loads(pickle.dumps(gradgate.Error(gradgate.ERR_TIMEOUT, "step 3 (tensor 1): late")))
        self.assertIsInstance(e, gradgate.Error)
        self.assertEqual((e.code, e.name, e.message), (gradgate.ERR_TIMEOUT, "GG_ERR_TIMEOUT", "step 3 (tensor 1): late"))
        self.assertEqual(str(e), "GG_ERR_TIMEOUT: step 3 (tensor 1): late")

    def test_bad_arguments(self):
        with self.assertRaises(gradgate.Error) as cm:
            gradgate.Session("bad job/name", 0, 1, endpoint="unix:/nonexistent/gradgate.sock")
        self.assertEqual(cm.exception.code, gradgate.ERR_INVALID)
        self.assertIn("job", cm.exception.message)
        with self.assertRaises(gradgate.Error) as cm:
            gradgate.Session("job", 2, 2, endpoint="unix:/nonexistent/gradgate.sock")
        self.assertEqual(cm.exception.code, gradgate.ERR_INVALID)
        self.assertIn("rank", cm.exception.message)
        # Past the library's int they would wrap into another rank (2**32 + 1
        # into rank 1): refused as the library refuses them.
        for rank, nranks, message in ((2**32 + 1, 2, "rank 4294967297 is outside 0..1"),
                                      (-2**32, 1, "rank -4294967296 is outside 0..0"),
                                      (0, 2**32 + 1, "nranks 4294967297 is outside 1..4096")):
            with self.assertRaises(gradgate.Error) as cm:
                gradgate.Session("job", rank, nranks, endpoint="unix:/nonexistent/gradgate.sock")
            self.assertEqual((cm.exception.code, cm.exception.message), (gradgate.ERR_INVALID, message))
        # A gateway path given is the one run, or none.
        with self.assertRaisesRegex(FileNotFoundError, "/nonexistent/gradgate \\(the path given\\) is not an "
                                    "executable file"):
            LocalSites(sites=2, gradgate="/nonexistent/gradgate")
        # Integers only: 0.5 ms would truncate to 0, the gateway's step_timeout.
        for args, message in ((("job", 0.0, 1), "rank must be an integer, not float"),
                              (("job", 0, True), "nranks must be an integer, not a bool"),
                              ((None, 0, 1), "job must be a str, not NoneType")):
            with self.assertRaisesRegex(TypeError, message):
                gradgate.Session(*args, endpoint="unix:/nonexistent/gradgate.sock")
        # The library reads C strings: a NUL would cut the name or path
        # short, into another job or socket.
        for job, endpoint, message in (("nul\0alpha", "unix:/nonexistent/gradgate.sock",
                                        "job name has character 0x00 at 3; allowed are A-Z a-z 0-9 . _ -"),
                                       ("job", "unix:/nonexistent/gradgate.sock\0x",
                                        "endpoint 'unix:/nonexistent/gradgate.sock\\x00x' has a NUL character at 31")):
            with self.assertRaises(gradgate.Error) as cm:
                gradgate.Session(job, 0, 1, endpoint=endpoint)
            self.assertEqual((cm.exception.code, cm.exception.message), (gradgate.ERR_INVALID, message))
        # An empty endpoint is one, refused, not None's $GRADGATE_ENDPOINT.
        before = os.environ.get("GRADGATE_ENDPOINT")
        os.environ["GRADGATE_ENDPOINT"] = "unix:/nonexistent/env.sock"
        try:
            with self.assertRaisesRegex(gradgate.Error, "the gateway endpoint given is empty"):
                gradgate.Session("job", 0, 1, endpoint="")
            with self.assertRaisesRegex(gradgate.Error, "unix:/nonexistent/env.sock"):
                gradgate.Session("job", 0, 1)
        finally:
            if before is None:
                del os.environ["GRADGATE_ENDPOINT"]
            else:
                os.environ["GRADGATE_ENDPOINT"] = before
        with self.assertRaisesRegex(TypeError, "sites must be an integer, not float"):
            LocalSites(sites=2.5)
        # The hook's worker needs a session: anything else is refused at
        # once, not left to hang every bucket.
        with self.assertRaisesRegex(TypeError, "session must be a gradgate.Session, not NoneType"):
            gradgate.torch.HookState(None, world_size=2)


    def test_gateways_end_with_their_owner(self):
        # A process that started LocalSites and was killed before stop():
        # its gateways end and their folder goes all the same.
        owner = subprocess.Popen(
            [sys.executable, "-c", "import os, resource, signal, sys\n"
             "from gradgate.local import LocalSites\n"
             # Past select()'s 1024 files, as a training process may be.
             "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
             "if hard == resource.RLIM_INFINITY or hard >= 1200:\n"
             "    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))\n"
             "    held = [open(os.devnull) for _ in range(1100)]\n"
             "m = LocalSites(sites=2).start()\n"
             "print(m.dir, *[p.pid for p in m.procs], flush=True)\n"
             "os.kill(os.getpid(), signal.SIGKILL)\n"],
            stdout=subprocess.PIPE, text=True)
        out, _ = owner.communicate(timeout=60)
        self.assertEqual(owner.returncode, -signal.SIGKILL)
        folder, *pids = out.split()
        self.assertEqual(len(pids), 2, out)

        def alive(pid):  # a zombie is not: it waits for init to reap it
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except FileNotFoundError:
                return False

        deadline = time.monotonic() + 20
        while (os.path.exists(folder) or any(map(alive, pids))) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual([p for p in pids if alive(p)], [])
        self.assertFalse(os.path.exists(folder))


    def test_forked_child_leaves_the_gateways(self):
        # stop() in a process forked from the owner (a with block unwinding
        # there) ends nothing, and keeps the folder and the watcher.
        mesh = LocalSites(sites=2).start()
        try:
            child = os.fork()
            if child == 0:
                mesh.stop()
                os._exit(0)
            self.assertEqual(os.waitpid(child, 0)[1], 0)
            self.assertEqual([p.poll() for p in mesh.procs], [None, None])
            self.assertTrue(os.path.isdir(mesh.dir))
            self.assertIsNone(mesh.watcher.poll())
        finally:
            self.assertEqual(mesh.stop(), [0, 0])


class WithGateways(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mesh = LocalSites(sites=SITES, codec="fp32", algorithm="direct", step_timeout="20s").start()

    @classmethod
    def tearDownClass(cls):
        codes = cls.mesh.stop()
        assert codes == [0] * SITES, f"gateways exited with {codes}"

    def test_numpy_sync_and_async(self):
        n = 100003

        def fn(s, site, rank):
            self.assertEqual(s.site, f"site-{site}")
            a = values(site, rank, n)
            self.assertIs(s.allreduce(a, tensor_id=1), a)
            b = values(site, rank, n, step=1)
            req = s.allreduce_async(b, tensor_id=2)
            self.assertTrue(req.wait())
            self.assertTrue(req.done())
            # Freed before it finished: nobody learns how it ended.
            gone = s.allreduce_async(np.ones(8, np.float32), tensor_id=5)
            gone.free()
            with self.assertRaisesRegex(gradgate.Error, "the request was freed"):
                gone.done()
            s.allreduce(np.ones(8, np.float32), tensor_id=6)  # after the freed one, in step order
            return a, b

        out = on_every_rank(self.mesh, "np", fn)
        want_a = sum(values(st, r, n) for st in range(SITES) for r in range(RANKS))
        want_b = sum(values(st, r, n, 1) for st in range(SITES) for r in range(RANKS))
        for key, (a, b) in out.items():
            self.assertEqual(a.tobytes(), want_a.tobytes(), key)
            self.assertEqual(b.tobytes(), want_b.tobytes(), key)

    def test_shared_buffer_and_torch(self):
        n = 4099

        def fn(s, site, rank):
            buf = s.buffer(n)
            buf[:] = values(site, rank, n)
            # A view of it off its elements' alignment is refused, and
            # uses no step.
            with self.assertRaisesRegex(gradgate.Error, "not aligned to the 4-byte"):
                s.allreduce(buf.view(np.uint8)[2:18].view(np.float32), tensor_id=3)
            s.allreduce(buf, tensor_id=3)
            shared = buf.copy()
            s.free_buffer(buf)
            with self.assertRaises(gradgate.Error):
                s.free_buffer(np.zeros(4, np.float32))
            t = torch.from_numpy(values(site, rank, n, 2)).to(torch.bfloat16)
            s.allreduce(t, tensor_id=4)
            strided = torch.from_numpy(values(site, rank, 2 * n, 3))[::2]  # not contiguous: through a copy
            s.allreduce(strided, tensor_id=5)
            # Strides 3 and 2 over sizes 2 and 3 interleave without
            # overlapping: taken, through a copy.
            woven = torch.from_numpy(values(site, rank, 8, 4)).as_strided((2, 3), (3, 2))
            s.allreduce(woven, tensor_id=6)
            # A negative view's memory holds its elements negated.
            negated = torch._neg_view(torch.from_numpy(values(site, rank, n, 5)))
            s.allreduce(negated, tensor_id=7)
            # An inference tensor takes the copy's result back.
            with torch.inference_mode():
                inferred = torch.from_numpy(values(site, rank, 2 * n, 6)).clone()[::2]
            s.allreduce(inferred, tensor_id=8)
            return shared, t, strided, woven, negated, inferred

        out = on_every_rank(self.mesh, "torch", fn)
        want = sum(values(st, r, n) for st in range(SITES) for r in range(RANKS))
        # bf16 inputs are widened exactly, summed in float32, rounded back once.
        want_bf = sum(torch.from_numpy(values(st, r, n, 2)).to(torch.bfloat16).float()
                      for st in range(SITES) for r in range(RANKS)).to(torch.bfloat16)
        def want_of(step, n, view=lambda a: a):
            return sum(view(torch.from_numpy(values(st, r, n, step))) for st in range(SITES) for r in range(RANKS))

        for key, (shared, t, strided, woven, negated, inferred) in out.items():
            self.assertEqual(shared.tobytes(), want.tobytes(), key)
            self.assertTrue(torch.equal(t, want_bf), key)
            self.assertTrue(torch.equal(strided, want_of(3, 2 * n, lambda a: a[::2])), key)
            self.assertTrue(torch.equal(woven, want_of(4, 8, lambda a: a.as_strided((2, 3), (3, 2)))), key)
            self.assertTrue(torch.equal(negated, -want_of(5, n)), key)
            self.assertTrue(torch.equal(inferred, want_of(6, 2 * n, lambda a: a[::2])), key)

    def test_buffer_keeps_its_session(self):
        s = gradgate.Session("keep", 0, 1, endpoint=self.mesh.endpoint(0))
        buf = s.buffer(1024)
        session = weakref.ref(s)
        del s
        gc.collect()
        self.assertIsNotNone(session(), "a session only its buffer refers to was collected")
        buf[:] = 2.0
        self.assertEqual(float(buf.sum()), 2048.0)
        del buf
        gc.collect()
        self.assertIsNone(session(), "the session outlived the last array of its buffers")

    def test_collection_under_the_module_locks(self):
        """What runs under the package's mapping and retirement locks
        allocates, so a garbage collection may run there, on that thread,
        and finalize a session (close()) or a given-back buffer's memory
        (_unretire()): both take those locks again, which must not hang.
        In a process of its own, which a hang cannot leave holding them."""
        code = """if True:
            import gc, sys, weakref
            import gradgate
            gc.disable()  # no collection but the one under the locks
            s = gradgate.Session("relock", 0, 1, endpoint=sys.argv[1])
            kept = s.buffer(1024)
            gone = s.buffer(1024)
            s.free_buffer(gone)  # retired while its array lives
            session = weakref.ref(s)
            cycle = [s, kept, gone]
            cycle.append(cycle)  # only a collection frees them
            del s, kept, gone, cycle
            with gradgate._mapping_lock, gradgate._retired_lock:
                gc.collect()
                print("collected" if session() is None else "the session outlived the collection")
        """
        try:
            out = subprocess.run([sys.executable, "-c", code, self.mesh.endpoint(0)], capture_output=True,
                                 text=True, timeout=30)
        except subprocess.TimeoutExpired:
            self.fail("a collection under the package's locks hung: a finalizer took them again")
        self.assertEqual((out.returncode, out.stdout.strip()), (0, "collected"), out.stderr)

    def test_buffers_of_sessions_side_by_side(self):
        """Sessions of one process that make and give back shared buffers
        at once: one's new buffer may take the addresses another's just
        gave back, and is its own, not refused as the given-back one. The
        retirement of a given-back buffer is slowed here, so that another
        session's buffer() comes between it and the library's unmapping
        whenever nothing keeps them together."""
        n, steps = 1000, 12
        retire = gradgate._retire

        def slow_retire(*args):
            time.sleep(0.005)
            retire(*args)

        def fn(s, site, rank):
            for step in range(steps):
                buf = s.buffer(n + 1024 * (step % 3))
                buf[:] = 1.0
                s.allreduce(buf, tensor_id=1 + step % 3)
                self.assertEqual(float(buf.sum()), SITES * RANKS * buf.size)
                s.free_buffer(buf)
            return "ok"

        gradgate._retire = slow_retire
        try:
            out = on_every_rank(self.mesh, "side-by-side", fn)
        finally:
            gradgate._retire = retire
        self.assertEqual(out, {(s, r): "ok" for s in range(SITES) for r in range(RANKS)})

    def test_freed_buffer(self):
        """An array of a buffer given back reads zeros, not unmapped memory,
        and is refused until it is collected."""
        s = gradgate.Session("freed", 0, 1, endpoint=self.mesh.endpoint(0))
        buf = s.buffer(1024)
        buf[:] = 1.0
        view, tensor, address = buf[8:16], torch.from_numpy(buf), buf.ctypes.data
        s.free_buffer(buf)
        # A strided view is summed in a copy, written back into the freed
        # pages: refused too, as is a transposed one.
        for call in (lambda: s.allreduce(buf, tensor_id=1), lambda: s.allreduce(view, tensor_id=1),
                     lambda: s.allreduce_async(tensor, tensor_id=1), lambda: s.allreduce(tensor[::2], tensor_id=1),
                     lambda: s.allreduce(tensor[4:].view(30, 34).t(), tensor_id=1)):
            with self.assertRaises(gradgate.Error) as cm:
                call()
            self.assertEqual((cm.exception.code, cm.exception.message),
                             (gradgate.ERR_INVALID, "the array is in a shared buffer that free_buffer() or close() "
                                                    "gave back: it must not be used after"))
        self.assertEqual((float(buf.sum()), float(tensor.sum())), (0.0, 0.0))
        # Freed while a request uses it: the library keeps it until the
        # request ends, then the pages go in its place.
        busy = s.buffer(64)
        busy[:] = 1.0
        req = s.allreduce_async(busy, tensor_id=2, timeout_ms=200)  # no other site takes part
        s.free_buffer(busy)
        with self.assertRaisesRegex(gradgate.Error, "free_buffer\(\) or close\(\) gave back"):
            s.allreduce(busy, tensor_id=3)
        with self.assertRaises(gradgate.Error) as cm:
            req.wait()
        self.assertEqual(cm.exception.code, gradgate.ERR_TIMEOUT)
        self.assertEqual(float(busy.sum()), 0.0)
        # Let go of within a call that maps a new buffer, which may take
        # its addresses: the new one is not refused.
        again = s.buffer(64)
        req = s.allreduce_async(again, tensor_id=4, timeout_ms=100)
        s.free_buffer(again)
        time.sleep(0.5)  # the step failed at the gateway; the library learns it in the next call
        fresh = s.buffer(64)
        with self.assertRaises(gradgate.Error) as cm:
            s.allreduce(fresh, tensor_id=5, timeout_ms=100)
        self.assertEqual(cm.exception.code, gradgate.ERR_TIMEOUT)
        with self.assertRaises(gradgate.Error) as cm:
            req.wait()
        self.assertEqual(cm.exception.code, gradgate.ERR_TIMEOUT)
        s.free_buffer(fresh)
        # close() gives back every buffer.
        last = s.buffer(16)
        last[:] = 1.0
        s.close()
        self.assertEqual(float(last.sum()), 0.0)
        with gradgate.Session("freed-2", 0, 1, endpoint=self.mesh.endpoint(0)) as other:
            with self.assertRaisesRegex(gradgate.Error, "gave back: it must not be used after"):
                other.allreduce(last, tensor_id=1)
        self.assertIn(address, gradgate._retired)
        del buf, view, tensor, busy, last, again, fresh
        gc.collect()
        self.assertNotIn(address, gradgate._retired)

    def test_closed_session(self):
        s = gradgate.Session("closed", 0, 1, endpoint=self.mesh.endpoint(0))
        buf = s.buffer(16)
        s.close()
        for call in (lambda: s.free_buffer(buf), lambda: s.allreduce(np.ones(4, np.float32), tensor_id=1),
                     lambda: s.buffer(4)):
            with self.assertRaises(gradgate.Error) as cm:
                call()
            self.assertEqual((cm.exception.code, cm.exception.message), (gradgate.ERR_CLOSED, "the session is closed"))

    def test_ddp_backward_fails_with_the_error(self):
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        port = free_loopback_ports(1)[0]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        try:
            # A job only this rank runs: the other site never sends its part.
            with gradgate.Session("ddp-fail", 0, 1, endpoint=self.mesh.endpoint(0)) as s, \
                    gradgate.torch.HookState(s, world_size=SITES, timeout_ms=300) as state:
                model = DDP(torch.nn.Linear(8, 3))
                model.register_comm_hook(state, gradgate.torch.allreduce_hook)
                # torch 1.13's reducer reads the failed Future in C++: a
                # RuntimeError that carries the gradgate error's text.
                with self.assertRaisesRegex(RuntimeError, r"GG_ERR_TIMEOUT: step 1 \(tensor 0\): step 1 of job "
                                                          r"'ddp-fail' missed its 300ms deadline"):
                    model(torch.ones(4, 8)).sum().backward()
                self.assertIsInstance(state.error, gradgate.Error)
                self.assertEqual(state.error.code, gradgate.ERR_TIMEOUT)
        finally:
            dist.destroy_process_group()

    def test_refused_arrays(self):
        def fn(s, site, rank):
            with self.assertRaisesRegex(TypeError, "float32"):
                s.allreduce(np.zeros(4, np.float64), tensor_id=1)
            with self.assertRaisesRegex(TypeError, "float32 or bfloat16"):
                s.allreduce(torch.zeros(4, dtype=torch.float16), tensor_id=1)
            with self.assertRaisesRegex(ValueError, "C-contiguous"):
                s.allreduce(np.zeros(8, np.float32)[::2], tensor_id=1)
            with self.assertRaisesRegex(ValueError, "empty"):
                s.allreduce(np.zeros(0, np.float32), tensor_id=1)
            # Objects of numpy's and torch's that are no arrays.
            for other in ([1.0, 2.0], np.dtype("f4"), torch.Size([3]), torch.nn.Linear(2, 2),
                          torch.ones(3).storage()):
                with self.assertRaisesRegex(TypeError, "numpy arrays and torch tensors, not " + re.escape(type(other).__name__)):
                    s.allreduce(other, tensor_id=1)
            with self.assertRaisesRegex(ValueError, "the meta device, which holds no data"):
                s.allreduce(torch.ones(4, device="meta"), tensor_id=1)
            with self.assertRaisesRegex(TypeError, "allreduce_cuda takes CUDA torch tensors, not a Tensor on cpu"):
                s.allreduce_cuda(torch.zeros(4), tensor_id=1)
            with self.assertRaisesRegex(TypeError, "allreduce_cuda takes CUDA torch tensors, not a ndarray"):
                s.allreduce_cuda(np.zeros(4, np.float32), tensor_id=1)
            with self.assertRaisesRegex(TypeError, "allreduce_nccl takes CUDA torch tensors, not a Tensor on cpu"):
                s.allreduce_nccl(torch.zeros(4), tensor_id=1)
            with self.assertRaisesRegex(TypeError, "allreduce_nccl takes CUDA torch tensors, not a ndarray"):
                s.allreduce_nccl(np.zeros(4, np.float32), tensor_id=1)
            with self.assertRaisesRegex(TypeError, "dense"):
                s.allreduce(torch.ones(4).to_sparse(), tensor_id=1)
            with self.assertRaisesRegex(ValueError, "expanded or overlapping view"):
                s.allreduce(torch.ones(1).expand(4), tensor_id=1)
            # Elements [0, 1] and [1, 0] are one: each site would write back
            # one of two sums, and the sites would disagree.
            with self.assertRaisesRegex(ValueError, "elements share memory"):
                s.allreduce(torch.arange(10.).as_strided((2, 2), (1, 1)), tensor_id=1)
            # A tensor id past 32 bits would wrap into another rank's id.
            with self.assertRaisesRegex(ValueError, "tensor_id must be 0 to 4294967295"):
                s.allreduce(np.ones(4, np.float32), tensor_id=(1 << 32) + 1)
            with self.assertRaisesRegex(ValueError, "tensor_id must be 0 to 4294967295"):
                s.allreduce_async(np.ones(4, np.float32), tensor_id=-1)
            with self.assertRaisesRegex(ValueError, "at least 1 element"):
                s.buffer(-1)
            with self.assertRaisesRegex(TypeError, "timeout_ms must be an integer, not float"):
                s.allreduce(np.ones(4, np.float32), tensor_id=1, timeout_ms=0.5)
            with self.assertRaisesRegex(TypeError, "tensor_id must be an integer, not float"):
                s.allreduce_async(np.ones(4, np.float32), tensor_id=3.7)
            for flag in (True, np.True_, torch.tensor(True)):
                with self.assertRaisesRegex(TypeError, "tensor_id must be an integer, not a bool"):
                    s.allreduce(np.ones(4, np.float32), tensor_id=flag)
            # Written in place behind autograd, its gradients would be wrong.
            with self.assertRaisesRegex(ValueError, "requires grad"):
                s.allreduce(torch.ones(4, requires_grad=True).exp(), tensor_id=1)
            # Memory the process may not write (torch keeps no read-only
            # flag): the result written in place would crash the process.
            # Told only where the kernel has MADV_POPULATE_WRITE (5.14).
            if gradgate._populate_write():
                with tempfile.NamedTemporaryFile() as f:
                    np.zeros(4096, np.float32).tofile(f.name)
                    ro = np.memmap(f.name, dtype=np.float32, mode="r")
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # torch's: "The given NumPy array is not writable"
                        for t in (torch.from_numpy(ro), torch.from_numpy(ro)[1000:3000:2]):
                            with self.assertRaisesRegex(ValueError, r"memory at 0x[0-9a-f]+ is read-only \(r--s in "
                                                        r"/proc/self/maps\): the result is written in place"):
                                s.allreduce(t, tensor_id=1)
                    del ro
            # A count whose bytes pass size_t would wrap into a small buffer.
            for count in (2**62, 2**62 + 1, s.max_message_bytes // 4 + 1):
                with self.assertRaises(gradgate.Error) as cm:
                    s.buffer(count)
                self.assertEqual(cm.exception.code, gradgate.ERR_TOO_LARGE)
                self.assertIn(f"{count * 4} bytes exceed the max_message", cm.exception.message)
            # The whole buffer, not a slice of it.
            buf = s.buffer(8)
            with self.assertRaisesRegex(gradgate.Error, "not a shared buffer of this session"):
                s.free_buffer(buf[:4])
            with self.assertRaisesRegex(TypeError, "free_buffer takes an array from buffer"):
                s.free_buffer([1.0])
            s.free_buffer(buf)
            s.free_buffer(None)
            # Nothing was sent: the ranks are still in step. Subclasses of
            # numpy's array and torch's tensor are arrays and tensors.
            class Array(np.ndarray):
                pass

            class Tensor(torch.Tensor):
                pass

            a = np.ones(10, np.float32).view(Array)
            self.assertIs(s.allreduce(a, tensor_id=9), a)
            t = torch.ones(10).as_subclass(Tensor)
            req = s.allreduce_async(t, tensor_id=10)
            self.assertTrue(req.wait())
            # A finished request's wait checks its timeout all the same.
            with self.assertRaisesRegex(TypeError, "timeout_ms must be an integer, not str"):
                req.wait("x")
            return a, t

        for key, (a, t) in on_every_rank(self.mesh, "refused", fn).items():
            self.assertEqual(a.tolist(), [SITES * RANKS] * 10, key)
            self.assertEqual(t.tolist(), [SITES * RANKS] * 10, key)

    def test_mismatch_and_timeout(self):
        done = threading.Barrier(SITES * RANKS)

        def fn(s, site, rank):
            errors = []
            try:
                s.allreduce(np.ones(100 + (site == 1 and rank == 1), np.float32), tensor_id=1)
            except gradgate.Error as e:
                errors.append(e)
            # Site 1 rank 1 does not take part, but stays: everyone else
            # misses the deadline (rather than hear that it left).
            if (site, rank) != (1, 1):
                try:
                    s.allreduce(np.ones(100, np.float32), tensor_id=2, timeout_ms=500)
                except gradgate.Error as e:
                    errors.append(e)
            done.wait(30)
            return errors

        out = on_every_rank(self.mesh, "fail", fn)
        for key, errors in out.items():
            self.assertEqual(errors[0].code, gradgate.ERR_MISMATCH, (key, str(errors[0])))
            self.assertIn("announced", errors[0].message)
            if key != (1, 1):
                self.assertEqual(errors[1].code, gradgate.ERR_TIMEOUT, (key, str(errors[1])))
                self.assertEqual(errors[1].name, "GG_ERR_TIMEOUT")

    def test_hook(self):
        n = 3000

        class Bucket:
            def __init__(self, t, i):
                self.t, self.i = t, i

            def buffer(self):
                return self.t

            def index(self):
                return self.i

        def fn(s, site, rank):
            with self.assertRaisesRegex(ValueError, "cuda=True and nccl=True exclude each other"):
                gradgate.torch.HookState(s, world_size=SITES * RANKS, cuda=True, nccl=True)
            with self.assertRaisesRegex(TypeError, "timeout_ms must be an integer, not float"):
                gradgate.torch.HookState(s, world_size=SITES * RANKS, timeout_ms=0.5)
            # Host buckets go through host copies whatever the state says of CUDA ones.
            with gradgate.torch.HookState(s, world_size=SITES * RANKS, cuda=site == 0, nccl=site == 1) as state:
                futs = [gradgate.torch.allreduce_hook(state, Bucket(torch.from_numpy(values(site, rank, n, k)), k))
                        for k in range(4)]
                results = [f.wait() for f in futs]
                bad = gradgate.torch.allreduce_hook(state, Bucket(torch.zeros(3, dtype=torch.int32), 9))
                with self.assertRaisesRegex(Exception, "float32 or bfloat16"):
                    bad.wait()
                self.assertEqual(state.buckets, 4)
            return results

        out = on_every_rank(self.mesh, "hook", fn)
        for k in range(4):
            want = sum(values(st, r, n, k) for st in range(SITES) for r in range(RANKS)) / np.float32(SITES * RANKS)
            for key, results in out.items():
                self.assertEqual(results[k].numpy().tobytes(), want.astype(np.float32).tobytes(), (key, k))


if __name__ == "__main__":
    unittest.main(verbosity=2)
