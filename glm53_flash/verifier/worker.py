"""The sandbox worker process and the value wire format it shares with the parent.

Run as a script (`python -I -S worker.py CONFIG`), it reads requests on stdin, forks one short-lived,
resource-limited child per candidate and answers on stdout. It imports only the standard library and
never the glm53_flash package, so a worker starts in milliseconds and stays small enough to fork fast.
Imported as `glm53_flash.verifier.worker`, it gives the parent the same encoder and decoder.
"""

from __future__ import annotations

import _signal
import gc
import json
import math
import os
import resource
import select
import signal
import struct
import sys
import time

# The original's call allow-list; candidate code sees exactly these builtins and nothing else.
SAFE_BUILTINS = {
    "sum": sum, "len": len, "abs": abs, "min": min, "max": max, "bool": bool, "int": int, "str": str,
}

# A returned value whose encoding would pass this many characters is not transported: it is marked
# oversized and counts as a wrong answer. That is exact because expected values must encode within half
# the budget and depth (checked by the parent), and equal values of the same types encode to equal size.
VALUE_BUDGET = 16 * 1024
MAX_DEPTH = 32
MESSAGE_CHARS = 200
FRAME_HEADER = struct.Struct(">I")

# ----------------------------------------------------------------------------------------------------
# Value wire format. JSON with tags, so the parent decodes with json.loads (never pickle or marshal):
#   None, True/False, small ints and str travel as themselves; every container or other scalar is a
#   list whose first element is a one-letter tag: ["L", ...] list, ["T", ...] tuple, ["S", ...] set,
#   ["F", ...] frozenset, ["D", k1, v1, ...] dict, ["I", hex] big int, ["R", hex] float,
#   ["C", hex, hex] complex, ["B", hex] bytes, ["A", hex] bytearray, ["E"] Ellipsis,
#   ["X", why] a value that cannot be transported (wrong type, oversized, nested too deeply).
# ----------------------------------------------------------------------------------------------------
_JSON_SAFE_INT = 2 ** 53


class Unrepresentable(Exception):
    """The value cannot be transported; the reason names its type."""


class Unsupported:
    """Decoded stand-in for a value the child could not transport; equal to nothing but itself."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"<{self.reason}>"


def encode_value(value, budget: int = VALUE_BUDGET, max_depth: int = MAX_DEPTH):
    """Encode a value for the wire; unsupported, oversized or too deep values become ["X", reason]."""
    remaining = [budget]
    try:
        return _encode(value, remaining, max_depth)
    except Unrepresentable as exc:
        return ["X", str(exc)]
    except RecursionError:
        return ["X", "nested too deeply"]


def _spend(remaining: list, cost: int, what: str) -> None:
    remaining[0] -= cost
    if remaining[0] < 0:
        raise Unrepresentable(f"oversized {what}")


def _encode(value, remaining: list, depth: int):
    # Exact type tests (never isinstance), so a bool is never taken for an int and nothing the
    # candidate built can masquerade as a supported type.
    kind = type(value)
    if value is None or kind is bool:
        _spend(remaining, 5, kind.__name__)
        return value
    if kind is int:
        if -_JSON_SAFE_INT < value < _JSON_SAFE_INT:
            _spend(remaining, 17, "int")
            return value
        _spend(remaining, value.bit_length() // 4 + 4, "int")
        return ["I", format(value, "x")]  # hex is exempt from the int-to-str digit limit
    if kind is str:
        _spend(remaining, len(value) + 2, "str")
        return value
    if kind is float:
        _spend(remaining, 30, "float")
        return ["R", value.hex()]
    if kind is complex:
        _spend(remaining, 60, "complex")
        return ["C", value.real.hex(), value.imag.hex()]
    if kind is bytes or kind is bytearray:
        _spend(remaining, 2 * len(value) + 8, kind.__name__)
        return ["B" if kind is bytes else "A", value.hex()]
    if value is Ellipsis:
        _spend(remaining, 5, "ellipsis")
        return ["E"]
    if kind in _CONTAINER_TAGS:
        if depth <= 0:
            raise Unrepresentable(f"{kind.__name__} nested too deeply")
        _spend(remaining, 6 + len(value), kind.__name__)
        out = [_CONTAINER_TAGS[kind]]
        if kind is dict:
            for key, item in value.items():
                out.append(_encode(key, remaining, depth - 1))
                out.append(_encode(item, remaining, depth - 1))
        else:
            for item in value:
                out.append(_encode(item, remaining, depth - 1))
        return out
    raise Unrepresentable(f"unsupported type {kind.__name__}")


_CONTAINER_TAGS = {list: "L", tuple: "T", set: "S", frozenset: "F", dict: "D"}
_SCALAR_DECODERS = {
    "I": lambda args: int(args[0], 16),
    "R": lambda args: float.fromhex(args[0]),
    "C": lambda args: complex(float.fromhex(args[0]), float.fromhex(args[1])),
    "B": lambda args: bytes.fromhex(args[0]),
    "A": lambda args: bytearray.fromhex(args[0]),
}


def is_transportable(encoded) -> bool:
    """False if an encoded value contains an ["X", ...] marker anywhere."""
    if type(encoded) is not list:
        return True
    tag = encoded[0]
    if tag == "X":
        return False
    if tag in _SCALAR_DECODERS or tag == "E":
        return True
    return all(is_transportable(item) for item in encoded[1:])


class ProtocolError(ValueError):
    """A wire value does not follow the format above."""


def decode_value(data, max_depth: int = MAX_DEPTH + 1):
    """Rebuild a value from its wire form with the exact original types; fresh objects every call."""
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is str:
        return data
    if kind is not list or not data or type(data[0]) is not str:
        raise ProtocolError(f"bad wire value of type {kind.__name__}")
    if max_depth <= 0:
        raise ProtocolError("wire value nested too deeply")
    tag, items = data[0], data[1:]
    try:
        if tag == "L":
            return [decode_value(item, max_depth - 1) for item in items]
        if tag == "T":
            return tuple(decode_value(item, max_depth - 1) for item in items)
        if tag == "S":
            return {decode_value(item, max_depth - 1) for item in items}
        if tag == "F":
            return frozenset(decode_value(item, max_depth - 1) for item in items)
        if tag == "D":
            if len(items) % 2:
                raise ProtocolError("dict with an odd number of items")
            return {decode_value(items[i], max_depth - 1): decode_value(items[i + 1], max_depth - 1)
                    for i in range(0, len(items), 2)}
        if tag == "E" and not items:
            return Ellipsis
        if tag == "X" and len(items) == 1 and type(items[0]) is str:
            return Unsupported(items[0])
        if tag in _SCALAR_DECODERS and all(type(item) is str for item in items):
            return _SCALAR_DECODERS[tag](items)
    except (TypeError, ValueError, IndexError) as exc:  # unhashable set member, bad hex, ...
        raise ProtocolError(f"bad wire value: {exc}") from None
    raise ProtocolError(f"bad wire tag {tag!r}")


def describe_exception(exc: BaseException) -> str:
    """'TypeName: text', short; str() of a hostile exception may itself fail or be huge."""
    try:
        text = str(exc)
    except Exception:  # e.g. ValueError from the int-to-str digit limit
        text = "(unprintable)"
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line[:MESSAGE_CHARS]


# ----------------------------------------------------------------------------------------------------
# What runs inside the forked child, after confinement.
# ----------------------------------------------------------------------------------------------------
def compile_candidate(source: str):
    """(code, None) or (None, reason). Any failure to compile, RecursionError and MemoryError
    included, means the program is invalid."""
    try:
        return compile(source, "<candidate>", "exec", dont_inherit=True), None
    except Exception as exc:  # SyntaxError, ValueError, RecursionError, MemoryError, ...
        return None, describe_exception(exc)


_MISSING = object()


def run_candidate(source: str, entry_point: str, encoded_cases: list) -> dict:
    """Compile, define and call the candidate on fresh arguments; the parent judges the results.

    Returns {"s": "invalid"|"memory", "m": reason} or {"s": "ran", "c": [[1, value] | [0, error]]}.
    Mapping as in the original evaluator: any Exception while compiling, defining the function or
    fetching the entry point makes the program invalid; any Exception in a call fails that case.
    MemoryError is the exception: it reflects this sandbox's memory cap, so it ends the run as a
    limit. Compiling happens here, under the limits, so the worker never touches candidate input.
    """
    code, reason = compile_candidate(source)
    if code is None:
        return {"s": "invalid", "m": reason}
    namespace = {"__builtins__": dict(SAFE_BUILTINS)}
    try:
        exec(code, namespace)  # top level holds only defs and string constants (policy)
    except MemoryError:
        return {"s": "memory", "m": "while defining the function"}
    except Exception as exc:
        return {"s": "invalid", "m": describe_exception(exc)}
    function = namespace.get(entry_point, _MISSING)
    if function is _MISSING:
        return {"s": "invalid", "m": f"entry point {entry_point!r} is not defined"}
    results = []
    for number, encoded in enumerate(encoded_cases, start=1):
        arguments = decode_value(encoded)  # a fresh deep copy of this case's inputs
        try:
            value = function(*arguments)
        except MemoryError:
            return {"s": "memory", "m": f"in case {number}"}
        except Exception as exc:
            results.append([0, describe_exception(exc)])
            continue
        try:
            results.append([1, encode_value(value)])
        except MemoryError:
            return {"s": "memory", "m": f"while reading the result of case {number}"}
        del value
    return {"s": "ran", "c": results}


def confine(result_fd: int, limits: dict) -> int:
    """Lock the current (child) process down before any candidate code runs; returns the result fd.

    The child leads its own process group (so the worker can kill anything it might spawn) and dies
    with the worker. fds 0-2 become a write-only /dev/null (stdin reads fail), the result pipe
    moves to fd 3, every other descriptor is closed, and RLIMIT_NOFILE=4 then leaves no free slot:
    open(), socket() and pipe() all fail. rlimits also cap address space, CPU time, file size (0:
    no file writes), processes and core dumps. ITIMER_PROF gives the fractional CPU limit
    (RLIMIT_CPU is whole seconds and stays as a backstop); its default action kills the process.
    """
    # _signal, not signal: the wrappers convert to enums, and every object touched after fork
    # costs a copy-on-write page fault. SIGPROF and SIGXCPU are already at their default (kill).
    for signum in (_signal.SIGINT, _signal.SIGTERM):
        _signal.signal(signum, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
    os.setpgid(0, 0)
    _die_with_parent()
    for fd in (0, 1, 2):
        os.dup2(_DEVNULL[0], fd)
    if result_fd != 3:
        os.dup2(result_fd, 3)
    os.closerange(4, _max_fd())
    cpu = float(limits["cpu"])
    cpu_backstop = math.ceil(cpu) + 1
    for name, value in (
        ("RLIMIT_AS", int(limits["mem"])),
        ("RLIMIT_CPU", cpu_backstop),
        ("RLIMIT_FSIZE", 0),
        ("RLIMIT_NOFILE", 4),
        ("RLIMIT_NPROC", 0),
        ("RLIMIT_CORE", 0),
    ):
        kind = getattr(resource, name, None)
        if kind is None:
            continue
        hard = value + 1 if name == "RLIMIT_CPU" else value
        try:
            resource.setrlimit(kind, (value, hard))
        except (ValueError, OSError):
            # Lowering always works; this only fails where the platform lacks the limit.
            if name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE"):
                raise
    _signal.setitimer(_signal.ITIMER_PROF, cpu)
    return 3


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        return 1024


_LIBC = []
_DEVNULL = []  # one write-only /dev/null descriptor, opened by the worker, shared by every child
# Built once in the worker: json.dumps with custom separators would build a new encoder in every
# child, and each object a child touches costs a copy-on-write page fault.
_dump_json = json.JSONEncoder(separators=(",", ":")).encode


def _die_with_parent() -> None:
    """Linux: ask the kernel to SIGKILL this process when its parent dies (no orphans survive)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        if not _LIBC:
            import ctypes

            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        pr_set_pdeathsig = 1
        _LIBC[0].prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return


# ----------------------------------------------------------------------------------------------------
# The worker loop: one request at a time, one forked child per request.
# ----------------------------------------------------------------------------------------------------
_SIGNAL_REASONS = {
    signal.SIGPROF: "CPU time limit",
    signal.SIGXCPU: "CPU time limit",
    signal.SIGKILL: "killed (hard CPU limit or the system's out-of-memory killer)",
    signal.SIGXFSZ: "file size limit",
    signal.SIGSEGV: "crashed with SIGSEGV (stack or memory exhaustion)",
    signal.SIGABRT: "aborted (likely out of memory)",
}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, missing = [], size
    while missing:
        chunk = os.read(fd, missing)
        if not chunk:
            return None
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def _header(kind: str, message: str = "") -> bytes:
    return json.dumps({"k": kind, "m": message}).encode() + b"\n"


def evaluate_in_child(request: dict, limits: dict) -> bytes:
    """Fork, run the request in the confined child, enforce the wall deadline; return the reply."""
    read_fd, write_fd = os.pipe()
    # Block termination signals across fork so the worker cannot exit between fork and the
    # try/finally that kills and reaps the child.
    blocked = (_signal.SIGTERM, _signal.SIGINT)
    _signal.pthread_sigmask(_signal.SIG_BLOCK, blocked)
    try:
        pid = os.fork()
    except OSError as exc:
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, blocked)
        os.close(read_fd)
        os.close(write_fd)
        return _header("limit", f"could not start the sandbox process: {exc}")
    if pid == 0:
        status = 70
        try:
            os.close(read_fd)
            fd = confine(write_fd, limits)
            outcome = run_candidate(request["s"], request["e"], request["c"])
            _write_all(fd, _dump_json(outcome).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    reaped = False
    try:
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, blocked)
        payload, overflow, timed_out = _collect(read_fd, pid, limits)
        # Kill the child's whole process group before reaping: nothing it spawned outlives it,
        # and an unreaped child keeps its pid (the group id) from being reused.
        _kill_group(pid)
        _, status = os.waitpid(pid, 0)
        reaped = True
    finally:
        os.close(read_fd)
        if not reaped:
            _kill_group(pid)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    if timed_out:
        return _header("limit", f"wall-clock limit ({limits['wall']:g} s) exceeded")
    if overflow:
        return _header("limit", f"output limit ({int(limits['out'])} bytes) exceeded")
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        reason = _SIGNAL_REASONS.get(signum, f"killed by signal {signum}")
        if reason == "CPU time limit":
            reason = f"CPU time limit ({limits['cpu']:g} s) exceeded"
        return _header("limit", reason)
    code = os.WEXITSTATUS(status)
    if code != 0 or not payload:
        return _header("limit", f"sandbox process ended without a result (exit status {code})")
    return _header("done") + payload


def _kill_group(pid: int) -> None:
    for kill, target in ((os.killpg, pid), (os.kill, pid)):  # the group, or the child if setpgid had not run
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _collect(read_fd: int, pid: int, limits: dict) -> tuple[bytes, bool, bool]:
    """Read the child's result until EOF and exit, the output cap, or the wall deadline."""
    deadline = time.monotonic() + float(limits["wall"])
    cap = int(limits["out"])
    poller = select.poll()
    poller.register(read_fd, select.POLLIN)
    # A pidfd turns "the child exited" into a pollable event, so a child that somehow closed its
    # pipe early is still held to the deadline instead of blocking waitpid.
    pidfd = _pidfd_open(pid)
    chunks, size, eof, exited = [], 0, False, pidfd is None
    try:
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        while not (eof and exited):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return b"".join(chunks), False, True
            for fd, _ in poller.poll(max(1, math.ceil(remaining * 1000))):
                if fd == pidfd:
                    exited = True
                    poller.unregister(pidfd)
                    continue
                data = os.read(read_fd, 65536)
                if not data:
                    eof = True
                    poller.unregister(read_fd)
                    continue
                size += len(data)
                if size > cap:
                    return b"", True, False
                chunks.append(data)
        return b"".join(chunks), False, False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _pidfd_open(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except OSError:  # kernels before 5.3
        return None


# A fixed program of ours, run once in the worker at start-up. The compiler, parser and eval loop
# initialise state lazily; done here, every child inherits it warm instead of redoing it in
# copy-on-write memory (measured on a 2-core VM: a child's compile took 2.5 ms without this,
# 0.25 ms with it).
_WARM_UP_SOURCE = '''"""warm-up"""
def warm_up(x, text="abc"):
    values = [x, -x, abs(x), len(text), int(str(x))]
    if x > 0 and text[::-1] != text:
        values += [max(values), min(values), sum(values), bool(x % 2 == 0)]
    return [(v, str(v)) for v in values if v >= 0 or not v], {"k": None}, 1.5, text[0] // x
'''


def _warm_up() -> None:
    for argument in (1, 0):  # 0 takes the exception path (ZeroDivisionError)
        outcome = run_candidate(_WARM_UP_SOURCE, "warm_up", [encode_value((argument,))])
        _dump_json(outcome).encode()
    _header("done")


def _raise_exit(signum, frame):  # noqa: ARG001 - signal handler signature
    raise SystemExit(0)


def main(argv: list[str]) -> int:
    limits = json.loads(argv[1])
    _die_with_parent()
    if os.getppid() != int(limits["parent"]):
        return 0  # the parent died before we could ask to die with it
    signal.signal(signal.SIGTERM, _raise_exit)
    # Move the protocol pipes off fds 0/1 so nothing a child inherits can reach them by accident.
    requests, replies = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    _DEVNULL.append(os.open(os.devnull, os.O_WRONLY))
    _warm_up()
    # Everything alive now is permanent: the collector in a child never walks (and so never
    # copies) the worker's own objects.
    gc.freeze()
    while True:
        header = _read_exact(requests, FRAME_HEADER.size)
        if header is None:
            return 0  # parent closed the pipe: orderly shutdown
        (length,) = FRAME_HEADER.unpack(header)
        body = _read_exact(requests, length)
        if body is None:
            return 0
        reply = evaluate_in_child(json.loads(body), limits)
        try:
            _write_all(replies, FRAME_HEADER.pack(len(reply)) + reply)
        except BrokenPipeError:
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
