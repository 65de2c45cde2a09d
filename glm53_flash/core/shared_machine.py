"""Running beside other work on a shared CPU: everything glm53 does about it, in one place.

Three mechanisms, none of which changes a result unless the user asks:
- `short_spin_waits` (every glm53 command, before torch loads): where other processes already use
  BUSY_CORES or more, idle math-library threads sleep after SPIN_COUNT spins instead of libgomp's default.
  Each thread does the same work either way, so results are bit-identical.
- `BusyHint` and `ShortSpinRestart` (pretrain, rl, reproduce started from the command line): a run that
  started quiet and finds the machine busy says how to get its speed back, or, where `restart_pays`,
  ends like Ctrl-C and `restart_with_short_spins` starts the same command line again, resuming from the
  last checkpoint with short spins (bit-identical results).
- `ThreadGovernor` (`--adapt-threads`, off by default): the thread count follows the free cores; this
  changes the last bits of sums, and metrics rows record the count.

Receipts record what was done (`spin_waits()`). Measurements behind the constants: docs/BENCHMARKS.md
(`glm53 bench contention`).
"""

from __future__ import annotations

# Spins a waiting OpenMP thread makes before it sleeps when the machine is busy: libgomp's own count for
# when threads outnumber the CPUs (its default is 300,000 otherwise).
SPIN_COUNT = 1000
BUSY_SAMPLE_SECONDS = 0.1  # how long a glm53 command looks at the machine's load before torch loads
BUSY_CORES = 0.5  # other processes using this many cores' worth of CPU make the machine busy
_spin_waits: str | None = None  # what short_spin_waits did in this process (receipts record it)
_spin_choice: str | None = None  # its choice: "on", "off", or "kept" (the user's setting, a loaded runtime, no load)


def _openmp_loaded() -> bool:
    """Whether an OpenMP runtime is already in this process (it read its environment when it loaded)."""
    import sys

    try:
        with open("/proc/self/maps") as handle:
            return any("libgomp" in line or "libomp" in line or "libiomp" in line for line in handle)
    except OSError:
        return "torch" in sys.modules


def busy_cores_elsewhere(seconds: float = BUSY_SAMPLE_SECONDS) -> float | None:
    """Cores' worth of CPU other processes use, over `seconds` (None where /proc/stat cannot be read)."""
    import time

    watch = LoadWatch()
    time.sleep(seconds)
    return watch.others()


def short_spin_waits(environ=None, busy: float | None | str = "measure") -> str:
    """On a machine other processes are using, let the math library's idle threads sleep after SPIN_COUNT
    spins instead of libgomp's 300,000, by setting GOMP_SPINCOUNT before torch loads libgomp (every glm53
    command does this first; `busy` is what busy_cores_elsewhere measured, taken here unless given).

    torch, MKL and our C kernels share one libgomp pool; between two parallel regions a finished thread
    spins, and when another process holds a core the spinning thread keeps its partner waiting. On a quiet
    machine short spins cost a little (threads fall asleep between regions), so a quiet start keeps
    libgomp's default. Either way each thread does the same work: the results are the same bit for bit.
    A count the user set (GOMP_SPINCOUNT, or a wait policy in OMP_WAIT_POLICY) is kept, and nothing is set
    where an OpenMP runtime is already loaded (library use after `import torch`: too late to matter).
    Returns what was done."""
    import os

    global _spin_waits, _spin_choice
    environ = os.environ if environ is None else environ
    _spin_choice = "kept"
    restarted = environ.pop(RESTART_ENV, None)  # this process is a run's restart (ShortSpinRestart): say why
    if restarted is not None and environ.get("GOMP_SPINCOUNT") == str(SPIN_COUNT):
        _spin_choice = "on"
        _spin_waits = f"on (GOMP_SPINCOUNT={SPIN_COUNT}: restarted when {restarted})"
    elif "GOMP_SPINCOUNT" in environ:
        _spin_waits = f"left alone (GOMP_SPINCOUNT={environ['GOMP_SPINCOUNT']} set before glm53 started)"
    elif "OMP_WAIT_POLICY" in environ:
        _spin_waits = f"left alone (OMP_WAIT_POLICY={environ['OMP_WAIT_POLICY']} set before glm53 started)"
    elif _openmp_loaded():
        _spin_waits = "left alone (an OpenMP runtime was already loaded)"
    else:
        busy = busy_cores_elsewhere() if busy == "measure" else busy
        if busy is None:
            _spin_waits = "left alone (the machine's load cannot be read)"
        elif busy >= BUSY_CORES:
            environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
            _spin_choice = "on"
            _spin_waits = f"on (GOMP_SPINCOUNT={SPIN_COUNT}: other processes used {busy:.2f} cores at the start)"
        else:
            _spin_choice = "off"
            _spin_waits = f"off (other processes used {busy:.2f} cores at the start: libgomp's default spins)"
    return _spin_waits


_busy_hint_given = False


class BusyHint:
    """Watches the load after each step of a run that started on a quiet machine (libgomp's long spins)
    with a fixed thread count, and says once per process, when other processes have used BUSY_CORES or
    more over `steps` steps in a row (or over one step that ran many times as long as those before it),
    how to get the speed back without changing the results."""

    MESSAGE = ("glm53: other processes are using {busy:.1f} cores of this machine; while they do, the math "
               "threads' long spin waits can make each step many times slower. Resuming or rerunning with "
               "GOMP_SPINCOUNT=1000 in the environment computes the same results bit for bit, only faster "
               "beside the other work (--adapt-threads follows the free cores, but changes the last bits).")

    def __init__(self, steps: int = 2) -> None:
        self.steps, self.streak, self.load, self.busy = steps, 0, LoadWatch(), None

    @staticmethod
    def wanted() -> bool:
        """Only where a glm53 command found the machine quiet and kept libgomp's default spins."""
        return _spin_choice == "off" and not _busy_hint_given

    def after_step(self, slow: bool = False) -> str | None:
        """The hint, the first time the load calls for it (then None for the rest of the process): `steps`
        busy steps in a row, or one that was also `slow` (the caller's judgement: many times the steps
        before it). `busy` keeps the last reading, `streak` the busy steps in a row."""
        global _busy_hint_given
        self.busy = busy = self.load.others()
        self.streak = self.streak + 1 if busy is not None and busy >= BUSY_CORES else 0
        if not (self.streak >= self.steps or (self.streak and slow)) or _busy_hint_given:
            return None
        _busy_hint_given = True
        return self.MESSAGE.format(busy=busy)


# A run that started quiet and finds the machine busy can instead start again with short spin waits: the
# glm53 command ends it the way Ctrl-C does (receipt marked interrupted, checkpoints kept) and executes
# itself again with GOMP_SPINCOUNT set, resuming from the last checkpoint. An exact resume and the same
# arithmetic give the same results bit for bit; only the steps since that checkpoint are done twice.
RESTART_COMMANDS = ("pretrain", "rl", "reproduce")  # commands that resume when started again (--resume for two)
RESTART_ENV = "GLM53_SPIN_RESTART"  # set for the restarted process: why it restarted (receipts say so)
# What restart_pays estimates with: the slowdown of a step beside one busy core with short spins (rounded up
# from `glm53 bench contention --spin-counts`), and an assumed cost of a restart (a new process importing
# torch, loading the checkpoint, warming up), on the safe side.
SHORT_SPIN_BUSY_SLOWDOWN = 2.0
RESTART_SECONDS = 20.0
RESTART_MIN_SAVING = 60.0  # seconds a restart must save, besides at least half of going on
_restart_allowed = False


class ShortSpinRestart(KeyboardInterrupt):
    """Ends a run the way Ctrl-C does (every `interruptible` block marks its receipt interrupted; the
    checkpoints stay) so that the glm53 command starts again with short spin waits and resumes it (cli).
    A KeyboardInterrupt so that every layer that already ends cleanly on Ctrl-C does so here too."""

    def __init__(self, reason: str, resume_from: int) -> None:
        super().__init__(reason)
        self.reason, self.resume_from = reason, resume_from


def allow_restart(allowed: bool) -> None:
    """Whether runs of this process may end with ShortSpinRestart (the CLI allows it for its own command
    line's RESTART_COMMANDS in one process; library use and torchrun never)."""
    global _restart_allowed
    _restart_allowed = allowed


def restart_allowed() -> bool:
    return _restart_allowed


def restart_pays(remaining: int, busy_seconds: float, quiet_seconds: float, redo: int) -> bool:
    """Whether a restart beats going on beside the load: going on costs `remaining` positions at
    `busy_seconds` each (what the last busy steps took); a restart costs RESTART_SECONDS, then the `redo`
    positions since the last checkpoint and the remaining ones at SHORT_SPIN_BUSY_SLOWDOWN x
    `quiet_seconds` (what a position took before the load). It must save RESTART_MIN_SAVING seconds and
    half of going on (a load that goes away soon leaves the restart's cost unpaid)."""
    going_on = remaining * busy_seconds
    restart = RESTART_SECONDS + (redo + remaining) * SHORT_SPIN_BUSY_SLOWDOWN * quiet_seconds
    saving = going_on - restart
    return saving >= RESTART_MIN_SAVING and saving >= going_on / 2


def spin_waits() -> str | None:
    """What short_spin_waits did in this process, or None when nothing called it (library use)."""
    return _spin_waits



def cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat, or None where it cannot be read."""
    try:
        with open("/proc/stat") as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    idle = values[3] + values[4]
    return float(sum(values) - idle), float(sum(values))


class LoadWatch:
    """How much CPU processes other than this one use, in cores' worth, between one call and the next
    (from /proc/stat, less this process's own CPU time): what the governor, the busy hint and the start's
    spin choice read."""

    def __init__(self, cores: int | None = None) -> None:
        self.cores = cores or usable_cores()
        self._mark = self._sample()

    @staticmethod
    def _sample() -> tuple:
        import time

        return cpu_times(), time.process_time(), time.monotonic()

    def others(self) -> float | None:
        """Cores' worth of CPU the other processes used since the last call (None: unknown)."""
        (machine, mine, wall), (machine_before, mine_before, wall_before) = current, _ = self._sample(), self._mark
        self._mark = current
        if machine is None or machine_before is None:
            return None
        busy, total = machine[0] - machine_before[0], machine[1] - machine_before[1]
        elapsed = wall - wall_before
        if total <= 0 or elapsed <= 0:
            return None
        return max(0.0, busy / total * self.cores - (mine - mine_before) / elapsed)


def usable_cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def governed(enabled: bool, device):
    """A ThreadGovernor for a stage on `device` when `enabled` and on the CPU, else None; as a context
    manager, it hands the starting thread count back when the stage ends (`--adapt-threads`)."""
    import contextlib

    import torch

    if not enabled or torch.device(device).type != "cpu":
        return contextlib.nullcontext()
    return ThreadGovernor()


class ThreadGovernor:
    """Math-library threads that follow the free cores (`--adapt-threads`). After each step the governor
    reads how busy the machine was during it (/proc/stat) less this process's own share (its CPU time),
    and sets the thread count to the cores the others left free, between 1 and the count it started with
    (a step whose threads outnumber the free cores stalls whenever one is descheduled).

    Off by default: the thread count changes the last bits of the math library's sums, so a run that
    adapts is not bit-identical to one that did not (its metrics rows record `threads`). Used as a
    context manager (or with `restore()`), it hands the starting count back when the stage ends."""

    def __init__(self, most: int | None = None) -> None:
        import torch

        self.torch = torch
        self.load = LoadWatch()
        self.most = max(1, most or torch.get_num_threads())
        self.threads = self.initial = torch.get_num_threads()
        self.changes = 0

    @property
    def cores(self) -> int:
        return self.load.cores

    def others(self) -> float | None:
        """Cores' worth of CPU the other processes used since the last call (None: unknown)."""
        return self.load.others()

    def restore(self) -> None:
        """The thread count the governor started with, back (a stage after it starts where this one did)."""
        if self.torch.get_num_threads() != self.initial:
            self.torch.set_num_threads(self.initial)
        self.threads = self.initial

    def __enter__(self) -> "ThreadGovernor":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def after_step(self) -> int:
        """Set the thread count for the next step; returns it."""
        others = self.others()
        if others is not None:
            target = max(1, min(self.most, round(self.cores - others)))
            if target != self.threads:
                self.torch.set_num_threads(target)
                self.threads = target
                self.changes += 1
        return self.threads


def restart_with_short_spins(command: str, argv: list[str], takes_resume: bool, restart: ShortSpinRestart) -> int:
    """Start the command line `argv` of glm53 `command` again in this process's place with
    GOMP_SPINCOUNT=SPIN_COUNT: the run resumes from its last checkpoint (`--resume` added where the command
    takes it; `reproduce` resumes by itself) and computes the same results bit for bit. Returns 130 only if
    the new program cannot start."""
    import os
    import sys

    argv = list(argv)
    if takes_resume and "--resume" not in argv:
        argv.append("--resume")
    print(f"glm53 {command}: {restart.reason}; starting again with short spin waits "
          f"(GOMP_SPINCOUNT={SPIN_COUNT}) from the checkpoint at {restart.resume_from}: the same results, "
          f"bit for bit", file=sys.stderr, flush=True)
    sys.stdout.flush()
    environ = dict(os.environ, GOMP_SPINCOUNT=str(SPIN_COUNT), **{RESTART_ENV: restart.reason})
    try:
        os.execve(sys.executable, [sys.executable, "-m", "glm53_flash.cli", *argv], environ)
    except OSError as error:
        print(f"glm53 {command}: could not start again ({error}); resume the run with GOMP_SPINCOUNT="
              f"{SPIN_COUNT} in the environment", file=sys.stderr)
    return 130
