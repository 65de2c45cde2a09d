"""The sandbox worker (launcher, zygote, child) and the value wire format it shares with the caller.

Run as a script (`python -s -S worker.py CONFIG`, PYTHONHASHSEED fixed), the launcher executes itself
again with address-space randomisation off, creates the namespaces (confinement.py) and forks the
zygote, which is PID 1 of the new PID namespace and talks to the caller over a Unix socket. Per
candidate the caller makes two fresh pipes, writes the request into one, and passes the child's ends
and a /dev/null opened for that child to the zygote (`SCM_RIGHTS`); the zygote forks a child on them,
enforces the wall clock, reaps it and sends back its wait status. The child confines itself, reads
its own request, runs it and writes the raw results, which the caller reads and judges. Neither the
launcher nor the zygote ever reads a request or a result, so no child starts from a state that held
another candidate's data. Standard library only (never the glm53_flash package), so a worker starts
in milliseconds and stays small enough to fork fast. Imported as `glm53_flash.verifier.worker`, it
gives the caller the encoder, the decoder and the protocol constants.
"""

from __future__ import annotations

# Only C modules past the interpreter's own start-up set: the pure-Python wrappers `json`, `signal`
# and `socket` pull in `re`, `enum`, `selectors` and `collections` (1.5 MB of objects), and every
# page of the zygote costs each fork and each exit.
import _json
import _signal
import _socket
import fcntl
import gc
import math
import os
import resource
import select
import struct
import sys
import time
import unicodedata  # noqa: F401 - the compiler imports it lazily for non-ASCII identifiers; a child cannot open files

# The codecs `str(data, encoding)` may name (policy.PRELOADED_CODECS): a child cannot import one.
import encodings.ascii  # noqa: F401, E402
import encodings.latin_1  # noqa: F401, E402
import encodings.utf_16  # noqa: F401, E402
import encodings.utf_32  # noqa: F401, E402
import encodings.utf_8  # noqa: F401, E402

if __package__ in (None, ""):  # run as a script (-I: the script's folder is not on sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import confinement
else:
    from glm53_flash.verifier import confinement

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

# ----------------------------------------------------------------------------------------------------
# Value wire format. JSON with tags, so the parent decodes with json.loads (never pickle or marshal):
#   None, True/False, small ints and str travel as themselves; every container or other scalar is a
#   list whose first element is a one-letter tag: ["L", ...] list, ["T", ...] tuple, ["S", ...] set,
#   ["F", ...] frozenset, ["D", k1, v1, ...] dict, ["I", hex] big int, ["R", hex] float,
#   ["C", hex, hex] complex, ["B", hex] bytes, ["A", hex] bytearray, ["E"] Ellipsis,
#   ["X", why] a value that cannot be transported (wrong type, oversized, nested too deeply).
# ----------------------------------------------------------------------------------------------------
_JSON_SAFE_INT = 2 ** 53


class _ScanContext:
    """What `_json.make_scanner` reads from a decoder: plain JSON, no hooks, no NaN or Infinity."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict = {}

    @staticmethod
    def parse_constant(name):
        raise ValueError(f"{name} is not allowed on the wire")


_scan = _json.make_scanner(_ScanContext())
# Compact separators, ASCII output, no circular check (wire values are fresh trees), no NaN.
_encode_json = _json.make_encoder(None, None, _json.encode_basestring_ascii, None, ":", ",", False, False,
                                  False)


def loads(data) -> object:
    """json.loads for one JSON document (bytes as UTF-8 or str), with the C scanner alone."""
    text = data.decode("utf-8") if type(data) is not str else data
    start = _skip_space(text, 0)
    try:
        value, end = _scan(text, start)
    except (StopIteration, SystemError):
        # The scanner reports a syntax error through json.decoder, which this process never imports.
        raise ValueError("malformed JSON document") from None
    if _skip_space(text, end) != len(text):
        raise ValueError("extra data after the JSON document")
    return value


def _skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index] in " \t\n\r":
        index += 1
    return index


def dumps(value) -> str:
    """Compact ASCII JSON text, as json.dumps(value, separators=(",", ":"))."""
    return "".join(_encode_json(value, 0))


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


# The caller's side of a result: compared with the expected value and previewed for messages without
# rebuilding the child's sets and dicts, whose members the child chose (a set of integers with one
# hash made rebuilding it quadratic). Work is linear in the frame, plus the square of the expected
# value's size (which the task, not the child, decides).
_WIRE_TYPES = {"L": list, "T": tuple, "S": set, "F": frozenset, "D": dict, "I": int, "R": float, "C": complex,
               "B": bytes, "A": bytearray, "E": type(Ellipsis)}
PREVIEW_NODES = 256  # a result with more wire nodes is described, not decoded, in messages


def wire_type(data) -> type:
    """The Python type a wire value decodes to (Unsupported for ["X", ...])."""
    if type(data) is not list:
        return type(data)
    if not data or type(data[0]) is not str or (data[0] not in _WIRE_TYPES and data[0] != "X"):
        raise ProtocolError("bad wire value")
    return Unsupported if data[0] == "X" else _WIRE_TYPES[data[0]]


def matches_wire(data, expected, max_depth: int = MAX_DEPTH + 1) -> bool:
    """`decode_value(data) == expected` (Python's ==, so 1 == 1.0 inside containers and {1} ==
    frozenset({1})), computed on the wire form: a set or dict is matched member by member against the
    expected one's, never built from the child's members."""
    if max_depth <= 0:
        raise ProtocolError("wire value nested too deeply")
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is str:
        return type(expected) in (type(None), bool, int, float, complex, str) and data == expected
    tag = wire_type(data)
    items = data[1:]
    if tag in (list, tuple):
        return (type(expected) is tag and len(items) == len(expected)
                and all(matches_wire(a, e, max_depth - 1) for a, e in zip(items, expected)))
    if tag in (set, frozenset):
        if type(expected) not in (set, frozenset) or len(items) != len(expected):
            return False
        return _pairs_match([(item, None) for item in items], [(e, None) for e in expected], max_depth)
    if tag is dict:
        if type(expected) is not dict or len(items) % 2 or len(items) // 2 != len(expected):
            return False
        pairs = [(items[i], items[i + 1]) for i in range(0, len(items), 2)]
        return _pairs_match(pairs, list(expected.items()), max_depth)
    if tag is Unsupported:
        return False
    return decode_value(data, max_depth) == expected  # a scalar: linear in its text


def _pairs_match(actual: list, expected: list, max_depth: int) -> bool:
    """Every actual (member, value) equals a distinct expected one (the value compared when present)."""
    unmatched = list(range(len(expected)))
    for member, value in actual:
        for position, index in enumerate(unmatched):
            key, item = expected[index]
            if matches_wire(member, key, max_depth - 1) and (value is None or matches_wire(value, item, max_depth - 1)):
                del unmatched[position]
                break
        else:
            return False
    return not unmatched


def result_frame_bytes(cases: int) -> int:
    """The most bytes an honest child's result frame can take for `cases` cases: each value within
    VALUE_BUDGET (at most 12 bytes of ASCII JSON per unit: a surrogate pair's two escapes), each
    error message within MESSAGE_CHARS, plus the envelope. The caller refuses a larger frame unread."""
    return 256 + cases * 12 * (VALUE_BUDGET + MESSAGE_CHARS + 64)


def wire_nodes(data, limit: int) -> int:
    """The number of nodes in a wire value, counted up to `limit` (iteratively: no recursion)."""
    count, stack = 0, [data]
    while stack and count < limit:
        node = stack.pop()
        count += 1
        if type(node) is list:
            stack.extend(node[1:])
    return count


def preview_value(data):
    """The decoded value for a message when it is small; else an Unsupported naming its type and size."""
    if wire_nodes(data, PREVIEW_NODES + 1) <= PREVIEW_NODES:
        return decode_value(data)
    kind = wire_type(data)
    return Unsupported(f"{kind.__name__} too large to show ({len(data) - 1:,} items at the top)")


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


def confine(request_fd: int, result_fd: int, null_fd: int, limits: dict, lock) -> None:
    """Lock the current (child) process down before it reads its request or runs candidate code.

    The child leads its own process group and dies with the zygote. fds 0-2 become `null_fd`, a
    write-only /dev/null the caller opened for this child alone (stdin reads fail; no other child
    shares its file description, so its flags, offset or locks reach no later candidate), the
    result pipe moves to fd 3 and the request pipe to fd 4, every
    other descriptor is closed, and RLIMIT_NOFILE=4 (a child that closes its own fds gets slots
    back, but the filter refuses every open, socket and pipe-making call that would use them).
    Inherited from the zygote (limit_zygote): caps on address space, file size (0: no file writes),
    core dumps, locked memory and message queues. Set here: no new processes, and the CPU time:
    ITIMER_PROF gives the fractional CPU limit, and RLIMIT_CPU (soft = hard, so SIGKILL) is the
    whole-second backstop that nothing can catch. Last, the kernel layer: the child's seccomp filter
    on top of the zygote's (confinement.py), when the host has them.
    """
    # The zygote already reset SIGINT/SIGTERM to their defaults and holds the limits a child shares
    # with it (limit_zygote); SIGPROF and SIGXCPU are at their default (kill). Every Python object a
    # child touches after fork costs a copy-on-write page fault, so this path stays short.
    _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
    os.setpgid(0, 0)
    confinement.die_with_parent()
    # Move both pipes above the target numbers first, so neither dup2 overwrites the other.
    high_result = fcntl.fcntl(result_fd, fcntl.F_DUPFD, 10)
    high_request = fcntl.fcntl(request_fd, fcntl.F_DUPFD, 10)
    high_null = fcntl.fcntl(null_fd, fcntl.F_DUPFD, 10)
    for fd in (0, 1, 2):
        os.dup2(high_null, fd)
    os.dup2(high_result, 3)
    os.dup2(high_request, 4)
    os.closerange(5, _OPEN_MAX[0])
    cpu = float(limits["cpu"])
    # Soft and hard equal: at the backstop the kernel sends SIGKILL, which nothing can catch or block.
    cpu_backstop = math.ceil(cpu) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_backstop, cpu_backstop))
    resource.setrlimit(resource.RLIMIT_NOFILE, (4, 4))
    try:  # the zygote needs to fork, so this one is the child's alone
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    except (AttributeError, ValueError, OSError):
        pass
    _signal.setitimer(_signal.ITIMER_PROF, cpu)
    if lock.available:
        lock.apply()


# Queued signals a child (or the zygote) may add to its uid's count: the kernel memory of a signal
# storm stays bounded by this process's own limit, not the uid's default of tens of thousands. Signals
# the kernel sends (the CPU timer's SIGPROF, RLIMIT_CPU's SIGKILL) are not counted against it.
SIGPENDING_LIMIT = 64


def limit_zygote(limits: dict) -> None:
    """The rlimits every child shares with the zygote, set once in the zygote and inherited: address
    space, file size (0: no file writes), core dumps, locked memory, message queues and queued
    signals (`SIGPENDING_LIMIT`). Soft = hard,
    so no process below can raise them. (CPU time, descriptors and processes are each child's own:
    see `confine`.)"""
    _OPEN_MAX[0] = _max_fd()
    for name, value in (("RLIMIT_AS", int(limits["mem"])), ("RLIMIT_FSIZE", 0), ("RLIMIT_CORE", 0),
                        ("RLIMIT_MEMLOCK", 0), ("RLIMIT_MSGQUEUE", 0), ("RLIMIT_SIGPENDING", SIGPENDING_LIMIT)):
        kind = getattr(resource, name, None)
        if kind is None:
            continue
        try:
            resource.setrlimit(kind, (value, value))
        except (ValueError, OSError):
            # Lowering always works; this only fails where the platform lacks the limit.
            if name in ("RLIMIT_AS", "RLIMIT_FSIZE"):
                raise


_OPEN_MAX = [1024]


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        return 1024


_SIGNAL_REASONS = {
    _signal.SIGPROF: "CPU time limit",
    _signal.SIGXCPU: "CPU time limit",
    _signal.SIGKILL: "killed (hard CPU limit or the system's out-of-memory killer)",
    _signal.SIGXFSZ: "file size limit",
    _signal.SIGSEGV: "crashed with SIGSEGV (stack or memory exhaustion)",
    _signal.SIGABRT: "aborted (likely out of memory)",
    _signal.SIGSYS: "killed by the seccomp filter (a system call of another ABI)",
}




def describe_limit(status: int, timed_out: bool, overflow: bool, payload: bytes, limits: dict) -> str | None:
    """Why a child's run ended as a limit (None when it ended normally with a result). `status` is
    its raw wait status from the zygote, -1 if it could not be forked."""
    if status == -1:
        return "could not start the sandbox process"
    if timed_out:
        return f"wall-clock limit ({limits['wall']:g} s) exceeded"
    if overflow:
        return f"output limit ({int(limits['out'])} bytes) exceeded"
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        reason = _SIGNAL_REASONS.get(signum, f"killed by signal {signum}")
        if reason == "CPU time limit":
            reason = f"CPU time limit ({limits['cpu']:g} s) exceeded"
        return reason
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    if code != 0 or not payload:
        return f"sandbox process ended without a result (exit status {code})"
    return None


def _child(request_fd: int, result_fd: int, null_fd: int, limits: dict, lock) -> None:
    """The forked child: confine, read its own request, run it, write the raw results, exit."""
    status = 70
    try:
        confine(request_fd, result_fd, null_fd, limits, lock)
        chunks = []
        while True:
            chunk = os.read(4, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(4)
        request = loads(b"".join(chunks))
        outcome = run_candidate(request["s"], request["e"], request["c"])
        _write_all(3, dumps(outcome).encode())
        status = 0
    finally:
        os._exit(status)


# ----------------------------------------------------------------------------------------------------
# The zygote: forked by the worker before the worker reads any request, so no child ever starts from
# a process state that held another candidate's request or result. It receives only two descriptors
# per candidate (the child's ends of two fresh pipes), forks, enforces the wall clock, reaps, and
# sends back the exit status. It never reads a request or a result.
# ----------------------------------------------------------------------------------------------------
STATUS = struct.Struct("=iB")  # the zygote's report per candidate: raw wait status (-1: no fork), timed out
RUN_REQUEST = b"r"             # caller -> zygote, with RUN_DESCRIPTORS descriptors: fork a child on them
RUN_DESCRIPTORS = 3            # the request pipe's read end, the result pipe's write end, a fresh /dev/null


def _zygote(channel: _socket.socket, limits: dict, report, lock, workdir: str) -> None:
    status = 70
    try:
        confinement.die_with_parent()
        confinement.prepare_zygote(report, workdir)
        confinement.die_with_parent()  # again: a change of uid clears the parent-death signal
        # Default dispositions: as PID 1 of its namespace the zygote then ignores every signal sent
        # from inside it (a child that got a signal past the filter could not stop the zygote),
        # while the caller's SIGKILL still ends it.
        for signum in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP, _signal.SIGUSR1, _signal.SIGUSR2,
                       _signal.SIGIO, _signal.SIGALRM, _signal.SIGPIPE):
            _signal.signal(signum, _signal.SIG_DFL)
        lock.probe(report)
        limit_zygote(limits)
        channel.sendall(dumps({"k": "hello", "isolation": report.to_dict()}).encode())
        gc.freeze()
        while _serve_one(channel, limits, lock):
            pass
        status = 0
    finally:
        os._exit(status)


def _serve_one(channel: _socket.socket, limits: dict, lock) -> bool:
    try:
        message, fds = _receive_fds(channel, 16, RUN_DESCRIPTORS)
    except OSError:
        return False
    if message != RUN_REQUEST or len(fds) != RUN_DESCRIPTORS:
        for fd in fds:
            os.close(fd)
        return False  # the caller closed the channel (orderly shutdown) or broke the protocol
    request_fd, result_fd, null_fd = fds
    blocked = (_signal.SIGTERM, _signal.SIGINT)
    _signal.pthread_sigmask(_signal.SIG_BLOCK, blocked)
    try:
        pid = os.fork()
    except OSError:
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, blocked)
        for fd in fds:
            os.close(fd)
        channel.sendall(STATUS.pack(-1, 0))
        return True
    if pid == 0:
        channel.close()
        _child(request_fd, result_fd, null_fd, limits, lock)
    for fd in fds:
        os.close(fd)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, blocked)
    status, timed_out = _wait_child(pid, float(limits["wall"]), reap_orphans=not lock.available)
    channel.sendall(STATUS.pack(status, timed_out))
    return True


_FD = struct.Struct("=i")


def _receive_fds(channel: _socket.socket, size: int, most: int) -> tuple[bytes, list[int]]:
    """socket.recv_fds without the socket module: a message and the descriptors that came with it."""
    message, ancillary, _, _ = channel.recvmsg(size, _socket.CMSG_LEN(most * _FD.size))
    fds = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.extend(number for (number,) in _FD.iter_unpack(data[:len(data) - len(data) % _FD.size]))
    return message, fds


def _wait_child(pid: int, wall: float, reap_orphans: bool) -> tuple[int, bool]:
    """Wait for the child's exit until the wall deadline; kill its process group before reaping, so
    nothing it spawned outlives it. (wait status, timed out). A child whose output overflowed is
    not killed early: the caller closes its end of the result pipe and the child's next write fails."""
    deadline = time.monotonic() + wall
    pidfd = _pidfd_open(pid)
    timed_out = False
    try:
        while not _exited(pid):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            if pidfd is not None:
                select.select([pidfd], [], [], remaining)
            else:
                time.sleep(min(remaining, 0.002))
    finally:
        if pidfd is not None:
            os.close(pidfd)
    _kill_group(pid)
    _, status = os.waitpid(pid, 0)
    if reap_orphans:  # without the seccomp filter a child could fork; as PID 1 we inherit orphans
        _reap_orphans()
    return status, timed_out


def _exited(pid: int) -> bool:
    """True once the child has exited; it stays unreaped (a zombie keeps its process group id)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _reap_orphans() -> None:
    while True:
        try:
            found, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if found == 0:
            return


def _kill_group(pid: int) -> None:
    for kill, target in ((os.killpg, pid), (os.kill, pid)):  # the group, or the child if setpgid had not run
        try:
            kill(target, _signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _pidfd_open(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except OSError:  # kernels before 5.3
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


# A fixed program of ours, run once in the worker at start-up. The compiler, parser and eval loop
# initialise state lazily; done here, every child inherits it warm instead of redoing it in
# copy-on-write memory (a child's compile is then several times faster).
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
        dumps(outcome).encode()


def _raise_exit(signum, frame):  # noqa: ARG001 - signal handler signature
    raise SystemExit(0)


def main(argv: list[str]) -> int:
    """The launcher: fix the address layout, set up the namespaces, fork the zygote, wait for it. It
    never sees a request."""
    fixed = ""
    if not confinement.addresses_fixed():
        fixed = confinement.exec_with_fixed_addresses([sys.executable, *sys.orig_argv[1:]])  # returns on failure
    limits = loads(argv[1])
    confinement.die_with_parent()
    if os.getppid() != int(limits["parent"]):
        return 0  # the parent died before we could ask to die with it
    _signal.signal(_signal.SIGTERM, _raise_exit)
    channel = _socket.socket(fileno=int(limits["channel"]))
    _warm_up()
    confine_kernel = bool(limits.get("kernel", True))
    report = confinement.Isolation()
    if fixed:
        report.refused("fixed_addresses", fixed)
    else:
        report.reached("fixed_addresses", "address-space randomisation off")
    lock = confinement.ChildLock(enabled=confine_kernel)
    confinement.enter_namespaces(report, enabled=confine_kernel)
    # No process of our uid may trace us or read our /proc files. (After the namespaces: writing our
    # own uid_map needs the flag set.)
    confinement.set_dumpable(False)
    workdir = ""
    if not report.layers["mount_namespace"]:
        import tempfile  # only here: every module imported before the fork makes each fork dearer

        workdir = tempfile.mkdtemp(prefix="glm53-sandbox-")
        os.chmod(workdir, 0o555)
    try:
        pid = os.fork()
        if pid == 0:
            _zygote(channel, limits, report, lock, workdir)
        channel.close()  # only the zygote talks to the caller
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status) & 0xFF
    finally:
        if workdir:
            try:
                os.rmdir(workdir)
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main(sys.argv))
