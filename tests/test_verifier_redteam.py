"""Red team: hostile programs written as an attacker would, with the host watched for any effect.

Two suites. The first goes through the public API (`Verifier.evaluate_many`), policy on: every
program must get the stated verdict, never a pass it did not compute. The second assumes the policy
is broken: each program recovers the real builtins through the classic attribute escape and runs
through the test hook that skips the policy, so only the process and kernel layers stand between it
and the host. After every program the host is checked: marker files untouched and nothing created,
no connection to a listener on 127.0.0.1, no signal delivered to this (the calling) process, a
canary in this process's memory unchanged and its environment canary not echoed back, and no
process left beyond each worker and its zygote.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import socket
import time
from pathlib import Path

import pytest

from glm53_flash.tasks.families import _frozen_tasks as frozen_tasks, _task_by_id as task_by_id  # the generator itself: sealed splits without an opening, for tests of the verifier and suites
from glm53_flash.verifier import Verifier

from process_helpers import live_members, require_full_isolation, wait_until

CALLER = os.getpid()
CANARY_ENV = "GLM53_REDTEAM_CANARY"
CANARY_VALUE = secrets.token_hex(8)
CANARY_MEMORY = bytearray(b"canary-" + secrets.token_hex(8).encode())
CANARY_ADDRESS = ctypes.addressof(ctypes.c_char.from_buffer(CANARY_MEMORY))
CANARY_ORIGINAL = bytes(CANARY_MEMORY)
WATCHED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
TASKS_SOURCE = str(Path(__import__("glm53_flash.tasks", fromlist=["x"]).__file__).resolve())
ESCAPE = ("B = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
          ".__init__.__globals__['__builtins__']\n"
          "os = B['__import__']('os')")


class Host:
    """What an escape would change, and the checks that it did not."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.victim = root / "victim.txt"
        self.victim.write_text("untouched")
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.received: list[int] = []
        self.previous = {signum: signal.signal(signum, lambda n, f: self.received.append(n))
                         for signum in WATCHED_SIGNALS}
        os.environ[CANARY_ENV] = CANARY_VALUE

    def check(self, verifier: Verifier, results) -> None:
        assert sorted(path.name for path in self.root.iterdir()) == ["victim.txt"], list(self.root.iterdir())
        assert self.victim.read_text() == "untouched"
        try:
            connection, _ = self.listener.accept()
            connection.close()
            raise AssertionError("a candidate connected to the listener on 127.0.0.1")
        except BlockingIOError:
            pass
        assert self.received == [], f"signals reached the caller: {self.received}"
        assert bytes(CANARY_MEMORY) == CANARY_ORIGINAL, "the caller's memory was changed"
        for result in results:
            assert CANARY_VALUE not in result.message, "the caller's environment leaked"
        for worker in verifier.worker_pids():
            assert wait_until(lambda: len(live_members(worker)) <= 2), f"processes left behind: {live_members(worker)}"

    def close(self) -> None:
        self.listener.close()
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        os.environ.pop(CANARY_ENV, None)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    watched = Host(tmp_path_factory.mktemp("host"))
    yield watched
    watched.close()


@pytest.fixture(scope="module")
def verifier(host):
    with Verifier(workers=2, cpu_seconds=0.5, wall_seconds=1.5) as pool:
        yield pool


def task_of(family: str):
    return task_by_id(f"confirm-{family}-000")


def program(task, body: str) -> str:
    return task.prompt + "\n" + "\n".join("    " + line for line in body.split("\n")) + "\n"


def fill(text: str, host: Host) -> str:
    return (text.replace("ROOT", str(host.root)).replace("PORT", str(host.port)).replace("CALLER", str(CALLER))
            .replace("ADDRESS", str(CANARY_ADDRESS)).replace("TASKS", TASKS_SOURCE))


# ----------------------------------------------------------------------------------------------------
# Suite 1: through the public API, policy on
# ----------------------------------------------------------------------------------------------------
# (name, family, body, expected status). Each would, if it ran as meant, reach an object outside the
# allowed set, rebind an allowed name, or run code the policy never saw.
PUBLIC = [
    # class patterns with keywords: read any attribute by name
    ("class-kw-format", "double", "match '{0}':\n    case str(format=f):\n        return x * 2", "invalid"),
    ("class-kw-format-into-len", "double", "match '{0.gi_frame}':\n    case str(format=len):\n        return len((y for y in [x]))", "invalid"),
    ("class-kw-dunder-class", "double", "match x:\n    case int(__class__=c):\n        return x * 2", "invalid"),
    ("class-kw-real", "double", "match x:\n    case int(real=r):\n        return r * 2", "invalid"),
    ("class-kw-mixed", "double", "match x:\n    case int(y, real=r):\n        return y * 2", "invalid"),
    ("class-kw-nested", "double", "match [x]:\n    case [int(imag=i)]:\n        return x * 2", "invalid"),
    ("class-kw-in-or", "double", "match x:\n    case int(real=r) | str(upper=r):\n        return x * 2", "invalid"),
    ("class-kw-mapping-value", "double", "match {'k': x}:\n    case {'k': int(numerator=n)}:\n        return n * 2", "invalid"),
    ("class-kw-bool", "double", "match True:\n    case bool(conjugate=c):\n        return x * 2", "invalid"),
    ("class-kw-str-join", "double", "match '':\n    case str(join=j):\n        return x * 2", "invalid"),
    ("class-attribute-class", "double", "match x:\n    case x.real():\n        return 1", "invalid"),
    # the eight builtins re-bound, so "a call of an allowed name" would call anything
    ("rebind-assign", "double", "len = abs\nreturn len(x) * 2", "invalid"),
    ("rebind-tuple-assign", "double", "a, str = 1, 2\nreturn x * 2", "invalid"),
    ("rebind-starred", "double", "*int, b = [1, 2]\nreturn x * 2", "invalid"),
    ("rebind-augassign", "double", "sum += 1\nreturn x * 2", "invalid"),
    ("rebind-annassign", "double", "max: int = 0\nreturn x * 2", "invalid"),
    ("rebind-annassign-bare", "double", "min: int\nreturn x * 2", "invalid"),
    ("rebind-walrus", "double", "return (abs := x) * 2", "invalid"),
    ("rebind-walrus-in-comprehension", "double", "return [(len := v) for v in [x]][0] * 2", "invalid"),
    ("rebind-comprehension-target", "double", "return [str for str in [x]][0] * 2", "invalid"),
    ("rebind-generator-target", "double", "return sum(bool for bool in [x, x])", "invalid"),
    ("rebind-dict-comprehension", "double", "return {int: 1 for int in [x]} and x * 2", "invalid"),
    ("rebind-parameter", "double", "def g(len):\n    return len\nreturn x * 2", "invalid"),
    ("rebind-vararg", "double", "def g(*sum):\n    return sum\nreturn x * 2", "invalid"),
    ("rebind-kwarg", "double", "def g(**max):\n    return max\nreturn x * 2", "invalid"),
    ("rebind-kwonly", "double", "def g(*, abs=1):\n    return abs\nreturn x * 2", "invalid"),
    ("rebind-posonly", "double", "def g(min, /):\n    return min\nreturn x * 2", "invalid"),
    ("rebind-def-name", "double", "def str(y):\n    return y\nreturn x * 2", "invalid"),
    ("rebind-capture", "double", "match x:\n    case len:\n        return x * 2", "invalid"),
    ("rebind-as", "double", "match x:\n    case 1 as int:\n        return 2\n    case _:\n        return x * 2", "invalid"),
    ("rebind-star-pattern", "double", "match [x]:\n    case [*sum]:\n        return x * 2", "invalid"),
    ("rebind-mapping-rest", "double", "match {}:\n    case {**bool}:\n        return x * 2", "invalid"),
    ("rebind-entry-parameter", "double", lambda t: t.prompt.replace("(x)", "(x, len=abs)") + "\n    return x * 2\n", "invalid"),
    ("rebind-unicode-normalised", "double", "ｌｅｎ = abs\nreturn len(x) * 2", "invalid"),
    # format field syntax and frames: nothing reaches .format, a generator's frame or a module
    ("format-method", "double", "return '{0.gi_frame.f_back}'.format((y for y in [x]))", "invalid"),
    ("format-map", "double", "return '{a}'.format_map({'a': x})", "invalid"),
    ("fstring-attribute", "double", "return f'{x.__class__}'", "invalid"),
    ("fstring-nested-attribute", "double", "return f'{x:{x.real}}'", "invalid"),
    ("generator-frame", "double", "g = (y for y in [x])\nreturn g.gi_frame", "invalid"),
    ("generator-send", "double", "def g():\n    yield x\nreturn g().send(None)", "invalid"),
    ("dunder-name", "double", "return __builtins__", "invalid"),
    ("dunder-unicode", "double", "return ＿＿builtins＿＿", "invalid"),
    ("dunder-import", "double", "return __import__('os')", "invalid"),
    ("dunder-subscript", "double", "return [].__class__", "invalid"),
    ("getattr-call", "double", "return getattr(x, 'real')", "invalid"),
    ("eval-call", "double", "return eval('x * 2')", "invalid"),
    ("exec-call", "double", "exec('y = 1')\nreturn x * 2", "invalid"),
    ("open-call", "double", "return open('TASKS').read()", "invalid"),
    ("helper-call", "double", "def g(y):\n    return y * 2\nreturn g(x)", "invalid"),
    ("subscript-call", "double", "return [len][0]([x]) * x * 2", "invalid"),
    ("call-of-call", "double", "return str(x)(1)", "invalid"),
    ("decorator-call", "double", "@len\ndef g():\n    pass\nreturn x * 2", "invalid"),
    ("decorator-expression", "double", "@[str][0]\ndef g():\n    pass\nreturn x * 2", "invalid"),
    ("lambda", "double", "return (lambda: x * 2)()", "invalid"),
    ("class", "double", "class A:\n    pass\nreturn x * 2", "invalid"),
    ("import", "double", "import os\nreturn x * 2", "invalid"),
    ("try-except-star", "double", "try:\n    return x * 2\nexcept* ValueError:\n    return 0", "invalid"),
    ("global", "double", "global len\nreturn x * 2", "invalid"),
    ("with", "double", "with x:\n    return x * 2", "invalid"),
    ("type-params", "double", "def g[T](y):\n    return y\nreturn x * 2", "invalid"),
    ("second-top-level-def", "double", lambda t: t.reference_source + "def len(x):\n    return 0\n", "invalid"),
    ("top-level-statement", "double", lambda t: "len = abs\n" + t.reference_source, "invalid"),
    # what the policy lets through still ends as a limit, never a pass
    ("memory-blowup", "double", "return [x] * 10 ** 10", "limit"),
    ("time-bomb", "double", "return len([a for a in str(10 ** 3000) for b in str(10 ** 3000) for c in str(10 ** 3000)])", "limit"),
    ("exception-text", "double", "return int('CALLER' + str(x))", "failed"),
    ("max-key-helper", "double", "def g(y):\n    return -y\nreturn max([x * 2, x * 3], key=g)", "failed"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, family, body, status", PUBLIC, ids=[row[0] for row in PUBLIC])
def test_public_api_hostile_program(verifier, host, name, family, body, status):
    task = task_of(family)
    source = body(task) if callable(body) else program(task, fill(body, host))
    result = verifier.evaluate(task, source)
    assert result.status == status, (name, result)
    assert not result.passed
    host.check(verifier, [result])


def test_public_suite_is_large_enough():
    assert len(PUBLIC) >= 60


def test_the_original_escape_earns_nothing_in_rl_shaped_batches(verifier, host):
    """The attack that passed before: one honest sample, then copies of a program that reads the
    previous reply out of the worker's memory through a format field on a generator's frame."""
    cheat = ("match '{0.gi_frame.f_back.f_back.f_locals}':\n    case str(format=len):\n"
             "        return len((y for y in [x]))")
    pairs = []
    for task in frozen_tasks("rl", per_family=2):
        pairs += [(task, task.reference_source)] + [(task, program(task, cheat))] * 3
    results = verifier.evaluate_many(pairs)
    honest, cheats = results[0::4], [r for i, r in enumerate(results) if i % 4]
    assert all(r.passed for r in honest)
    assert all(r.status == "invalid" for r in cheats)
    host.check(verifier, results)


# ----------------------------------------------------------------------------------------------------
# Suite 2: the second layer alone (the policy assumed broken)
# ----------------------------------------------------------------------------------------------------
# (name, body, what the returned value or message must show). Bodies run after ESCAPE (`B` the real
# builtins, `os` the os module) and return a short report; "denied" means an OSError came back.
SECOND_LAYER = [
    # files: read the hidden tests, the caller's secrets, shadow; even with fds 0-2 closed
    ("read-hidden-tests", "return B['open']('TASKS').read()[:40]", "Permission denied"),
    ("close-then-read-tests", "os.close(0); os.close(1); os.close(2)\nreturn B['open']('TASKS').read()[:40]", "Permission denied"),
    ("close-all-then-open", "os.closerange(0, 3)\nreturn os.open('/etc/hostname', os.O_RDONLY)", "Permission denied"),
    ("read-shadow", "os.close(0)\nreturn B['open']('/etc/shadow').read()[:20]", "Permission denied"),
    ("read-caller-environ", "return B['open']('/proc/CALLER/environ', 'rb').read()[:50]", "Permission denied"),
    ("read-caller-cmdline", "return B['open']('/proc/CALLER/cmdline', 'rb').read()[:50]", "Permission denied"),
    ("write-caller-memory", "f = B['open']('/proc/CALLER/mem', 'r+b')\nf.seek(ADDRESS)\nf.write(b'X')\nreturn 'wrote'", "Permission denied"),
    ("read-caller-maps", "return B['open']('/proc/CALLER/maps').read()[:40]", "Permission denied"),
    ("openat2-raw", "c = B['__import__']('ctypes')\nreturn c.CDLL(None, use_errno=True).syscall(437, -100, b'/etc/hostname', 0, 0)", "-1"),
    ("open-by-handle", "c = B['__import__']('ctypes')\nreturn c.CDLL(None, use_errno=True).syscall(304, -100, 0, 0)", "-1"),
    ("list-proc", "return B['sorted'](os.listdir('/proc'))[:3]", "Permission denied"),
    ("stat-shows-pid-namespace", "return [os.getpid() < 100, os.getppid()]", "[True, 1]"),
    ("uid-not-root", "return os.getuid() != 0 and os.geteuid() != 0", "True"),
    # filesystem changes
    ("unlink-victim", "os.unlink('ROOT/victim.txt')\nreturn 'gone'", "Operation not permitted"),
    ("rename-victim", "os.rename('ROOT/victim.txt', 'ROOT/moved.txt')\nreturn 'moved'", "Operation not permitted"),
    ("symlink-into-host", "os.symlink('/etc/shadow', 'ROOT/link')\nreturn 'linked'", "Operation not permitted"),
    ("hardlink", "os.link('ROOT/victim.txt', 'ROOT/hard')\nreturn 'linked'", "Operation not permitted"),
    ("mkdir-host", "os.mkdir('ROOT/dir')\nreturn 'made'", "Operation not permitted"),
    ("rmdir-host", "os.rmdir('ROOT')\nreturn 'removed'", "Operation not permitted"),
    ("chmod-host", "os.chmod('ROOT/victim.txt', 0o777)\nreturn 'changed'", "Operation not permitted"),
    ("truncate-host", "os.truncate('ROOT/victim.txt', 0)\nreturn 'cut'", "Operation not permitted"),
    ("write-victim", "B['open']('ROOT/victim.txt', 'w').write('owned')\nreturn 'owned'", "Permission denied"),
    ("create-marker", "B['open']('ROOT/marker', 'x').write('here')\nreturn 'made'", "Permission denied"),
    ("write-workdir", "B['open']('answers.txt', 'w').write('[-8, 0, 12]')\nreturn 'left'", "Permission denied"),
    ("utime-host", "os.utime('ROOT/victim.txt', (0, 0))\nreturn 'touched'", "Operation not permitted"),
    # sockets and the network
    ("socket", "return str(B['__import__']('_socket').socket())", "Operation not permitted"),
    ("connect-listener", "s = B['__import__']('_socket')\ns.socket().connect(('127.0.0.1', PORT))\nreturn 'connected'", "Operation not permitted"),
    ("socketpair", "return str(B['__import__']('_socket').socketpair())", "Operation not permitted"),
    ("udp", "s = B['__import__']('_socket')\nreturn str(s.socket(s.AF_INET, s.SOCK_DGRAM))", "Operation not permitted"),
    # signals and other processes
    ("kill-caller", "os.kill(CALLER, 10)\nreturn 'sent'", "Operation not permitted"),
    ("kill-caller-hup", "os.kill(CALLER, 1)\nreturn 'sent'", "Operation not permitted"),
    ("killpg-everyone", "os.kill(-1, 12)\nreturn 'sent'", "Operation not permitted"),
    ("kill-zygote", "os.kill(os.getppid(), 9)\nreturn 'sent'", "Operation not permitted"),
    ("pidfd-caller", "return os.pidfd_open(CALLER)", "Operation not permitted"),
    ("tgkill-raw", "c = B['__import__']('ctypes')\nreturn c.CDLL(None, use_errno=True).syscall(234, CALLER, CALLER, 10)", "-1"),
    ("ptrace-caller", "c = B['__import__']('ctypes')\nreturn c.CDLL(None, use_errno=True).ptrace(16, CALLER, 0, 0)", "-1"),
    ("process-vm-writev", "c = B['__import__']('ctypes')\nreturn c.CDLL(None, use_errno=True).syscall(311, CALLER, 0, 1, 0, 1, 0)", "-1"),
    # new processes, sessions, programs
    ("fork", "return os.fork()", "Operation not permitted"),
    ("double-fork-daemon", "if os.fork() == 0:\n    os.setsid()\n    os.fork()\nreturn 'forked'", "Operation not permitted"),
    ("setsid", "return os.setsid()", "Operation not permitted"),
    ("posix-spawn", "return os.posix_spawn('/bin/sh', ['sh'], {})", "Operation not permitted"),
    ("execv", "os.execv('/bin/sh', ['sh', '-c', 'touch ROOT/pwned'])", "Operation not permitted"),
    ("system", "return os.system('touch ROOT/pwned')", "32512"),  # glibc's status when no shell could start
    # privileges, namespaces, mounts, the filter itself
    ("setuid-root", "os.setuid(0)\nreturn 'root'", "Operation not permitted"),
    ("unshare", "c = B['__import__']('ctypes')\nreturn c.CDLL(None, use_errno=True).unshare(0x10000000)", "-1"),
    ("mount", "c = B['__import__']('ctypes')\nreturn c.CDLL(None, use_errno=True).mount(b'none', b'/tmp', b'tmpfs', 0, None)", "-1"),
    ("chroot", "os.chroot('/')\nreturn 'chrooted'", "Operation not permitted"),
    ("prctl-dumpable", "c = B['__import__']('ctypes')\nreturn c.CDLL(None, use_errno=True).prctl(4, 1, 0, 0, 0)", "-1"),
    ("memfd", "return os.memfd_create('x')", "Operation not permitted"),
    ("change-rlimit", "r = B['__import__']('resource')\nr.setrlimit(r.RLIMIT_CPU, (1, 1))\nreturn 'changed'", "not allowed to raise"),  # CPython's words for EPERM; lowering is otherwise allowed
    ("x32-syscall", "c = B['__import__']('ctypes')\nreturn c.CDLL(None).syscall(0x40000000 + 39)", "limit"),
    # shared state that would outlive the candidate: scheduling, IPC, signals by fcntl
    ("setpriority", "os.setpriority(os.PRIO_PROCESS, 0, 19)\nreturn 'nice'", "Operation not permitted"),
    ("sched-idle", "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nreturn 'idle'", "Operation not permitted"),
    ("sched-affinity", "os.sched_setaffinity(0, {0})\nreturn 'pinned'", "Operation not permitted"),
    ("sigio-owner", "f = B['__import__']('fcntl')\nf.fcntl(3, f.F_SETOWN, 1)\nreturn 'owner'", "Operation not permitted"),
    ("sigio-signal", "f = B['__import__']('fcntl')\nf.fcntl(3, 10, 15)\nreturn 'setsig'", "Operation not permitted"),
    ("sysv-shm", "c = B['__import__']('ctypes')\nreturn c.CDLL(None, use_errno=True).shmget(0, 2 ** 28, 0o1666)", "-1"),
    ("posix-mq", "c = B['__import__']('ctypes')\nreturn c.CDLL(None, use_errno=True).syscall(240, b'/q', 64, 0o600, 0)", "-1"),
    ("newer-syscall", "c = B['__import__']('ctypes')\nreturn c.CDLL(None, use_errno=True).syscall(467, -100, b'/etc', 0, 0, 0)", "-1"),
    ("cancel-cpu-timer", "s = B['__import__']('_signal')\ns.setitimer(s.ITIMER_PROF, 0)\nreturn 'free'", "Operation not permitted"),
    ("ignore-sigxcpu", "s = B['__import__']('_signal')\ns.signal(s.SIGXCPU, s.SIG_IGN)\nreturn 'free'", "Operation not permitted"),
    ("block-sigprof", "s = B['__import__']('_signal')\ns.pthread_sigmask(s.SIG_BLOCK, {s.SIGPROF})\nreturn 'free'", "Operation not permitted"),
    ("ioctl", "f = B['__import__']('fcntl')\nreturn f.ioctl(3, 0x5452, b'1234')", "Operation not permitted"),
    # the harness's own pipes
    ("forge-reply-frames", "os.write(3, b'{\"s\":\"ran\",\"c\":[[1,-8],[1,0],[1,12]]}' * 50)\nos._exit(0)", "limit"),
    ("write-to-request-pipe", "return os.write(4, b'x')", "Bad file descriptor"),
    ("read-worker-fds", "return [os.readlink('/proc/self/fd/' + str(n)) for n in B['range'](8)]",
     "'/proc/self/fd/4'"),  # fds 0-2 /dev/null, 3 its own result pipe, nothing else
]


@pytest.mark.parametrize("name, body, shows", SECOND_LAYER, ids=[row[0] for row in SECOND_LAYER])
def test_second_layer_alone(verifier, host, name, body, shows):
    require_full_isolation(verifier)
    task = task_of("double")
    result = verifier._evaluate_unchecked(task, program(task, ESCAPE + "\n" + fill(body, host)))
    assert not result.passed, (name, result)
    if shows == "limit":
        assert result.status == "limit", (name, result)
    else:
        assert shows in result.message, (name, result)
    host.check(verifier, [result])


def test_second_layer_suite_is_large_enough():
    assert len(SECOND_LAYER) >= 45


@pytest.mark.slow
def test_a_candidate_cannot_pass_a_later_one_through_anything_it_leaves(verifier, host):
    task = task_of("double")
    leave = ("for path in ('/tmp/answers', 'answers', 'ROOT/answers'):\n"
             "    try:\n        B['open'](path, 'w').write('ok')\n    except B['OSError']:\n        pass\n"
             "os.write(3, b'{\"s\":\"ran\",\"c\":[[1,-8],[1,0],[1,12]]}')\n"
             "B['__import__']('time').sleep(0.2)\nreturn 0")
    fetch = ("for path in ('/tmp/answers', 'answers', 'ROOT/answers'):\n"
             "    try:\n        return B['open'](path).read()\n    except B['OSError']:\n        pass\nreturn 'nothing'")
    for _ in range(3):
        first = verifier._evaluate_unchecked(task, program(task, ESCAPE + "\n" + fill(leave, host)))
        assert first.status in ("failed", "limit")
        later = verifier.evaluate_many([(task, program(task, "return x * 3"))] * 2)
        assert all(r.status == "failed" and r.tests_passed == 1 for r in later)  # 0 * 3 == 0 only
        second = verifier._evaluate_unchecked(task, program(task, ESCAPE + "\n" + fill(fetch, host)))
        assert "nothing" in second.message
    host.check(verifier, [first, second])


@pytest.mark.slow
def test_an_observer_sees_a_confined_candidate(host):
    """From outside the pool: own network and user namespaces, not root, NoNewPrivs 1, Seccomp 2."""
    with Verifier(workers=1, cpu_seconds=5, wall_seconds=10) as pool:
        if pool.isolation["level"] != "full":
            pytest.skip(f"this host allows only partial isolation: {pool.isolation['missing']}")
        import threading

        task = task_of("double")
        burner = program(task, "return len([a for a in str(10 ** 4000) for b in str(10 ** 4000)])")
        runner = threading.Thread(target=pool.evaluate, args=(task, burner))
        runner.start()
        worker = pool.worker_pids()[0]
        assert wait_until(lambda: len(live_members(worker)) == 3)
        zygote = int(Path(f"/proc/{worker}/task/{worker}/children").read_text().split()[0])
        (child,) = live_members(worker) - {worker, zygote}
        status = dict(line.split(":", 1) for line in Path(f"/proc/{child}/status").read_text().splitlines())
        assert status["NoNewPrivs"].strip() == "1"
        assert status["Seccomp"].strip() == "2"
        real, effective = (int(value) for value in status["Uid"].split()[:2])
        assert real != 0 and effective != 0
        assert int(status["CapEff"].strip(), 16) == 0
        for kind in ("net", "user", "mnt", "pid", "ipc"):
            assert os.readlink(f"/proc/{child}/ns/{kind}") != os.readlink(f"/proc/self/ns/{kind}"), kind
        # the caller and the workers are not dumpable: their /proc files belong to root
        assert Path(f"/proc/{worker}/status").read_text().count("\n") > 0
        runner.join(timeout=30)
    host.check(pool, [])


def test_an_output_flood_never_costs_the_next_candidate_its_verdict(host):
    """A program whose output overflows must not get a later, honest candidate killed."""
    task = task_of("double")
    flood = program(task, "return '\\x00' * 16000")  # within the value budget; 6 bytes each in JSON
    with Verifier(workers=1, output_bytes=128 * 1024) as pool:
        results = pool.evaluate_many([(task, flood), (task, task.reference_source)] * 3)
        assert [r.status for r in results] == ["limit", "passed"] * 3, results
        assert all("output limit" in r.message for r in results[::2])
        host.check(pool, results)


def test_a_candidate_that_blocks_its_cpu_signals_is_still_stopped(verifier, host):
    require_full_isolation(verifier)
    task = task_of("double")
    body = ("s = B['__import__']('_signal')\n"
            "for call in (lambda: s.pthread_sigmask(s.SIG_BLOCK, {s.SIGPROF, s.SIGXCPU}),\n"
            "             lambda: s.setitimer(s.ITIMER_PROF, 0)):\n"
            "    try:\n        call()\n    except B['OSError']:\n        pass\n"
            "return len([a for a in str(10 ** 4000) for b in str(10 ** 4000) for c in str(10 ** 4000)])")
    start = time.monotonic()
    result = verifier._evaluate_unchecked(task, program(task, ESCAPE + "\n" + body))
    assert result.status == "limit" and "CPU time limit" in result.message, result
    assert time.monotonic() - start < 1.5 + 5  # the wall clock (1.5 s) plus start-up slack
    host.check(verifier, [result])


def test_a_later_candidate_sees_default_scheduling(verifier, host):
    require_full_isolation(verifier)
    task = task_of("double")
    for body in ("os.setpriority(os.PRIO_PROCESS, 0, 19)", "os.sched_setaffinity(0, {0})"):
        verifier._evaluate_unchecked(task, program(task, ESCAPE + "\n" + body + "\nreturn 0"))
    probe = "return [os.getpriority(os.PRIO_PROCESS, 0), B['len'](os.sched_getaffinity(0)), os.getppid()]"
    results = verifier.evaluate_many([(task, program(task, ESCAPE + "\n" + probe))] * 0)  # policy on: refused
    result = verifier._evaluate_unchecked(task, program(task, ESCAPE + "\n" + probe))
    assert f"got [0, {len(os.sched_getaffinity(0))}, 1]" in result.message, result
    host.check(verifier, [result] + results)


def test_decoding_keeps_the_original_verdict_or_is_refused(verifier):
    from glm53_flash.verifier import evaluate_in_process

    task = task_of("double")
    for encoding in ("utf-8", "UTF8", "latin-1", "ascii", "utf_16", "utf-32"):
        source = program(task, f"y = str(b'', {encoding!r})\nreturn x * 2")
        ours, original = verifier.evaluate(task, source), evaluate_in_process(task, source)
        assert (ours.status, ours.tests_passed) == (original.status, original.tests_passed) == ("passed", 3)
    for encoding in ("cp1252", "idna", "koi8_r", "rot13"):
        assert verifier.evaluate(task, program(task, f"y = str(b'', {encoding!r})\nreturn x * 2")).status == "invalid"


@pytest.mark.slow
def test_an_interrupted_batch_leaks_no_descriptor():
    task = task_of("double")
    slow = program(task, "return len([a for a in str(10 ** 4000) for b in str(10 ** 4000)])")
    before = len(os.listdir("/proc/self/fd"))
    # A launcher in the background (CI, nohup) may have set SIGINT to "ignore": restore Ctrl-C here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with Verifier(workers=2, cpu_seconds=5, wall_seconds=10) as pool:
            import threading

            timer = threading.Timer(0.5, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT))
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                pool.evaluate_many([(task, slow)] * 6)
            timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(os.listdir("/proc/self/fd")) == before
