"""`Verifier`: the static policy in the calling process, then a pool of sandbox workers.

Candidate code never runs in the calling process. Each worker is a small stdlib-only Python process
(see worker.py) that forks one resource-limited child per candidate. The parent decodes the child's
raw results and does the type-exact comparison itself, so nothing the candidate does can report a
pass. Dead or stuck workers are replaced; closing (or exiting, or Ctrl-C) leaves no process behind.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from glm53_flash.core import receipts
from glm53_flash.core.options import option
from glm53_flash.verifier import confinement
from glm53_flash.verifier import worker as wire
from glm53_flash.verifier.evaluation import Evaluation, mismatch_message
from glm53_flash.verifier.policy import check_policy

WORKER_SCRIPT = Path(wire.__file__).resolve()
# Requests queued per worker: one running plus one waiting in the pipe hides the round trip.
PIPELINE_DEPTH = 2
# Extra time the parent grants a worker beyond the wall deadline before declaring it stuck.
WATCHDOG_GRACE_SECONDS = 5.0
# Attempts per candidate when its worker dies mid-run (killed from outside, crashed).
MAX_ATTEMPTS = 2

# How long a new worker may take to report its isolation (namespaces, probe of the filter).
HELLO_TIMEOUT_SECONDS = 30.0

_OPEN_VERIFIERS: "weakref.WeakSet[Verifier]" = weakref.WeakSet()
# The hash seed of every worker (and so of every child it forks): str/bytes hashes, set and dict
# iteration order are the same in every pool and on every run.
HASH_SEED = 0
# The weakest isolation any worker of this process reported (None before the first one started).
_OBSERVED_ISOLATION: dict = {}
_WARNED: set = set()
_REQUIRED = [False]


def require_full_isolation(flag: bool = True) -> None:
    """Make every Verifier of this process refuse to start below full isolation (the CLI's
    `--require-isolation`); a Verifier's own `require_isolation` argument overrides it."""
    _REQUIRED[0] = bool(flag)


# Bounds on the limits themselves: a finite, positive value in a range where the sandbox still
# means something (a day of CPU per candidate is a typo, not a setting).
LIMIT_BOUNDS = {
    "cpu_seconds": (0.01, 600.0),
    "wall_seconds": (0.05, 3600.0),
    "memory_bytes": (64 * 2**20, 64 * 2**30),
    "output_bytes": (64 * 2**10, 256 * 2**20),
}
MAX_WORKERS = 256  # processes one Verifier may start
ISOLATION_LEVELS = ("full", "partial")


class IsolationError(ValueError):
    """The host did not allow full isolation and full isolation was required (a setting the user can
    change, so the CLI prints it as one line like any other bad input)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-candidate limits; the defaults are the documented ones. Each must be finite and within
    LIMIT_BOUNDS, checked before any process starts."""

    cpu_seconds: float = 1.0
    wall_seconds: float = 2.0
    memory_bytes: int = 256 * 2**20
    output_bytes: int = 2**20

    def __post_init__(self) -> None:
        for name, (low, high) in LIMIT_BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            if not low <= value <= high:
                raise ValueError(f"{name} must be between {low:g} and {high:g}, got {value:g}")


@dataclass
class CandidateLimits:
    """The per-candidate limits a command takes as flags (`glm53 verify`, `glm53 bench verify`), declared
    once (core/options.py): the `Verifier` arguments of the same names."""

    cpu_seconds: float = option(1.0, help="CPU time per candidate")
    wall_seconds: float = option(2.0, help="wall-clock time per candidate")
    memory_mb: int = option(256, help="address-space cap per candidate, in MiB")


@dataclass
class _Job:
    index: int
    cases: tuple
    body: bytes
    attempts: int = 0


@dataclass
class _Run:
    """One job handed to a zygote: its pipes, what came back so far, and the zygote's status."""

    job: _Job
    request_fd: int | None
    result_fd: int | None
    pending: memoryview
    chunks: list = field(default_factory=list)
    size: int = 0
    overflow: bool = False
    status: tuple | None = None


@dataclass
class _Worker:
    process: subprocess.Popen
    channel: socket.socket
    inflight: deque = field(default_factory=deque)
    head_since: float = 0.0


class Verifier:
    """Sandboxed executable verifier; a context manager owning a pool of worker processes.

    >>> with Verifier(workers=2) as verifier:
    ...     results = verifier.evaluate_many([(task, task.reference_source)])

    Not for concurrent use from several threads at once (calls are serialised by a lock).

    `require_isolation=True` refuses to start below full isolation (IsolationError); None follows
    `require_full_isolation()`. `kernel_layers=False` skips the namespaces and the seccomp filter: a
    test hook that shows what the other layers do alone, never a setting for untrusted programs.
    """

    def __init__(self, workers: int | None = None, cpu_seconds: float = 1.0, wall_seconds: float = 2.0,
                 memory_mb: int = 256, output_bytes: int = 2**20, require_isolation: bool | None = None,
                 kernel_layers: bool = True) -> None:
        count = (os.cpu_count() or 1) if workers is None else workers
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_WORKERS:
            raise ValueError(f"workers must be an integer from 1 to {MAX_WORKERS}, got {workers!r}")
        for name, value in (("cpu_seconds", cpu_seconds), ("wall_seconds", wall_seconds),
                            ("memory_mb", memory_mb), ("output_bytes", output_bytes)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        self.limits = SandboxLimits(float(cpu_seconds), float(wall_seconds), int(memory_mb * 2**20),
                                    int(output_bytes))
        count = self._fit_workers(count, explicit=workers is not None)
        self.worker_count = count
        self.require_isolation = _REQUIRED[0] if require_isolation is None else bool(require_isolation)
        self.isolation: dict | None = None
        self._owner = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        self._cases_cache: dict[int, tuple] = {}
        self._worker_config = json.dumps({
            "cpu": self.limits.cpu_seconds, "wall": self.limits.wall_seconds,
            "mem": self.limits.memory_bytes, "out": self.limits.output_bytes, "parent": f"{self._owner:010d}",
            "kernel": bool(kernel_layers),
        })
        self._limits_dict = json.loads(self._worker_config)
        self._workers: list[_Worker | None] = [None] * count
        # The calling process holds the hidden tests and the trainer's secrets: make its /proc files
        # root's and forbid tracing it by its own uid (a no-op off Linux).
        confinement.set_dumpable(False)
        try:
            for slot in range(count):
                self._workers[slot] = self._spawn()
        except BaseException:
            self.close()
            raise
        _OPEN_VERIFIERS.add(self)

    def _fit_workers(self, count: int, explicit: bool) -> int:
        """Workers whose memory limits together fit the machine's free memory (every candidate may use
        its whole limit at once): the default is lowered to what fits; a count asked for that does not
        fit is a one-line error before any worker starts."""
        from glm53_flash.core.runtime import available_memory_bytes

        available = available_memory_bytes()
        if available is None or count * self.limits.memory_bytes <= available:
            return count
        fits = max(1, available // self.limits.memory_bytes)
        if not explicit:
            return min(count, fits)
        raise ValueError(f"{count} verifier workers with a {self.limits.memory_bytes // 2**20} MiB memory limit each "
                         f"may need {count * self.limits.memory_bytes / 2**30:.1f} GiB, more than the "
                         f"{available / 2**30:.1f} GiB this machine has free; use at most {fits} workers")

    # ------------------------------------------------------------------ public API

    def evaluate(self, task, source: str) -> Evaluation:
        """Judge one program (prompt + completion) for `task`."""
        return self.evaluate_many([(task, source)])[0]

    def evaluate_many(self, pairs) -> list[Evaluation]:
        """Judge (task, source) pairs in parallel; results keep the input order."""
        pairs = list(pairs)
        with self._lock:
            self._check_usable()
            results: list[Evaluation | None] = [None] * len(pairs)
            jobs = []
            for index, (task, source) in enumerate(pairs):
                reason = check_policy(source, task.entry_point)
                if reason is not None:
                    results[index] = Evaluation.invalid(reason, len(task.cases))
                    continue
                jobs.append(self._job(index, task, source))
            if jobs:
                self._execute(jobs, results)
            return results  # type: ignore[return-value]

    def _evaluate_unchecked(self, task, source: str) -> Evaluation:
        """Test hook: run `source` in the sandbox WITHOUT the static policy.

        Exists so tests can show what the process sandbox enforces on its own (file writes,
        stdin, descriptors, memory, wall clock) when the first layer is assumed broken. Never use
        it on untrusted programs: without the policy a candidate can import modules and forge
        its own result line.
        """
        with self._lock:
            self._check_usable()
            results: list[Evaluation | None] = [None]
            self._execute([self._job(0, task, source)], results)
            return results[0]  # type: ignore[return-value]

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (for monitoring and tests)."""
        return [w.process.pid for w in self._workers if w is not None]

    def close(self) -> None:
        """Stop every worker and reap it; idempotent. Called by __exit__ and at interpreter exit."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() == self._owner:
            self._stop_all_workers()
        _OPEN_VERIFIERS.discard(self)

    def __enter__(self) -> "Verifier":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ requests and verdicts
    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("this Verifier is closed")
        if os.getpid() != self._owner:
            raise RuntimeError("a Verifier cannot be used from a forked child process; create a new one")

    def _job(self, index: int, task, source: str) -> _Job:
        encoded_cases = self._encoded_cases(task.cases)
        body = ('{"e":' + json.dumps(task.entry_point) + ',"c":' + encoded_cases
                + ',"s":' + json.dumps(source) + "}").encode()
        return _Job(index, task.cases, body)

    def _encoded_cases(self, cases) -> str:
        """Wire form of the cases' fresh arguments, cached per cases object (tasks share them)."""
        cached = self._cases_cache.get(id(cases))
        if cached is not None and cached[0] is cases:
            return cached[1]
        for case in cases:
            # Large or deep expected values would break the argument that an oversized or too
            # deep result can never be equal to them.
            expected = wire.encode_value(case.expected, wire.VALUE_BUDGET // 2, wire.MAX_DEPTH // 2)
            if not wire.is_transportable(expected):
                raise ValueError(f"expected value {case.expected!r} is too large, too deep or of a type "
                                 f"the sandbox cannot carry")
        arguments = [wire.encode_value(case.fresh_arguments()) for case in cases]
        if not all(wire.is_transportable(encoded) for encoded in arguments):
            raise ValueError("case arguments contain a value the sandbox cannot carry")
        text = json.dumps(arguments, separators=(",", ":"))
        if len(self._cases_cache) > 4096:
            self._cases_cache.clear()
        self._cases_cache[id(cases)] = (cases, text)  # the reference keeps id() from being reused
        return text

    def _verdict(self, run: _Run) -> Evaluation:
        job = run.job
        total = len(job.cases)
        payload = b"".join(run.chunks)
        status, timed_out = run.status
        reason = wire.describe_limit(status, bool(timed_out), run.overflow, payload, self._limits_dict)
        if reason is not None:
            return Evaluation.limit(reason, total)
        try:
            if len(payload) > wire.result_frame_bytes(total):  # more than an honest child can write
                raise wire.ProtocolError("result frame larger than any honest result")
            outcome = json.loads(payload)
            state = outcome["s"]
            if state == "invalid":
                return Evaluation.invalid(str(outcome["m"]), total)
            if state == "memory":
                limit_mib = self.limits.memory_bytes // 2**20
                return Evaluation.limit(f"memory limit ({limit_mib} MiB) exceeded {outcome['m']}", total)
            if state != "ran" or len(outcome["c"]) != total:
                raise wire.ProtocolError("unexpected result shape")
            tests_passed, first_failure = 0, ""
            for number, (case, (ok, data)) in enumerate(zip(job.cases, outcome["c"]), start=1):
                if ok != 1:
                    first_failure = first_failure or f"case {number}/{total}: {str(data)[:wire.MESSAGE_CHARS]}"
                    continue
                # Compared on the wire form: the child's sets and dicts are never rebuilt here.
                if wire.wire_type(data) is type(case.expected) and wire.matches_wire(data, case.expected):
                    tests_passed += 1
                elif not first_failure:
                    actual = wire.preview_value(data)
                    if isinstance(actual, wire.Unsupported):
                        first_failure = f"case {number}/{total}: returned an {actual.reason}"
                    else:
                        first_failure = mismatch_message(number, total, actual, case.expected)
            return Evaluation.from_cases(tests_passed, total, first_failure)
        except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
            # A program with the policy bypassed could write anything to its own result pipe; it
            # only ever concerns its own verdict, and never a pass it did not compute.
            return Evaluation.limit(f"sandbox returned an unreadable result ({type(exc).__name__})", total)

    # ------------------------------------------------------------------ the dispatch loop
    def _execute(self, jobs: list[_Job], results: list) -> None:
        try:
            self._run(jobs, results)
        except BaseException:
            # Ctrl-C or a bug mid-batch: in-flight replies would be misattributed later, so drop
            # the whole pool (it respawns on the next call) before re-raising.
            self._stop_all_workers()
            raise

    def _run(self, jobs: list[_Job], results: list) -> None:
        queue = deque(jobs)
        remaining = len(jobs)
        poller = select.poll()
        owners: dict[int, tuple[int, _Run | None]] = {}  # fd -> (slot, run; None for the channel)

        def watch(fd: int, slot: int, run: _Run | None, events: int = select.POLLIN) -> None:
            poller.register(fd, events)
            owners[fd] = (slot, run)

        def drop_one(run: _Run, name: str) -> None:
            """Close one of a run's pipes (request_fd or result_fd) and stop watching it."""
            fd = getattr(run, name)
            if fd is None:
                return
            if fd in owners:
                poller.unregister(fd)
                del owners[fd]
            os.close(fd)
            setattr(run, name, None)

        for slot in range(len(self._workers)):
            if self._workers[slot] is None:
                self._workers[slot] = self._spawn()
            watch(self._workers[slot].channel.fileno(), slot, None)

        def finish(job: _Job, evaluation: Evaluation) -> None:
            nonlocal remaining
            results[job.index] = evaluation
            remaining -= 1

        def drop_run(run: _Run) -> None:
            drop_one(run, "request_fd")
            drop_one(run, "result_fd")

        def replace(slot: int, reason: str) -> None:
            """Kill the worker in `slot`, requeue its jobs (the running one counts an attempt)."""
            worker = self._workers[slot]
            channel_fd = worker.channel.fileno()
            poller.unregister(channel_fd)
            del owners[channel_fd]
            inflight = [run.job for run in worker.inflight]
            for run in worker.inflight:
                drop_run(run)
            worker.inflight.clear()
            self._kill_worker(worker)
            if inflight:
                head = inflight[0]
                head.attempts += 1
                if head.attempts >= MAX_ATTEMPTS:
                    finish(head, Evaluation.limit(f"sandbox worker {reason} twice while running "
                                                  f"this candidate", len(head.cases)))
                    inflight = inflight[1:]
            queue.extendleft(reversed(inflight))
            self._workers[slot] = self._spawn()
            watch(self._workers[slot].channel.fileno(), slot, None)

        def settle(slot: int) -> None:
            """Judge the runs at the head of the worker's queue that are complete, in order."""
            worker = self._workers[slot]
            while worker.inflight:
                run = worker.inflight[0]
                if run.status is None or run.result_fd is not None:
                    return
                worker.inflight.popleft()
                drop_run(run)
                finish(run.job, self._verdict(run))
                worker.head_since = time.monotonic()

        while remaining:
            now = time.monotonic()
            for slot, worker in enumerate(self._workers):
                while queue and len(worker.inflight) < PIPELINE_DEPTH:
                    job = queue.popleft()
                    try:
                        run = self._start(worker, job)
                    except OSError:  # the zygote is gone: the channel refuses the descriptors
                        queue.appendleft(job)
                        replace(slot, "died")
                        worker = self._workers[slot]
                        continue
                    if not worker.inflight:
                        worker.head_since = now
                    worker.inflight.append(run)
                    watch(run.result_fd, slot, run)
                    if run.request_fd is not None:
                        watch(run.request_fd, slot, run, select.POLLOUT)
            for fd, _ in poller.poll(250):
                if fd not in owners:
                    continue  # closed while handling an earlier event of this round
                slot, run = owners[fd]
                worker = self._workers[slot]
                if run is None:  # the zygote: a status, or EOF when it died
                    try:
                        message = worker.channel.recv(64)
                    except BlockingIOError:
                        continue
                    except OSError:
                        message = b""
                    waiting = [r for r in worker.inflight if r.status is None]
                    if len(message) != wire.STATUS.size or not waiting:
                        replace(slot, "died" if not message else "misbehaved")
                        continue
                    waiting[0].status = wire.STATUS.unpack(message)
                    if waiting[0].request_fd is not None:  # the child is gone; what it did not read is moot
                        drop_one(waiting[0], "request_fd")
                    settle(slot)
                elif fd == run.request_fd:
                    try:
                        run.pending = run.pending[os.write(fd, run.pending):]
                    except BlockingIOError:
                        continue
                    except OSError:  # the child ended before reading all of it; its status says why
                        run.pending = run.pending[:0]
                    if not run.pending:
                        drop_one(run, "request_fd")
                else:
                    try:
                        data = os.read(fd, 1 << 16)
                    except BlockingIOError:
                        continue
                    run.size += len(data)
                    if data and run.size <= self.limits.output_bytes:
                        run.chunks.append(data)
                        continue
                    drop_one(run, "result_fd")
                    if data:  # over the cap: stop reading; the child's next write fails
                        run.overflow, run.chunks = True, []
                    settle(slot)
            stuck_after = self.limits.wall_seconds + WATCHDOG_GRACE_SECONDS
            now = time.monotonic()
            for slot, worker in enumerate(self._workers):
                if worker.inflight and now - worker.head_since > stuck_after:
                    replace(slot, "hung")

    def _start(self, worker: _Worker, job: _Job) -> _Run:
        """Two fresh pipes; the request goes into one now (most fit the pipe's buffer); the child's
        ends and a fresh /dev/null go to the zygote, which forks a child on them once the previous one has ended."""
        request_r, request_w = os.pipe()
        result_r, result_w = os.pipe()
        # The child's fds 0-2: a file description of its own, so nothing one candidate sets on them
        # (O_APPEND, O_NONBLOCK, a lock) is there for the next.
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.set_blocking(request_w, False)
            os.set_blocking(result_r, False)
            pending = memoryview(job.body)
            try:
                pending = pending[os.write(request_w, pending):]
            except BlockingIOError:
                pass
            socket.send_fds(worker.channel, [wire.RUN_REQUEST], [request_r, result_w, null])
        except BaseException:
            for fd in (request_w, result_r):
                os.close(fd)
            raise
        finally:
            os.close(request_r)
            os.close(result_w)
            os.close(null)
        if not pending:
            os.close(request_w)
            request_w = None
        return _Run(job, request_w, result_r, pending)

    # ------------------------------------------------------------------ worker processes
    def _spawn(self) -> _Worker:
        if self._closed:  # close() from another thread (e.g. atexit) while a batch was running
            raise RuntimeError("this Verifier was closed during an evaluation")
        # No PATH (the worker runs no program by name): the worker's memory, and so the addresses a
        # candidate can see, must not depend on the caller's shell.
        env = {key: os.environ[key] for key in ("LD_LIBRARY_PATH",) if key in os.environ}
        # Resolve every library symbol when the worker starts: lazily bound, each symbol a child
        # calls first would be looked up again in every child, writing to shared pages.
        env["LD_BIND_NOW"] = "1"
        # One hash seed for every worker of every pool, so a program whose output depends on set or
        # dict order (str({'x', 'y'})) gets the same verdict on every run (recorded: isolation's
        # `hash_seed`). -I would ignore it (it implies -E); the environment is built here from nothing,
        # so -s -S (and the worker's own sys.path) keep what -I kept.
        env["PYTHONHASHSEED"] = str(HASH_SEED)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = json.loads(self._worker_config)
        # Fixed width, like "parent": the worker's memory before its first fork, and so every address
        # a candidate can see, must not depend on a process id or a descriptor number.
        config["channel"] = f"{theirs.fileno():010d}"
        # -s -S: no user site, no site-packages (the worker needs only the standard library); the only
        # PYTHON* variable is the hash seed above. New session: a terminal Ctrl-C reaches the
        # parent only, which then stops the workers in order (see _kill_worker).
        try:
            process = subprocess.Popen(
                [sys.executable, "-s", "-S", "-W", "ignore", str(WORKER_SCRIPT), json.dumps(config)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env, start_new_session=True,
                close_fds=True, pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        worker = _Worker(process, ours)
        try:
            self._note_isolation(self._read_hello(worker))
        except BaseException:
            self._kill_worker(worker)
            raise
        # Non-blocking: the dispatch loop only reads what poll() reported as ready.
        ours.setblocking(False)
        return worker

    def _read_hello(self, worker: _Worker) -> dict:
        """The zygote's first message: the isolation it reached."""
        worker.channel.settimeout(HELLO_TIMEOUT_SECONDS)
        try:
            message = worker.channel.recv(1 << 16)
        except socket.timeout:
            raise RuntimeError(f"sandbox worker did not start within {HELLO_TIMEOUT_SECONDS:g} s") from None
        if not message:
            raise RuntimeError(f"sandbox worker exited while starting (status {worker.process.wait()})")
        head = json.loads(message)
        if head.get("k") != "hello" or not isinstance(head.get("isolation"), dict):
            raise RuntimeError("sandbox worker sent no isolation report")
        return head["isolation"]

    def _note_isolation(self, report: dict) -> None:
        level = report.get("level")
        if level not in ISOLATION_LEVELS:
            raise RuntimeError(f"sandbox worker reported an unknown isolation level {level!r}")
        if self.isolation is None or level != "full":
            self.isolation = report
        if not _OBSERVED_ISOLATION or level != "full":
            _OBSERVED_ISOLATION.clear()
            _OBSERVED_ISOLATION.update(report)
        if level == "full":
            return
        missing = ", ".join(report.get("missing", []))
        if self.require_isolation:
            raise IsolationError(f"full sandbox isolation was required, but this host refused: {missing} "
                                 f"({'; '.join(report.get('notes', []))})")
        if missing not in _WARNED:
            _WARNED.add(missing)
            print(f"glm53 verifier: sandbox isolation is partial on this host (missing: {missing}); "
                  f"see `glm53 verify --isolation`", file=sys.stderr)

    def _kill_worker(self, worker: _Worker, graceful: bool = False) -> None:
        for run in worker.inflight:  # an interrupted batch: its pipes go with the worker
            for name in ("request_fd", "result_fd"):
                fd = getattr(run, name)
                if fd is not None:
                    os.close(fd)
                    setattr(run, name, None)
        worker.inflight.clear()
        process = worker.process
        if graceful and process.returncode is None:
            # Closing the channel lets an idle zygote exit, and the launcher with it; SIGTERM ends a
            # busy one (the zygote dies with it, and with the zygote, PID 1 of its namespace, every
            # candidate process).
            _close_quietly(worker.channel)
            if worker.inflight:
                _signal_quietly(process.pid, signal.SIGTERM, group=False)
            try:
                process.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
        if process.returncode is None:
            # Not reaped yet (alive, or a zombie after an outside kill), so its process group id
            # cannot have been reused. The zygote shares the group; candidates die with it.
            _signal_quietly(process.pid, signal.SIGKILL, group=True)
            process.wait()
        _close_quietly(worker.channel)

    def _stop_all_workers(self) -> None:
        for slot, worker in enumerate(self._workers):
            if worker is not None:
                self._kill_worker(worker, graceful=True)
                self._workers[slot] = None


def observed_isolation() -> dict | None:
    """The weakest isolation report any Verifier of this process received (None if none started).
    Receipts that carry verdicts record it (receipts.provenance)."""
    return dict(_OBSERVED_ISOLATION) if _OBSERVED_ISOLATION else None


receipts.observe("verifier_isolation", observed_isolation)


def probe_isolation(require: bool | None = None) -> dict:
    """Start one worker, return the isolation it reached, stop it."""
    with Verifier(workers=1, require_isolation=require) as verifier:
        return dict(verifier.isolation or {})


def _close_quietly(stream) -> None:
    try:
        if stream is not None:
            stream.close()
    except OSError:
        pass


def _signal_quietly(pid: int, signum: int, group: bool) -> None:
    try:
        if group:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _close_open_verifiers() -> None:
    for verifier in list(_OPEN_VERIFIERS):
        verifier.close()
