"""Gateways of several sites on this machine, on loopback: for trying
gradgate out, for examples and for tests.

    from gradgate.local import LocalSites
    with LocalSites(sites=3, codec="fp32") as mesh:
        s = gradgate.Session("job", 0, 1, endpoint=mesh.endpoint(0))
        out = mesh.run_ranks("job2", 2, lambda s, site, rank: ...)  # a thread per rank

Each site gets a certificate from a throwaway CA (make-certs.sh), a config
in a temporary folder, and a `gradgate --config` process; start() returns
once every gateway logged mesh_up, and stop() ends them with SIGTERM.
Gateways do not outlive the process that started them: should it end
without stop() (killed, or exiting without it), a watcher process ends
them the same way and removes the folder unless keep=True (where the
system has pidfds: Linux 5.3 and Python 3.9 on).

The gateway binary: the `gradgate` argument, else $GRADGATE, else the
source tree's build/gateway/gradgate when this package runs from the
tree, else `gradgate` on PATH. The certificate script likewise:
$GRADGATE_MAKE_CERTS, examples/make-certs.sh, `gradgate-make-certs`. A
path given or set that is no executable file is an error
(FileNotFoundError), not passed over.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from . import _integer

_TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _find(given, env, tree_path, installed):
    # A path given, or set in the environment, is the one meant: another
    # found in its place would run something else than asked.
    for cand, source in ((given, "the path given"), (os.environ.get(env), env)):
        if cand:
            if not os.path.isfile(cand) or not os.access(cand, os.X_OK):
                raise FileNotFoundError(f"{installed}: {cand} ({source}) is not an executable file")
            return cand
    cand = os.path.join(_TREE, tree_path)
    if os.path.isfile(cand) and os.access(cand, os.X_OK):
        return cand
    found = shutil.which(installed)
    if not found:
        raise FileNotFoundError(f"cannot find {installed}: pass its path, set {env}, or install gradgate")
    return found


# Started beside the gateways, with the folder (argv[1], empty: keep it)
# and a pidfd of each gateway (their numbers in argv[2:]; a pidfd names
# its process even once the pid is reused). Reads one byte of its standard
# input; an end of it instead means the process that started them is gone
# without stop(), which writes that byte (a process forked from it holds
# the pipe too, so that end comes once such processes have ended). The
# watcher then ends the gateways as stop() does, SIGTERM and, to those
# still there after 10 s, SIGKILL, and removes the folder.
_WATCHER = r"""
import os, select, shutil, signal, sys, time
folder, fds = sys.argv[1], [int(fd) for fd in sys.argv[2:]]
if sys.stdin.buffer.read(1):
    sys.exit(0)


def running():
    # A pidfd is readable once its process has ended (poll: the numbers
    # are the owner's, past select()'s 1024 in a process with many files).
    ended = select.poll()
    for fd in fds:
        ended.register(fd, select.POLLIN)
    gone = {fd for fd, _ in ended.poll(0)}
    return [fd for fd in fds if fd not in gone]


for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
    for fd in running():
        try:
            signal.pidfd_send_signal(fd, sig)
        except OSError:
            pass
    deadline = time.monotonic() + wait
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
if folder:
    shutil.rmtree(folder, ignore_errors=True)
"""


def free_loopback_ports(n):
    """n TCP ports free on 127.0.0.1 now (bound once, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalSites:
    """`sites` gateways (site-0, site-1, ...) on loopback. Keyword
    arguments set their config: codec, algorithm, threads (lanes per
    gateway), streams (per peer), step_timeout, zstd_level."""

    def __init__(self, sites=3, codec="fp32", algorithm="ring", threads=1, streams=2, step_timeout="30s",
                 zstd_level=0, gradgate=None, make_certs=None, keep=False):
        sites = _integer(sites, "sites")
        if not 2 <= sites <= 8:
            raise ValueError("sites must be 2 to 8")
        self.names = [f"site-{i}" for i in range(sites)]
        self.gradgate = _find(gradgate, "GRADGATE", "build/gateway/gradgate", "gradgate")
        self.make_certs = _find(make_certs, "GRADGATE_MAKE_CERTS", "examples/make-certs.sh", "gradgate-make-certs")
        self.settings = dict(codec=codec, algorithm=algorithm, threads=threads, streams=streams,
                             step_timeout=step_timeout, zstd_level=zstd_level)
        self.keep = keep
        self.dir = None
        self.procs = []
        self.watcher = None
        self.owner = None

    def endpoint(self, site):
        """The control endpoint of site `site` (an index), for Session()."""
        return f"unix:{self.dir}/{self.names[site]}.sock"

    def log(self, site):
        """What the gateway of site `site` logged so far."""
        with open(os.path.join(self.dir, f"{self.names[site]}.log"), errors="replace") as f:
            return f.read()

    def _config(self, i, ports):
        st = self.settings
        name = self.names[i]
        lines = [
            "[site]", f'name = "{name}"', f'listen = "127.0.0.1:{ports[i]}"',
            f'control = "unix:{self.dir}/{name}.sock"', f"threads = {st['threads']}",
            "[tls]", 'ca = "certs/ca.pem"', f'cert = "certs/{name}.pem"', f'key = "certs/{name}.key"',
        ]
        for j, peer in enumerate(self.names):
            if j != i:
                lines += ["[[peers]]", f'site = "{peer}"', f'address = "127.0.0.1:{ports[j]}"',
                          f'identity = "dns:{peer}.gradgate.test"']
        lines += [
            "[transport]", f"streams_per_peer = {st['streams']}", f"step_timeout = \"{st['step_timeout']}\"",
            'heartbeat_interval = "500ms"', 'heartbeat_timeout = "5s"',
            "[compression]", f"codec = \"{st['codec']}\"", f"zstd_level = {st['zstd_level']}",
            "[allreduce]", f"algorithm = \"{st['algorithm']}\"",
            "[limits]", 'memory = "1GiB"', 'inflight_per_peer = "64MiB"',
        ]
        path = os.path.join(self.dir, f"{name}.toml")
        # 0600 whatever the umask: a gateway refuses a config others may write.
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def _start_watcher(self):
        # Where this Python can start itself and the system has pidfds
        # (Linux 5.3, Python 3.9); -I: nothing of this process's folder or
        # environment in its path. The gateways are in sessions of their
        # own (a Ctrl-C for this process is not theirs: stop() ends them),
        # and so is the watcher.
        if not sys.executable or not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
            return
        fds = []
        try:
            # Unreaped children: their pids are theirs still.
            for p in self.procs:
                fds.append(os.pidfd_open(p.pid))
            self.watcher = subprocess.Popen([sys.executable, "-I", "-c", _WATCHER, "" if self.keep else self.dir]
                                            + [str(fd) for fd in fds], pass_fds=fds, stdin=subprocess.PIPE,
                                            stdout=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            pass  # no pidfds here: the gateways go with stop() only
        finally:
            for fd in fds:
                os.close(fd)

    def start(self, timeout=30.0):
        self.owner = os.getpid()
        self.dir = tempfile.mkdtemp(prefix="gradgate-local.")
        try:
            subprocess.run([self.make_certs, "--out", os.path.join(self.dir, "certs")] + self.names,
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            ports = free_loopback_ports(len(self.names))
            for i, name in enumerate(self.names):
                cfg = self._config(i, ports)
                log = open(os.path.join(self.dir, f"{name}.log"), "w")
                self.procs.append(subprocess.Popen([self.gradgate, "--config", cfg], stdout=log, stderr=log,
                                                   start_new_session=True))
                log.close()
            self._start_watcher()
            deadline = time.monotonic() + timeout
            for i, p in enumerate(self.procs):
                while "event=mesh_up" not in self.log(i):
                    if p.poll() is not None:
                        raise RuntimeError(f"the gateway of {self.names[i]} exited ({p.returncode}):\n"
                                           + self.log(i)[-2000:])
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the gateway of {self.names[i]} did not connect to every peer "
                                           f"within {timeout:.0f} s:\n" + self.log(i)[-2000:])
                    time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def run_ranks(self, job, ranks, fn, timeout=60.0):
        """Runs fn(session, site, rank) for `ranks` ranks of job `job` at
        every site, each on a thread of its own with its own
        gradgate.Session; returns what each returned, by (site, rank), or
        the exception it raised. A rank still running after `timeout`
        seconds is missing from the result."""
        import threading

        from . import Session

        out, threads = {}, []

        def run(site, rank):
            try:
                with Session(job, rank, ranks, endpoint=self.endpoint(site)) as s:
                    out[site, rank] = fn(s, site, rank)
            except Exception as e:  # noqa: BLE001 (handed to the caller)
                out[site, rank] = e

        for site in range(len(self.names)):
            for rank in range(ranks):
                threads.append(threading.Thread(target=run, args=(site, rank)))
                threads[-1].start()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return dict(out)  # as it stands now: a late rank does not add to it

    def stop(self):
        """Ends every gateway (SIGTERM, then SIGKILL after 10 s) and
        removes the folder unless keep=True. Returns their exit codes. In
        a process forked from the one that started them it does nothing:
        they are that one's."""
        if self.owner is not None and os.getpid() != self.owner:
            return []
        codes = []
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=10))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        self.procs = []
        if self.watcher:
            try:
                self.watcher.stdin.write(b"s")
                self.watcher.stdin.close()
            except OSError:
                pass  # the watcher is gone: nothing left for it to do
            try:
                self.watcher.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.watcher.kill()
                self.watcher.wait()
            self.watcher = None
        if self.dir and not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)
        return codes

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
