"""Run directories: one writer at a time, the same config or no resume, and an honest end.

- **Lock.** `RunLock` holds `fcntl.flock` on `DIR/.lock` while a run writes `DIR`; a second writer
  is refused with one line naming the holder's pid. flock rather than an O_EXCL pid file: the
  kernel drops the lock when its holder dies, however it dies (SIGKILL, out of memory), so a stale
  lock file from a dead process is simply taken over, with no pid-liveness guess (pids are reused).
  The pid written into the file is only there for the message. The holder deletes the file when it
  releases the lock; a process that locked a file in the meantime deleted finds that the path no
  longer names its file and tries again, so two writers never both hold "the" lock.
- **Resume check.** `check_resume_config` compares the config a run was started with (run.json)
  with the one it is resumed with, and names every field that differs.
- **Finished runs.** Resuming a run with nothing left to do returns its `complete` receipt as it is
  (`finished_receipt`): the receipt keeps the provenance and peak memory of the process that
  trained, not of the one that found it done.
- **Interrupts.** Inside `interruptible`, SIGTERM raises `Terminated` (a KeyboardInterrupt) like
  Ctrl-C does; the run's `on_interrupt` marks its receipt `interrupted` and the command that
  resumes it is printed on stderr before the exception goes on (the CLI exits with 130).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import shlex
import signal
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from glm53_flash.core.receipts import UnsafeFileError, read_json
from glm53_flash.core.shared_machine import ShortSpinRestart

LOCK_FILE = ".lock"


class RunInUse(ValueError):
    """Another live process holds the run directory's lock."""


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM (handled like Ctrl-C)."""


class RunLock:
    """Exclusive lock of a run directory (created when missing) for as long as it is held."""

    def __init__(self, directory: str | Path, flag: str = "--output") -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self.flag = flag
        self.fd: int | None = None
        self.created = False

    def acquire(self) -> RunLock:
        if not self.directory.exists():
            self.directory.mkdir(parents=True, exist_ok=True)
            self.created = True
        while True:
            # O_CLOEXEC: a program this process executes does not inherit the lock (a forked child
            # that does not exec, such as a verifier worker, shares it until it exits). O_NOFOLLOW and
            # a regular file only: the lock file is truncated and written, never through a link.
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            except OSError as error:
                if error.errno != errno.ELOOP:
                    raise
                raise UnsafeFileError(f"{self.path} is a symbolic link; a run's lock file must be a regular "
                                      "file") from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise UnsafeFileError(f"{self.path} is not a regular file; a run's lock file must be one")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                holder = _read_pid(fd)
                os.close(fd)
                if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                self._forget_created()
                who = f"pid {holder}" if holder else "another process"
                raise RunInUse(f"{self.directory} is in use by another run ({who}); wait for it to end or "
                               f"choose another {self.flag}") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the previous holder deleted the file between our open and flock
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self.fd = fd
            return self

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # while still holding the lock (see the module's note)
        os.close(self.fd)
        self.fd = None
        self._forget_created()

    def _forget_created(self) -> None:
        """A directory this lock created and nothing else filled goes again (a refused run leaves
        no trace)."""
        if self.created:
            with contextlib.suppress(OSError):
                self.directory.rmdir()
            self.created = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def holds_a_run(directory: str | Path) -> bool:
    """True when `directory` has anything in it besides a lock file."""
    directory = Path(directory)
    return directory.exists() and any(p.name != LOCK_FILE for p in directory.iterdir())


# ----------------------------------------------------------------------------------- resume


def check_resume_config(out: str | Path, recorded: dict, current: dict, defaults: dict | None = None,
                        allowed: tuple[str, ...] = ()) -> None:
    """Refuse (one line) to resume `out` with a config that differs from the one it started with.
    A field missing from an older run record counts as its default; `allowed` fields may differ."""
    defaults = defaults or {}
    differing = sorted(k for k, v in current.items()
                       if k not in allowed and (k in recorded or k in defaults)
                       and recorded.get(k, defaults.get(k)) != v)
    if differing:
        values = "; ".join(f"{_flag(k, recorded.get(k, defaults.get(k)))} there, {_flag(k, current[k])} here"
                           for k in differing)
        raise ValueError(f"--resume: {out} was started with different {', '.join(differing)} ({values}); "
                         "leave the flag out to continue with the run's own, or choose a new --output")


def _flag(name: str, value) -> str:
    """A config field's value as the command line spells it."""
    if isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
    return f"--{name.replace('_', '-')} {value}"


class AlreadyFinished(Exception):
    """Raised by a run resumed with nothing left to do, out of its training block, carrying the
    receipt it returns unchanged."""

    def __init__(self, receipt: dict):
        super().__init__("the run was already finished")
        self.receipt = receipt


def finished_receipt(path: str | Path, length: tuple[str, int] | None = None,
                     checkpoints: list[dict] | None = None) -> dict | None:
    """The receipt at `path` when it records this run finished, else None (missing, unreadable, not
    `complete`, or stale: the caller trains and writes a new one). With `length` (field, value), the
    receipt must record that run length (`steps` or `groups`); with `checkpoints` (the run's entries,
    those saved with `weights_sha256`), its last checkpoint must be the newest saved one. A receipt
    left `complete` from before an extension killed after its new checkpoint is thus not finished."""
    try:
        receipt = read_json(path)
    except (OSError, ValueError):
        return None
    if not isinstance(receipt, dict) or receipt.get("status") != "complete":
        return None
    if length is not None and receipt.get(length[0]) != length[1]:
        return None
    if checkpoints is not None:
        newest = [c["weights_sha256"] for c in checkpoints if c["weights_sha256"] is not None][-1:] or [None]
        last = (receipt.get("checkpoints") or [{}])[-1]
        if not isinstance(last, dict) or last.get("weights_sha256") != newest[0]:
            return None
    return receipt


def config_defaults(config_type) -> dict:
    """The defaults of a config dataclass's fields (those that have one), JSON-shaped."""
    defaults = {}
    for field in dataclasses.fields(config_type):
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            continue
        defaults[field.name] = list(value) if isinstance(value, tuple) else value
    return defaults


def command_prefix(command: str) -> list[str]:
    """How this process was launched, for a printed command: `glm53 CMD`, or the torchrun form."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        return ["torchrun", f"--nproc_per_node={world}", "-m", "glm53_flash.cli", command]
    return ["glm53", command]


def redo_note(done: int, saved: int | None, unit: str = "step") -> str | None:
    """What a resumed run repeats: the units after the last checkpoint (`saved`) up to `done`."""
    saved = 0 if saved is None else saved
    if done <= saved:
        return None
    span = f"{unit} {done}" if done == saved + 1 else f"{unit}s {saved + 1}-{done}"
    return f"(the last checkpoint is at {unit} {saved}: the resumed run trains {span} again)"


def resume_command(command: str, config, skip: tuple[str, ...] = ("resume",), extra: list[str] = ()) -> str:
    """The command line that continues `config`'s run: every flag whose value differs from its
    default, then `extra` (for example `--resume`)."""
    from glm53_flash.core.options import cli_fields, flag_name

    words = command_prefix(command)
    for field in cli_fields(type(config)):
        if field.name in skip:
            continue
        value = getattr(config, field.name)
        default = field.default if field.default is not dataclasses.MISSING else None
        if value == default or value is None:
            continue
        if isinstance(value, bool):
            words.append(flag_name(field) if value else "--no-" + field.name.replace("_", "-"))
        elif isinstance(value, tuple):
            words += [flag_name(field), ",".join(map(str, value)) if value else ""]
        else:
            words += [flag_name(field), str(value)]
    return shlex.join([*words, *extra])


# ----------------------------------------------------------------------------------- interrupts


def _raise_terminated(signum, frame):
    raise Terminated(f"signal {signum}")


@contextlib.contextmanager
def interruptible(on_interrupt: Callable[[], None], resume_hint: str, announce: bool = True,
                  redo: Callable[[], str | None] | None = None):
    """Ctrl-C and SIGTERM end the block the same way: `on_interrupt()` (mark the receipt), then
    "interrupted; resume with: ..." on stderr (and `redo()`, what the resumed run will do again: the
    work since the last checkpoint), then the KeyboardInterrupt goes on. A ShortSpinRestart ends it the
    same way without the announcement: the command restarts and resumes by itself."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main else None
    try:
        yield
    except KeyboardInterrupt as interrupt:
        if main:  # a second signal while the receipt is written must not cut it in half
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            on_interrupt()
        finally:
            if main:
                signal.signal(signal.SIGINT, previous_int)
            if announce and not isinstance(interrupt, ShortSpinRestart):  # the command says it resumes itself
                print(f"interrupted; resume with: {resume_hint}", file=sys.stderr, flush=True)
                note = redo() if redo is not None else None
                if note:
                    print(note, file=sys.stderr, flush=True)
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


__all__ = ["LOCK_FILE", "AlreadyFinished", "RunInUse", "RunLock", "Terminated", "check_resume_config",
           "command_prefix", "config_defaults", "finished_receipt", "holds_a_run", "interruptible",
           "redo_note", "resume_command"]
