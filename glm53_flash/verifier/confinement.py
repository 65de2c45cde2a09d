"""Kernel confinement for sandbox children: namespaces, an unprivileged uid, no capabilities,
`PR_SET_NO_NEW_PRIVS`, a seccomp filter and a private empty working directory.

Standard library and ctypes only: the worker imports this file with `-s -S` (no site-packages). Every
layer is tried independently; what the host refuses is recorded in an `Isolation` report instead of
failing, so the caller can warn once, stamp every receipt with the level reached and, when asked,
refuse to run below full isolation.

The layers, in the order the worker and its zygote apply them (worker.py calls these functions):

0. `exec_with_fixed_addresses` (worker, first): address-space randomisation off, so no verdict can
   depend on where memory happens to be (see its docstring).
1. `enter_namespaces` (worker, before any request): new network, mount, IPC, UTS and PID namespaces,
   and a new user namespace. As root the non-user namespaces come first (root needs no user
   namespace for them) and the user namespace comes after the uid drop, from the zygote; without
   root everything is created at once inside a fresh user namespace mapping only the caller's uid.
2. `prepare_zygote` (zygote = PID 1 of the new PID namespace, before any request): mounts are made
   private, a fresh procfs shows only the sandbox's own processes, an empty read-only tmpfs on /tmp
   becomes the working directory; as root, drop to uid/gid 65534 with no supplementary groups; then
   every capability is dropped and `PR_SET_DUMPABLE` is cleared.
3. `lock_down_child` (each forked child, after its rlimits): `PR_SET_NO_NEW_PRIVS` and the seccomp
   filter of `DENIED_SYSCALLS` (x86-64): no opening of files at all, no sockets, no signals to other
   processes, no ptrace or cross-process memory access, no filesystem changes, no new processes,
   sessions or namespaces, no privilege changes. Denied calls fail with EPERM (EACCES for opens);
   a syscall of another ABI (32-bit or x32) kills the process.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import os
import struct
import sys

NOBODY = 65534

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACES = {  # report name -> clone flag; the user namespace is handled apart
    "network": CLONE_NEWNET, "mount": CLONE_NEWNS, "ipc": CLONE_NEWIPC, "uts": CLONE_NEWUTS,
    "pid": CLONE_NEWPID,
}

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REC, MS_PRIVATE = 0x4000, 0x40000

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# The layers that make up "full" isolation, in report order.
LAYERS = ("unprivileged_uid", "user_namespace", "network_namespace", "mount_namespace", "pid_namespace",
          "ipc_namespace", "no_capabilities", "not_dumpable", "private_workdir", "no_new_privs", "seccomp",
          "fixed_addresses")

# ------------------------------------------------------------------------------------------------
# The seccomp filter. x86-64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
# ------------------------------------------------------------------------------------------------
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
_OPENS = {"open": 2, "creat": 85, "openat": 257, "name_to_handle_at": 303, "open_by_handle_at": 304,
          "openat2": 437}
DENIED_SYSCALLS = {
    # sockets and networking
    "socket": 41, "connect": 42, "accept": 43, "sendto": 44, "sendmsg": 46, "recvmsg": 47, "bind": 49,
    "listen": 50, "socketpair": 53, "accept4": 288, "recvmmsg": 299, "sendmmsg": 307,
    # signals to other processes (kernel-delivered SIGPROF/SIGXCPU still arrive)
    "kill": 62, "rt_sigqueueinfo": 129, "tkill": 200, "tgkill": 234, "rt_tgsigqueueinfo": 297,
    "pidfd_send_signal": 424, "pidfd_open": 434, "pidfd_getfd": 438,
    # other processes' memory
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "process_madvise": 440, "process_mrelease": 448, "migrate_pages": 256, "move_pages": 279,
    # filesystem changes
    "truncate": 76, "ftruncate": 77, "rename": 82, "mkdir": 83, "rmdir": 84, "link": 86, "unlink": 87,
    "symlink": 88, "chmod": 90, "fchmod": 91, "chown": 92, "fchown": 93, "lchown": 94, "utime": 132,
    "mknod": 133, "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197,
    "lremovexattr": 198, "fremovexattr": 199, "utimes": 235, "mkdirat": 258, "mknodat": 259,
    "fchownat": 260, "futimesat": 261, "unlinkat": 263, "renameat": 264, "linkat": 265, "symlinkat": 266,
    "fchmodat": 268, "utimensat": 280, "renameat2": 316, "fchmodat2": 452, "acct": 163, "swapon": 167,
    "swapoff": 168, "quotactl": 179, "quotactl_fd": 443, "fanotify_init": 300, "inotify_init": 253,
    "inotify_init1": 294,
    # new processes, programs, sessions and namespaces
    "clone": 56, "fork": 57, "vfork": 58, "execve": 59, "setpgid": 109, "setsid": 112, "unshare": 272,
    "setns": 308, "execveat": 322, "clone3": 435,
    # mounts and the kernel
    "pivot_root": 155, "chroot": 161, "mount": 165, "umount2": 166, "reboot": 169, "sethostname": 170,
    "setdomainname": 171, "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176,
    "kexec_load": 246, "finit_module": 313, "kexec_file_load": 320, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    "settimeofday": 164, "clock_settime": 227, "adjtimex": 159, "clock_adjtime": 305, "syslog": 103,
    "vhangup": 153, "lookup_dcookie": 212, "uselib": 134, "personality": 135,
    # privileges, limits and the filter itself
    "setuid": 105, "setgid": 106, "setreuid": 113, "setregid": 114, "setgroups": 116, "setresuid": 117,
    "setresgid": 119, "setfsuid": 122, "setfsgid": 123, "capset": 126, "prctl": 157, "setrlimit": 160,
    "prlimit64": 302, "seccomp": 317, "setitimer": 38, "rt_sigprocmask": 14,
    # scheduling and I/O priority (shared with the zygote: a change would outlive the candidate),
    # System V and POSIX IPC (segments outlive the process and escape RLIMIT_AS), ioctl, whole-disk sync
    "setpriority": 141, "sched_setparam": 142, "sched_setscheduler": 144, "sched_setaffinity": 203,
    "sched_setattr": 314, "ioprio_set": 251, "set_mempolicy": 238, "mbind": 237,
    "set_mempolicy_home_node": 450, "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64,
    "semop": 65, "semctl": 66, "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
    "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244,
    "mq_getsetattr": 245, "ioctl": 16, "sync": 162, "syncfs": 306,
    # descriptors and kernel objects made without opening a file (with fds 0-2 closed, a pipe or an
    # eventfd would take their numbers), POSIX timers (a storm of them held ~38 MB of kernel memory per
    # child, outside RLIMIT_AS), the LDT and membarrier
    "pipe": 22, "pipe2": 293, "eventfd": 284, "eventfd2": 290, "timerfd_create": 283, "epoll_create": 213,
    "epoll_create1": 291, "signalfd": 282, "signalfd4": 289, "timer_create": 222, "modify_ldt": 154,
    "membarrier": 324,
    # kernel facilities with a history of escapes
    "add_key": 248, "request_key": 249, "keyctl": 250, "perf_event_open": 298, "memfd_create": 319,
    "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "memfd_secret": 447, "landlock_create_ruleset": 444,
    "landlock_add_rule": 445, "landlock_restrict_self": 446,
}

_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_JGE_K = 0x35
_BPF_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000


# What the zygote itself still calls after it locked itself down: forking and killing children,
# its channel to the caller, and the per-child steps before each child adds its own small filter.
# The zygote's filter allows these; every child's filter denies them, so a child has them all denied.
ZYGOTE_NEEDS = ("clone", "fork", "vfork", "kill", "tkill", "tgkill", "pidfd_open", "setpgid", "prctl",
                "seccomp", "sendto", "sendmsg", "recvmsg", "setrlimit", "prlimit64", "setitimer",
                "rt_sigprocmask")
# Syscall numbers past the newest one reviewed for this list (fchmodat2, 452) are refused with ENOSYS:
# a call a newer kernel adds is denied until someone has looked at it.
NEWEST_REVIEWED = 452
# fcntl commands that make the kernel signal a process (F_SETOWN, F_SETSIG, F_SETOWN_EX, F_SETLEASE,
# F_NOTIFY), and the signals a child may not re-handle or ignore (its CPU-time limit: SIGXCPU, SIGPROF).
SIGNALLING_FCNTL = (8, 10, 15, 1024, 1026)
PROTECTED_SIGNALS = (24, 27)


def _supported_machine() -> bool:
    return sys.platform.startswith("linux") and os.uname().machine in ("x86_64", "amd64")


def seccomp_program(names=None, opens: bool = True, arguments: bool = True) -> bytes:
    """A filter as packed `struct sock_filter` instructions: deny `names` (default: every entry of
    DENIED_SYSCALLS) with EPERM; with `opens`, every way of opening a file with EACCES; with
    `arguments`, syscalls newer than NEWEST_REVIEWED (ENOSYS), the signalling fcntl commands and
    sigaction on the CPU-limit signals (EPERM). Two instructions per syscall (compare; return), so no
    jump needs more than BPF's 8 bits."""
    names = DENIED_SYSCALLS if names is None else names
    code = []

    def op(kind, k, jt=0, jf=0):
        code.append(struct.pack("=HBBI", kind, jt, jf, k))

    def deny_argument(syscall: int, argument: int, values) -> None:
        """If nr == syscall and the low 32 bits of args[argument] is one of `values`: EPERM."""
        op(_BPF_JEQ_K, syscall, jf=2 * len(values) + 2)
        op(_BPF_LD_W_ABS, 16 + 8 * argument)
        for value in values:
            op(_BPF_JEQ_K, value, jf=1)
            op(_BPF_RET_K, _RET_ERRNO | _errno.EPERM)
        op(_BPF_LD_W_ABS, 0)                                # back to seccomp_data.nr

    op(_BPF_LD_W_ABS, 4)                                    # seccomp_data.arch
    op(_BPF_JEQ_K, AUDIT_ARCH_X86_64, jt=1)
    op(_BPF_RET_K, _RET_KILL_PROCESS)                       # 32-bit ABI: no filter was written for it
    op(_BPF_LD_W_ABS, 0)                                    # seccomp_data.nr
    op(_BPF_JGE_K, X32_SYSCALL_BIT, jf=1)
    op(_BPF_RET_K, _RET_KILL_PROCESS)                       # x32 ABI
    if arguments:
        op(_BPF_JGE_K, NEWEST_REVIEWED + 1, jf=1)
        op(_BPF_RET_K, _RET_ERRNO | _errno.ENOSYS)
        deny_argument(72, 1, SIGNALLING_FCNTL)              # fcntl(fd, cmd, ...)
        deny_argument(13, 0, PROTECTED_SIGNALS)             # rt_sigaction(signum, ...)
    for number in sorted(_OPENS.values()) if opens else ():
        op(_BPF_JEQ_K, number, jf=1)
        op(_BPF_RET_K, _RET_ERRNO | _errno.EACCES)
    for number in sorted({DENIED_SYSCALLS[name] for name in names}):
        op(_BPF_JEQ_K, number, jf=1)
        op(_BPF_RET_K, _RET_ERRNO | _errno.EPERM)
    op(_BPF_RET_K, _RET_ALLOW)
    return b"".join(code)


# ------------------------------------------------------------------------------------------------
# libc
# ------------------------------------------------------------------------------------------------
_LIBC: list = []


def libc():
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def _call(name: str, *arguments) -> None:
    """Call a libc function; raise OSError with its errno when it returns -1."""
    function = getattr(libc(), name)
    if function(*arguments) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{name}: {os.strerror(number)}")


def prebound(name: str, *arguments):
    """A zero-argument caller of a libc function with its ctypes arguments built now. A forked child
    calls these: building ctypes arguments after fork writes to dozens of shared pages, and each
    write is a copy-on-write fault."""
    function = getattr(libc(), name)

    def call() -> None:
        if function(*arguments) != 0:
            number = ctypes.get_errno()
            raise OSError(number, f"{name}: {os.strerror(number)}")

    return call


def prctl(option: int, value: int = 0) -> None:
    _call("prctl", ctypes.c_int(option), ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0),
          ctypes.c_ulong(0))


def die_with_parent() -> None:
    """SIGKILL this process when the thread that forked it exits (no orphan survives)."""
    try:
        _die_with_parent_call()
    except (OSError, AttributeError):
        pass


def _pdeathsig():
    if not sys.platform.startswith("linux"):
        return lambda: None
    return prebound("prctl", ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(9), ctypes.c_ulong(0),
                    ctypes.c_ulong(0), ctypes.c_ulong(0))


def set_dumpable(flag: bool) -> bool:
    """Clear (or set) PR_SET_DUMPABLE: a non-dumpable process's /proc files belong to root and it
    cannot be ptraced by its own uid. True when it took effect."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl(PR_SET_DUMPABLE, int(flag))
        return True
    except (OSError, AttributeError):
        return False


class Isolation:
    """Which layers this worker reached; a JSON-able dict with a one-word level."""

    def __init__(self) -> None:
        self.layers: dict[str, str | bool] = {name: False for name in LAYERS}
        self.notes: list[str] = []

    def reached(self, layer: str, detail: str | bool = True) -> None:
        self.layers[layer] = detail
        self.notes = [note for note in self.notes if not note.startswith(layer + ":")]

    def refused(self, layer: str, why: str) -> None:
        self.layers[layer] = False
        self.notes.append(f"{layer}: {why}")

    def to_dict(self) -> dict:
        missing = [name for name in LAYERS if self.layers[name] is False]
        return {"level": "full" if not missing else "partial", "missing": missing,
                "layers": dict(self.layers), "notes": list(self.notes), "hash_seed": hash_seed()}


def hash_seed() -> int | None:
    """The fixed hash seed this interpreter runs with, or None when its hashes are randomised."""
    seed = os.environ.get("PYTHONHASHSEED")
    if sys.flags.ignore_environment or seed in (None, "random"):
        return None
    return int(seed)


# ------------------------------------------------------------------------------------------------
# Layer 0: a fixed address layout (the worker, first of all)
# ------------------------------------------------------------------------------------------------
ADDR_NO_RANDOMIZE = 0x0040000
_PERSONALITY_QUERY = 0xFFFFFFFF


def _personality(persona: int) -> int:
    function = libc().personality
    function.restype = ctypes.c_int
    return function(ctypes.c_ulong(persona))


def addresses_fixed() -> bool:
    """Whether this process runs with address-space randomisation off (ADDR_NO_RANDOMIZE)."""
    if not sys.platform.startswith("linux"):
        return False
    persona = _personality(_PERSONALITY_QUERY)
    return persona != -1 and bool(persona & ADDR_NO_RANDOMIZE)


def exec_with_fixed_addresses(argv: list[str]) -> str:
    """Turn address-space randomisation off and execute `argv` again in this process (the layout is
    chosen at exec). Returns only when that cannot be done, with the reason.

    Why: an object's address reaches a candidate through its text (`str` of a generator or a
    function), the hash of an identity-hashed object (so a set's order) and exception messages.
    With a fixed layout and a worker that does the same work before every fork, each child starts
    from the same memory, so those addresses, and every verdict that depends on them, are a function
    of the program (and of the interpreter build and the worker's environment), the same in every
    pool. The cost: a candidate knows where the interpreter's memory is, which matters only to an
    exploit of the interpreter itself, and the kernel layers confine the child all the same."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    persona = _personality(_PERSONALITY_QUERY)
    if persona == -1 or _personality(persona | ADDR_NO_RANDOMIZE) == -1:
        return f"the kernel refused personality(ADDR_NO_RANDOMIZE) ({os.strerror(ctypes.get_errno())})"
    if not addresses_fixed():
        return "personality(ADDR_NO_RANDOMIZE) did not take effect"
    try:
        os.execv(sys.executable, argv)
    except OSError as exc:
        return f"could not execute {sys.executable} again ({exc.strerror})"
    return "exec returned"  # not reached


# ------------------------------------------------------------------------------------------------
# Layer 1: namespaces (the worker, before it forks the zygote)
# ------------------------------------------------------------------------------------------------
def _unshare(flags: int) -> None:
    _call("unshare", ctypes.c_int(flags))


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _enter_user_namespace(uid: int, gid: int) -> None:
    """unshare(CLONE_NEWUSER) and map only this process's own uid and gid (no root inside)."""
    _unshare(CLONE_NEWUSER)
    try:
        _write("/proc/self/setgroups", "deny")
    except FileNotFoundError:  # kernels before 3.19
        pass
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")


def enter_namespaces(report: Isolation, enabled: bool = True) -> None:
    """Give this process's future children new namespaces; record what the kernel allowed.

    As root: network, mount, IPC, UTS and PID namespaces directly (the user namespace follows in the
    zygote, after the uid drop). Otherwise: a user namespace first (mapping only our own uid), then
    the others inside it.
    """
    if not enabled or not sys.platform.startswith("linux"):
        why = "disabled" if not enabled else "not Linux"
        report.refused("user_namespace", why)
        for name in NAMESPACES:
            if name != "uts":
                report.refused(f"{name}_namespace", why)
        return
    if os.geteuid() != 0:
        try:
            _enter_user_namespace(os.geteuid(), os.getegid())
            report.reached("user_namespace", f"own uid {os.geteuid()} mapped")
        except OSError as exc:
            report.refused("user_namespace", f"the kernel refused it ({exc.strerror})")
            for name in NAMESPACES:
                if name != "uts":
                    report.refused(f"{name}_namespace", "needs a user namespace without root")
            return
    try:
        _unshare(sum(NAMESPACES.values()))
        for name in NAMESPACES:
            if name != "uts":
                report.reached(f"{name}_namespace")
        return
    except OSError:
        pass
    for name, flag in NAMESPACES.items():  # one at a time: keep whatever the host allows
        try:
            _unshare(flag)
            if name != "uts":
                report.reached(f"{name}_namespace")
        except OSError as exc:
            if name != "uts":
                report.refused(f"{name}_namespace", f"the kernel refused it ({exc.strerror})")


# ------------------------------------------------------------------------------------------------
# Layer 2: the zygote (PID 1 of the new PID namespace) prepares the state every child inherits
# ------------------------------------------------------------------------------------------------
def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _call("mount", _bytes(source), _bytes(target), _bytes(fstype), ctypes.c_ulong(flags), _bytes(data))


def prepare_zygote(report: Isolation, fallback_workdir: str) -> None:
    """Mounts, working directory, uid, capabilities, dumpable flag: everything the children inherit."""
    linux = sys.platform.startswith("linux")
    if report.layers["mount_namespace"]:
        try:
            _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount reaches the host
            if report.layers["pid_namespace"]:
                try:
                    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                except OSError as exc:
                    report.notes.append(f"procfs of the PID namespace not mounted ({exc.strerror})")
            _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=0555")
            os.chdir("/tmp")
            report.reached("private_workdir", "empty read-only tmpfs")
        except OSError as exc:
            report.notes.append(f"no private mount ({exc.strerror}); using an empty temporary directory")
    if not report.layers["private_workdir"]:
        try:
            os.chdir(fallback_workdir)
            if not os.listdir("."):
                report.reached("private_workdir", "empty temporary directory")
        except OSError as exc:
            report.refused("private_workdir", f"cannot enter {fallback_workdir} ({exc.strerror})")
    if linux and os.geteuid() == 0:
        try:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            report.reached("unprivileged_uid", f"root dropped to {NOBODY}")
        except OSError as exc:
            report.refused("unprivileged_uid", f"could not drop root ({exc.strerror})")
        else:
            # A uid change cleared the dumpable flag, which makes /proc/self/uid_map root's: set
            # it back for the map, clear it again below.
            set_dumpable(True)
            try:
                _enter_user_namespace(NOBODY, NOBODY)
                report.reached("user_namespace", f"uid {NOBODY} mapped")
            except OSError as exc:
                report.refused("user_namespace", f"the kernel refused it ({exc.strerror})")
    elif linux:
        report.reached("unprivileged_uid", f"not root (uid {os.geteuid()})")
    else:
        report.refused("unprivileged_uid", "not Linux")
    if linux:
        _drop_capabilities(report)
    if set_dumpable(False):
        report.reached("not_dumpable")
    else:
        report.refused("not_dumpable", "prctl(PR_SET_DUMPABLE) failed")


def _drop_capabilities(report: Isolation) -> None:
    for capability in range(64):  # the bounding set first: needs CAP_SETPCAP, which we still hold
        try:
            prctl(PR_CAPBSET_DROP, capability)
        except OSError as exc:
            if exc.errno == _errno.EINVAL:  # past the last capability this kernel knows
                break
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all zero
    try:
        _call("capset", ctypes.byref(header), ctypes.byref(data))
        effective = _status_field("CapEff")
        if effective is not None and int(effective, 16) != 0:
            report.refused("no_capabilities", f"CapEff still {effective}")
        else:
            report.reached("no_capabilities")
    except OSError as exc:
        report.refused("no_capabilities", f"capset failed ({exc.strerror})")


def _status_field(name: str) -> str | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(name + ":"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


# ------------------------------------------------------------------------------------------------
# Layer 3: each child, last step before it reads its request
# ------------------------------------------------------------------------------------------------
class _Filter:
    """A filter program kept in memory for `prctl(PR_SET_SECCOMP)`."""

    def __init__(self, program: bytes) -> None:
        self._instructions = ctypes.create_string_buffer(program, len(program))
        # struct sock_fprog { unsigned short len; struct sock_filter *filter; }
        header = struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(self._instructions))
        self._header = ctypes.create_string_buffer(header, len(header))

        self.install = prebound("prctl", ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER),
                                ctypes.c_void_p(ctypes.addressof(self._header)), ctypes.c_ulong(0),
                                ctypes.c_ulong(0))


class ChildLock:
    """The seccomp layer, in two filters. The zygote installs the large one once (`lock_zygote`):
    everything in DENIED_SYSCALLS except ZYGOTE_NEEDS, and every open. Each child adds a small one
    (`apply`) that denies ZYGOTE_NEEDS. Filters stack, so a child has every listed syscall denied, and
    a fork costs the kernel a 40-instruction filter instead of a 300-instruction one."""

    def __init__(self, enabled: bool = True) -> None:
        self.available = enabled and _supported_machine()
        self.reason = "" if self.available else (
            "disabled" if not enabled else f"no filter for {os.uname().machine} on {sys.platform}")
        if self.available:
            zygote_denies = [name for name in DENIED_SYSCALLS if name not in ZYGOTE_NEEDS]
            self._zygote_filter = _Filter(seccomp_program(zygote_denies, opens=True, arguments=True))
            self._child_filter = _Filter(seccomp_program(ZYGOTE_NEEDS, opens=False, arguments=False))
            self.apply = self._child_filter.install  # prebound: the child's one call

    def probe(self, report: Isolation) -> None:
        """Check, in a throwaway child, that the kernel accepts both filters and that they act;
        then lock the zygote itself. Records the outcome either way."""
        if not self.available:
            report.refused("no_new_privs", self.reason)
            report.refused("seccomp", self.reason)
            return
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                self.lock_zygote()
                self.apply()
                for attempt in (lambda: os.open("/", os.O_RDONLY), os.fork, lambda: os.kill(os.getppid(), 0)):
                    try:
                        attempt()
                        code = 3  # the filter is not in force
                    except PermissionError:
                        pass
            except OSError as exc:
                code = 4 if exc.errno == _errno.EINVAL else 5
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            try:
                self.lock_zygote()
            except OSError as exc:
                code = 6
                why = f"the zygote could not install its filter ({exc.strerror})"
        if code == 0:
            report.reached("no_new_privs")
            report.reached("seccomp", f"{len(DENIED_SYSCALLS) + len(_OPENS)} syscalls denied")
            return
        if code != 6:
            why = {3: "the filter loaded but did not act", 4: "the kernel has no seccomp filters"}.get(
                code, f"the probe ended with status {code}")
        self.available = False
        report.refused("seccomp", why)
        report.refused("no_new_privs", "not set without the filter")

    def lock_zygote(self) -> None:
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        self._zygote_filter.install()



_die_with_parent_call = _pdeathsig()  # built at import, in the worker, so children only call it
