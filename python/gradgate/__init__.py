"""gradgate from Python: all-reduce numpy arrays and torch tensors through
the site's gateway.

Pure Python over the shared client library (libgradgate.so.0, through
ctypes), with the semantics of include/gradgate.h:

    import gradgate
    with gradgate.Session("train", rank, nranks) as s:   # endpoint: $GRADGATE_ENDPOINT
        s.allreduce(grads, tensor_id=3)                   # in place, summed over every rank of every site
        req = s.allreduce_async(other, tensor_id=4)       # input taken now; the result is in `other`
        req.wait()                                        # by the time wait() reports it finished

Arrays are C-contiguous, writeable float32 numpy arrays, or float32 /
bfloat16 dense torch tensors (non-contiguous ones go through a contiguous
copy; sparse tensors, views whose elements share memory, tensors that
require grad and tensors over memory the process may not write, where
that can be told, are refused: see the README); tensor_id is an integer 0 to 2**32 - 1, and
timeout_ms, rank and nranks are integers too (floats are refused, never
truncated);
allreduce() moves CUDA tensors through a host copy, allreduce_cuda() sums
them where they are, on the GPU (gg_allreduce_cuda), and allreduce_nccl()
through the site's NCCL communicator, which the gateway is a rank of
(gg_allreduce_nccl). Failures raise
gradgate.Error with the library's code (Error.code, Error.name) and
message; arrays and tensors refused here, before anything is sent, raise
TypeError (type, dtype, layout) or ValueError (the rest), and other
arguments of the wrong type TypeError; values the library checks (a rank
out of range, a job name, a buffer too large, a closed session) raise
gradgate.Error, also before anything is sent.

The library is found at $GRADGATE_LIBRARY when set, else as
libgradgate.so.0 on the loader's path (meson install puts it there): that
soname, never another version's.
"""

import contextlib
import ctypes
import itertools
import operator
import os
import sys
import threading
import weakref

__all__ = ["Error", "Session", "Request", "version", "DTYPE_F32", "DTYPE_BF16"]

DTYPE_F32 = 1
DTYPE_BF16 = 2

# enum gg_errc (include/gradgate.h)
OK = 0
ERR_INVALID = -1
ERR_NOMEM = -2
ERR_SYSTEM = -3
ERR_CONNECT = -4
ERR_REFUSED = -5
ERR_PROTOCOL = -6
ERR_CLOSED = -7
ERR_TIMEOUT = -8
ERR_TOO_LARGE = -9
ERR_MISMATCH = -10
ERR_RANK = -11
ERR_SITE = -12
ERR_BUSY = -13
ERR_AGAIN = -14
ERR_LIMIT = -15
_CODES = {v: "GG_" + k for k, v in list(globals().items()) if k == "OK" or k.startswith("ERR_")}
__all__ += [name[3:] for name in _CODES.values()]

_ERROR_MESSAGE_MAX = 256


class _Error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("message", ctypes.c_char * _ERROR_MESSAGE_MAX)]


class _SessionInfo(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("site", ctypes.c_char * 64),
        ("max_message_bytes", ctypes.c_uint64),
        ("max_inflight", ctypes.c_uint32),
        ("step_timeout_ms", ctypes.c_uint32),
        ("max_buffers", ctypes.c_uint32),
    ]


class Error(Exception):
    """A failed gradgate call: `code` (a negative enum gg_errc value, e.g.
    gradgate.ERR_TIMEOUT), `name` ("GG_ERR_TIMEOUT") and the library's
    one-line `message` naming what failed."""

    def __init__(self, code, message):
        self.code = code
        self.name = _CODES.get(code, "GG_ERR_UNKNOWN")
        self.message = message
        super().__init__(f"{self.name}: {message}")

    def __reduce__(self):
        # Pickled as what it was made from (multiprocessing, torch elastic).
        return (type(self), (self.code, self.message))


_lib = None
_lib_lock = threading.Lock()


def _load():
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = os.environ.get("GRADGATE_LIBRARY") or "libgradgate.so.0"
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise ImportError(
                f"cannot load the gradgate client library '{path}': {e}; install it (meson install) "
                "or set GRADGATE_LIBRARY to the path of libgradgate.so.0") from e
        P, E = ctypes.c_void_p, ctypes.POINTER(_Error)
        sigs = {
            "gg_session_open": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                               ctypes.POINTER(P), E]),
            "gg_session_get_info": (ctypes.c_int, [P, ctypes.POINTER(_SessionInfo)]),
            "gg_buffer_alloc": (ctypes.c_int, [P, ctypes.c_size_t, ctypes.POINTER(P), E]),
            "gg_buffer_free": (ctypes.c_int, [P, P, E]),
            "gg_allreduce": (ctypes.c_int, [P, P, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint32, ctypes.c_int, E]),
            "gg_allreduce_start": (ctypes.c_int, [P, P, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint32,
                                                  ctypes.c_int, ctypes.POINTER(P), E]),
            "gg_allreduce_cuda": (ctypes.c_int, [P, P, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint32, P,
                                                 ctypes.c_int, E]),
            "gg_allreduce_nccl": (ctypes.c_int, [P, P, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint32, P,
                                                 ctypes.c_int, E]),
            "gg_wait": (ctypes.c_int, [P, ctypes.c_int, E]),
            "gg_request_free": (None, [P]),
            "gg_session_close": (None, [P]),
            "gg_strerror": (ctypes.c_char_p, [ctypes.c_int]),
            "gg_version": (ctypes.c_char_p, []),
        }
        for name, (res, args) in sigs.items():
            try:
                fn = getattr(lib, name)
            except AttributeError as e:
                raise ImportError(f"'{path}' is not a gradgate client library: it lacks {name}") from e
            fn.restype, fn.argtypes = res, args
        _lib = lib
        return lib


def version():
    """The loaded library's version, "MAJOR.MINOR.PATCH"."""
    return _load().gg_version().decode()


def _check(rc, err):
    if rc:
        raise Error(rc, err.message.decode(errors="replace"))


_INT_MAX = 2**31 - 1
_MAX_RANKS = 4096  # GG_CTRL_MAX_RANKS: ranks of a job at one site


def _integer(value, name):
    """An integer argument as a Python int. Floats and bools are refused:
    truncating 0.5 ms to 0 would mean the gateway's step_timeout, and
    tensor 3.7 would announce tensor 3."""
    # numpy's and torch's bools take operator.index() too
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool") or \
            str(getattr(value, "dtype", "")) in ("bool", "torch.bool"):
        raise TypeError(f"{name} must be an integer, not a bool ({value})")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {type(value).__name__} ({value!r})") from None


def _tensor_id(tensor_id):
    """tensor_id as the library's uint32: never wrapped, which would let
    two different ids announce the same tensor."""
    tid = _integer(tensor_id, "tensor_id")
    if not 0 <= tid < 2**32:
        raise ValueError(f"tensor_id must be 0 to {2**32 - 1}, not {tensor_id}")
    return tid


def _timeout(timeout_ms):
    """timeout_ms as the library's int, saturated rather than wrapped: past
    its range a timeout means the same as at its end."""
    return max(-_INT_MAX - 1, min(_INT_MAX, _integer(timeout_ms, "timeout_ms")))


# ---- shared buffers given back while arrays still view them ----------------
#
# free_buffer() and close() unmap a shared buffer, but numpy cannot be told
# that the arrays viewing it are gone: one read of them would crash the
# process. So where nothing else took its addresses, private zero pages are
# mapped in its place, kept until the last such array is collected, and
# all-reduces of them are refused. A buffer freed while a request in flight
# uses it stays the library's until that request ends; its pages go in
# place right after the call in which the library lets go of it.

_retired = {}  # address -> [bytes, mapped here, token of this retirement]
# Held from the library's unmapping of a buffer to its retirement here, and
# from a mapping to its superseding what was retired there: another
# session's new buffer could otherwise take the addresses in between, and
# be taken for the one given back. (Inside a session's own lock.) Both
# locks are re-entrant: what runs under them allocates, and a garbage
# collection then may finalize a session (close()) or an array
# (_unretire()) on the same thread.
_retired_lock = threading.RLock()
_mapping_lock = threading.RLock()
_retirements = itertools.count()
_libc = None
_PROT_READ, _PROT_WRITE = 1, 2
_MAP_PRIVATE, _MAP_ANONYMOUS, _MAP_FIXED_NOREPLACE = 0x02, 0x20, 0x100000


def _mm():
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc = libc
    return _libc


def _map_in_place(address, size):
    """Maps zero pages at [address, address + size) unless anything is
    mapped there; whether it did."""
    libc = _mm()
    got = libc.mmap(address, size, _PROT_READ | _PROT_WRITE, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_FIXED_NOREPLACE,
                    -1, 0)
    if got == address:
        return True
    if got is not None and got != ctypes.c_void_p(-1).value:
        libc.munmap(got, size)  # a kernel before 4.17, which took the flag for a hint
    return False


def _retire(address, size, owner):
    """The shared buffer at `address` was given back while `owner` (the
    _SharedMemory its arrays view) lives."""
    token = next(_retirements)
    with _retired_lock:
        _retired[address] = [size, _map_in_place(address, size), token]
    weakref.finalize(owner, _unretire, address, token)


def _unretire(address, token):
    with _retired_lock:
        entry = _retired.get(address)
        if entry is None or entry[2] != token:
            return  # superseded by a new buffer there
        del _retired[address]
        if entry[1]:
            _mm().munmap(address, entry[0])


def _settle():
    """Maps pages in place of the retired buffers the library has let go
    of since they were retired."""
    with _retired_lock:
        for address, entry in list(_retired.items()):
            if not entry[1]:
                entry[1] = _map_in_place(address, entry[0])
                if entry[1] and _retired.get(address) is not entry:
                    _mm().munmap(address, entry[0])  # its arrays went meanwhile (a collection)


def _page_round(nbytes):
    """The bytes the library maps for a shared buffer of nbytes."""
    page = os.sysconf("SC_PAGE_SIZE")
    return (nbytes + page - 1) // page * page


def _supersede(address, size):
    """A new shared buffer took addresses of retired ones the library let
    go of within the same call: they are the new one's now."""
    with _retired_lock:
        for old, (n, mapped, _) in list(_retired.items()):
            if not mapped and old < address + size and address < old + n:
                del _retired[old]


def _check_live(ptr, nbytes):
    with _retired_lock:
        for address, (size, _, _) in list(_retired.items()):
            if ptr < address + size and address < ptr + nbytes:
                raise Error(ERR_INVALID, "the array is in a shared buffer that free_buffer() or close() gave "
                            "back: it must not be used after")


# ---- what an all-reduce takes: a pointer, a count and a dtype --------------

def _is_tensor(x):
    """Whether x is a torch tensor (subclasses too). torch is imported
    here only where a caller already did, for x to be one."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _is_ndarray(x):
    """Whether x is a numpy array (subclasses too)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def _torch_dtype(t):
    """The gradgate dtype of torch tensor t, which must be one gradgate can
    all-reduce in place."""
    import torch
    if t.dtype == torch.float32:
        dtype = DTYPE_F32
    elif t.dtype == torch.bfloat16:
        dtype = DTYPE_BF16
    else:
        raise TypeError(f"torch tensors must be float32 or bfloat16, not {t.dtype}")
    if t.layout != torch.strided:
        raise TypeError(f"torch tensors must be dense (torch.strided), not {t.layout}")
    if t.numel() == 0:
        raise ValueError("the tensor is empty")
    if not t.is_contiguous() and _overlaps(t):
        raise ValueError("the tensor's elements share memory (an expanded or overlapping view): the result "
                         "cannot be written back into it")
    if t.requires_grad:
        # Written in place behind autograd's back, its gradients would be
        # silently wrong.
        raise ValueError("the tensor requires grad: all-reduce its .data or a detached tensor")
    return dtype


def _overlaps(t):
    """Whether two elements of strided tensor t lie at the same place."""
    dims = sorted((stride, size) for size, stride in zip(t.shape, t.stride()) if size > 1)
    reach = 0  # the furthest offset the dimensions of smaller strides reach
    for stride, size in dims:
        if stride <= reach:
            break
        reach += stride * (size - 1)
    else:
        return False
    # Interleaved dimensions (strides 3 and 2 over sizes 2 and 3, say) may
    # still miss each other: count the distinct offsets.
    import torch
    offsets = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride()):
        offsets = offsets.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride
    return torch.unique(offsets).numel() < t.numel()


# ---- memory the process may write ------------------------------------------

_MADV_POPULATE_WRITE = 23  # Linux 5.14: fault pages in for writing, or fail where a write would
_PAGE = os.sysconf("SC_PAGE_SIZE")
_madvise = None  # libc's madvise, False where the kernel lacks the advice


def _populate_write():
    """libc's madvise when the kernel takes MADV_POPULATE_WRITE (tried on
    memory of our own), else False."""
    global _madvise
    if _madvise is None:
        try:
            f = ctypes.CDLL(None, use_errno=True).madvise
            f.argtypes, f.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
            own = ctypes.create_string_buffer(2 * _PAGE)
            page = -(-ctypes.addressof(own) // _PAGE) * _PAGE
            _madvise = f if f(page, _PAGE, _MADV_POPULATE_WRITE) == 0 else False
        except (OSError, AttributeError):
            _madvise = False
    return _madvise


def _mapping_perms(address):
    """The permissions ("rw-p", ...) of the mapping that holds address, as
    /proc/self/maps gives them; None where none does."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                span, perms = line.split(None, 2)[:2]
                lo, hi = (int(x, 16) for x in span.split("-"))
                if lo <= address < hi:
                    return perms
    except OSError:
        return "?"  # cannot tell: let it through
    return None


def _check_writable(ptr, nbytes):
    """Refuses a tensor whose memory the process may not write (a read-only
    mapping, as torch.from_numpy of a read-only numpy.memmap gives), which
    the result written in place would crash on: torch keeps no read-only
    flag. Looks at the first and the last page, which a read-only mapping
    of the whole tensor covers; two system calls, which fault those pages
    in for writing (a file mapped shared counts them written, as the
    all-reduce's result would)."""
    madvise = _populate_write()
    if not madvise:
        return
    for address in {ptr, ptr + nbytes - 1}:
        if madvise(address // _PAGE * _PAGE, _PAGE, _MADV_POPULATE_WRITE) == 0:
            continue
        perms = _mapping_perms(address)
        if perms is None:
            raise ValueError(f"the tensor's memory at {address:#x} is not mapped")
        if "w" not in perms and perms != "?":
            raise ValueError(f"the tensor's memory at {address:#x} is read-only ({perms} in /proc/self/maps): "
                             "the result is written in place")


class _Target:
    """The memory an all-reduce reads and writes for one array: the array
    itself when the library can use it in place, else a host copy that is
    written back by finish()."""

    def __init__(self, array):
        self.array = array
        self.host = None  # torch: the contiguous host tensor used, when not `array` itself
        if _is_tensor(array):
            self._torch(array)
        elif _is_ndarray(array):
            self._numpy(array)
        else:
            raise TypeError(f"gradgate all-reduces numpy arrays and torch tensors, not {type(array).__name__}")
        if self.host is None:
            nbytes = self.count * (4 if self.dtype == DTYPE_F32 else 2)
            _check_live(self.ptr, nbytes)
            if _is_tensor(array):
                _check_writable(self.ptr, nbytes)
        elif array.device.type == "cpu":
            # A view copied for the step is written back into its own
            # memory: every byte it spans (strides are never negative).
            span = sum((size - 1) * stride for size, stride in zip(array.shape, array.stride())) + 1
            _check_live(array.data_ptr(), span * array.element_size())
            _check_writable(array.data_ptr(), span * array.element_size())

    def _numpy(self, a):
        import numpy as np
        if a.dtype != np.float32:
            raise TypeError(f"numpy arrays must be float32, not {a.dtype}")
        if not a.flags.c_contiguous or not a.flags.writeable:
            raise ValueError("the numpy array must be C-contiguous and writeable (the result is written in place)")
        if a.size == 0:
            raise ValueError("the array is empty")
        self.ptr, self.count, self.dtype = a.ctypes.data, a.size, DTYPE_F32

    def _torch(self, t):
        dtype = _torch_dtype(t)
        if t.device.type == "meta":
            raise ValueError("the tensor is on the meta device, which holds no data")
        host = t
        # A negative view's memory holds its elements negated: summed in the
        # copy, which holds them as they are.
        if t.device.type != "cpu" or not t.is_contiguous() or t.is_neg():
            host = t.detach().to("cpu", copy=True).contiguous()
            self.host = host
        self.ptr, self.count, self.dtype = host.data_ptr(), host.numel(), dtype

    def finish(self):
        if self.host is not None:
            import torch
            # An inference tensor takes in-place writes in inference mode
            # only; any other tensor takes it there as under no_grad.
            with torch.inference_mode() if self.array.is_inference() else torch.no_grad():
                self.array.copy_(self.host)


def _describe(x):
    device = getattr(x, "device", None)
    return f"a {type(x).__name__}" + (f" on {device}" if device is not None else "")


class Request:
    """An all-reduce in flight (Session.allreduce_async)."""

    def __init__(self, session, handle, target):
        self._session = session
        self._handle = handle
        self._target = target
        self._outcome = None  # None: in flight; 0 or an Error once finished

    def wait(self, timeout_ms=-1):
        """Waits up to timeout_ms (-1: until it ends) for the result, which
        is then in the array; raises Error when the step failed, and
        returns False when it is still in flight after timeout_ms, True
        when it finished."""
        timeout_ms = _timeout(timeout_ms)  # refused alike whether or not the request finished
        if self._outcome is None:
            if self._handle is None:
                raise Error(ERR_INVALID, "the request was freed")
            err = _Error()
            with self._session._lock:
                rc = _load().gg_wait(self._handle, timeout_ms, ctypes.byref(err))
                _settle()  # the request may have let go of a freed buffer
            if rc == ERR_AGAIN:
                return False
            if rc == 0:
                self._target.finish()
                self._outcome = 0
            else:
                self._outcome = Error(rc, err.message.decode(errors="replace"))
        if isinstance(self._outcome, Error):
            raise self._outcome
        return True

    def done(self):
        """True once the request finished (successfully or not); raises
        Error (ERR_INVALID) for one freed before it finished, whose end
        nobody learns."""
        if self._outcome is None and self._handle is None:
            raise Error(ERR_INVALID, "the request was freed")
        try:
            return self.wait(0)
        except Error:
            return True

    def free(self):
        """Frees the request; one in flight goes on at the gateway, but its
        result is no longer written to the array."""
        # Under the session's lock: another thread's call on the session
        # may be finishing this very request.
        with self._session._lock:
            if self._handle is not None:
                _load().gg_request_free(self._handle)
                self._handle = None
                _settle()

    def __del__(self):
        # A finalizer must not wait for a call another thread is in (a
        # blocking all-reduce holds the lock up to its deadline): then the
        # session frees the request at its next call.
        try:
            if self._handle is None:
                return
            if self._session._lock.acquire(blocking=False):
                try:
                    _load().gg_request_free(self._handle)
                finally:
                    self._session._lock.release()
            else:
                self._session._orphans.append(self._handle)
            self._handle = None
        except Exception:
            pass


class _SharedMemory:
    """A shared buffer's memory as numpy sees it (the base of the array
    Session.buffer() returns): it holds the session, so that a session
    only the array still refers to is not collected, and closed, under it."""

    def __init__(self, session, address, count):
        self.session = session
        self.__array_interface__ = {"shape": (count,), "typestr": "<f4", "data": (address, False), "version": 3}


class Session:
    """One rank's session with its site's gateway (gg_session_open).

    job     the job's name, the same at every rank of every site
    rank    this rank's index among the site's `nranks` ranks of the job
    endpoint "unix:/path" of the gateway's control socket; None: the
            environment variable GRADGATE_ENDPOINT

    Calls on a session are serialized by a lock; a blocking call holds it
    until it returns. Use it as a context manager, or call close()."""

    def __init__(self, job, rank, nranks, endpoint=None):
        if not isinstance(job, str):
            raise TypeError(f"job must be a str, not {type(job).__name__}")
        if endpoint is not None and not isinstance(endpoint, str):
            raise TypeError(f"endpoint must be a str or None, not {type(endpoint).__name__}")
        # The library reads C strings: a NUL would end them early, into
        # another job's name or another socket's path.
        if "\0" in job:
            raise Error(ERR_INVALID, f"job name has character 0x00 at {job.index(chr(0))}; "
                        "allowed are A-Z a-z 0-9 . _ -")
        if endpoint is not None and "\0" in endpoint:
            raise Error(ERR_INVALID, f"endpoint {endpoint!r} has a NUL character at {endpoint.index(chr(0))}")
        rank, nranks = _integer(rank, "rank"), _integer(nranks, "nranks")
        # The library's int takes them only within its range; past it they
        # would wrap into another rank. Out there, the library's own refusal.
        if not 1 <= nranks <= _INT_MAX:
            raise Error(ERR_INVALID, f"nranks {nranks} is outside 1..{_MAX_RANKS}")
        if not 0 <= rank < nranks:
            raise Error(ERR_INVALID, f"rank {rank} is outside 0..{nranks - 1}")
        lib = _load()
        err = _Error()
        handle = ctypes.c_void_p()
        rc = lib.gg_session_open(None if endpoint is None else endpoint.encode(), job.encode(), rank, nranks,
                                 ctypes.byref(handle), ctypes.byref(err))
        _check(rc, err)
        self._handle = handle
        self._lock = threading.RLock()
        self._buffers = {}
        self._orphans = []  # requests collected while another thread held the lock
        self.job, self.rank, self.nranks = job, rank, nranks
        info = _SessionInfo(size=ctypes.sizeof(_SessionInfo))
        if lib.gg_session_get_info(self._handle, ctypes.byref(info)):
            raise Error(ERR_INVALID, "gg_session_get_info refused the session info")
        self.site = info.site.decode()
        self.max_message_bytes = info.max_message_bytes
        self.max_inflight = info.max_inflight
        self.step_timeout_ms = info.step_timeout_ms
        self.max_buffers = info.max_buffers

    def _free_orphans(self):
        """Frees the requests finalized while another thread held the lock;
        called with the lock held, before the session is used or closed."""
        while self._orphans:
            _load().gg_request_free(self._orphans.pop())

    def _h(self):
        """The open session's handle; called with the lock held."""
        if self._handle is None:
            raise Error(ERR_CLOSED, "the session is closed")
        self._free_orphans()
        return self._handle

    @contextlib.contextmanager
    def _calling(self):
        """The lock held for calls of the library on the open session's
        handle; the freed buffers the calls let go of get their pages at
        once, before another allocation could take their addresses."""
        with self._lock:
            try:
                yield self._h()
            finally:
                _settle()

    def allreduce(self, array, tensor_id, timeout_ms=0):
        """Sums `array` over every rank of every site, in place, and
        returns it. timeout_ms <= 0: the gateway's step_timeout."""
        tensor_id, timeout_ms = _tensor_id(tensor_id), _timeout(timeout_ms)  # before the array's memory is probed
        t = _Target(array)
        err = _Error()
        with self._calling() as handle:
            rc = _load().gg_allreduce(handle, t.ptr, t.count, t.dtype, tensor_id, timeout_ms, ctypes.byref(err))
        _check(rc, err)
        t.finish()
        return array

    def allreduce_cuda(self, tensor, tensor_id, timeout_ms=0, stream=None):
        """Sums a contiguous CUDA torch tensor (float32 or bfloat16) over
        every rank of every site, in place on the GPU, and returns it
        (gg_allreduce_cuda: the gateway opens the tensor's memory by CUDA
        IPC, so it must be built with CUDA and see this GPU or a peer of
        it). `stream`: the torch.cuda.Stream whose work must be done before
        the tensor is read; None: the tensor's device's current stream.
        Every rank of a step must pass the same kind of memory. The
        gateway keeps the tensor's allocation open until the session
        closes: call torch.cuda.empty_cache() only after close()."""
        return self._on_device("gg_allreduce_cuda", tensor, tensor_id, timeout_ms, stream)

    def allreduce_nccl(self, tensor, tensor_id, timeout_ms=0, stream=None):
        """Sums a contiguous float32 CUDA torch tensor over every rank of
        every site, in place, through the job's NCCL communicator: the
        site's ranks reduce to their gateway, its last rank, which sums
        across sites on its GPU and broadcasts the result back
        (gg_allreduce_nccl). The gateway must be built with NCCL. The
        session's first call forms the communicator, with every rank of
        the job at this site, on the tensor's device; every later call
        must pass a tensor of that device. bfloat16 is refused (NCCL
        would sum it in bfloat16): use allreduce_cuda. `stream` as for
        allreduce_cuda; the call returns once the result is in the
        tensor."""
        return self._on_device("gg_allreduce_nccl", tensor, tensor_id, timeout_ms, stream)

    def _on_device(self, call, tensor, tensor_id, timeout_ms, stream):
        """allreduce_cuda and allreduce_nccl: `call` on a CUDA tensor, run
        with the tensor's device current (the library takes the calling
        thread's current device as the rank's)."""
        name = call[3:]
        if not _is_tensor(tensor) or not tensor.is_cuda:
            raise TypeError(f"{name} takes CUDA torch tensors, not {_describe(tensor)}; "
                            "host memory goes through allreduce")
        dtype = _torch_dtype(tensor)
        if not tensor.is_contiguous():
            raise ValueError("the CUDA tensor must be contiguous (the result is written in place)")
        import torch
        if stream is None:
            stream = torch.cuda.current_stream(tensor.device)
        err = _Error()
        with self._calling() as handle, torch.cuda.device(tensor.device):
            rc = getattr(_load(), call)(handle, tensor.data_ptr(), tensor.numel(), dtype,
                                        _tensor_id(tensor_id), ctypes.c_void_p(stream.cuda_stream),
                                        _timeout(timeout_ms), ctypes.byref(err))
        _check(rc, err)
        return tensor

    def allreduce_async(self, array, tensor_id, timeout_ms=0):
        """Starts the same all-reduce and returns a Request. The input is
        taken before this returns; `array` must stay alive and untouched
        until the request's wait() reports it finished."""
        tensor_id, timeout_ms = _tensor_id(tensor_id), _timeout(timeout_ms)  # before the array's memory is probed
        t = _Target(array)
        err = _Error()
        req = ctypes.c_void_p()
        with self._calling() as handle:
            rc = _load().gg_allreduce_start(handle, t.ptr, t.count, t.dtype, tensor_id, timeout_ms,
                                            ctypes.byref(req), ctypes.byref(err))
        _check(rc, err)
        return Request(self, req, t)

    def buffer(self, count):
        """A float32 numpy array of `count` elements in memory the gateway
        maps too (gg_buffer_alloc): all-reduces on it copy nothing. It
        stays valid until free_buffer() or close(), after which it reads
        zeros and all-reduces of it are refused; the array keeps its
        session from being collected meanwhile."""
        import numpy as np
        count = _integer(count, "count")
        if count < 1:
            raise ValueError(f"a buffer holds at least 1 element, not {count}")
        err = _Error()
        ptr = ctypes.c_void_p()
        with self._calling() as handle:
            if count * 4 > self.max_message_bytes:
                # The library's size_t would wrap a larger count.
                raise Error(ERR_TOO_LARGE, f"gg_buffer_alloc: {count * 4} bytes exceed the max_message of "
                            f"{self.max_message_bytes} bytes of the gateway of site {self.site}")
            with _mapping_lock:
                rc = _load().gg_buffer_alloc(handle, count * 4, ctypes.byref(ptr), ctypes.byref(err))
                _check(rc, err)
                _supersede(ptr.value, _page_round(count * 4))
            try:
                arr = np.asarray(_SharedMemory(self, ptr.value, count))
            except BaseException:
                _load().gg_buffer_free(handle, ptr, ctypes.byref(err))
                raise
            self._buffers[arr.ctypes.data] = (ptr, count, weakref.ref(arr.base))
        return arr

    def free_buffer(self, array):
        """Gives a buffer from buffer() back; the array must not be used
        after. None does nothing, as in the C library."""
        if array is None:
            return
        err = _Error()
        data = getattr(getattr(array, "ctypes", None), "data", None)
        if data is None:
            raise TypeError(f"free_buffer takes an array from buffer(), not {type(array).__name__}")
        with self._calling() as handle:
            ptr, count, memory = self._buffers.get(data, (None, 0, None))
            # A slice that starts where the buffer does is not the buffer.
            if ptr is None or array.size != count:
                raise Error(ERR_INVALID, "not a shared buffer of this session (an array buffer() returned, "
                            "whole)")
            del self._buffers[data]
            memory = memory()
            with _mapping_lock:
                rc = _load().gg_buffer_free(handle, ptr, ctypes.byref(err))
                if not rc and memory is not None:
                    _retire(data, _page_round(count * 4), memory)
        _check(rc, err)

    def close(self):
        """Closes the session (its shared buffers too); idempotent."""
        with self._lock:
            if self._handle is not None:
                self._free_orphans()
                with _mapping_lock:
                    _load().gg_session_close(self._handle)
                    self._handle = None
                    for data, (_, count, memory) in self._buffers.items():
                        if memory() is not None:
                            _retire(data, _page_round(count * 4), memory())
                    self._buffers.clear()
                    _settle()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
