"""One party process: load keys and data, run the role function, write the run folder.

This is what ``fedhet party FILE --name N`` runs, on its own machine or as a
child of ``fedhet run``; :class:`PartyRun` is one party's part of it, which a host
process (:mod:`fedhet.parties.host`) runs for many parties at once, one thread each.  Its part of the run directory::

    RUN_DIR/config.json                    the resolved federation (public keys only)
    RUN_DIR/parties/N/log.txt              the party's log
    RUN_DIR/parties/N/transcript.jsonl     hash-chained, head signed (Ed25519)
    RUN_DIR/parties/N/metrics.jsonl        one line per metric() call
    RUN_DIR/parties/N/status.json          progress, rewritten atomically
    RUN_DIR/parties/N/result.json          final metrics, traffic, wall time (atomic)
    RUN_DIR/parties/N/error.json           instead of result.json when it failed: the failure record
                                           (fedhet.parties.failure: cause, culprit, evidence)
    RUN_DIR/parties/N/.lock                held while the party runs: a second start is refused
    RUN_DIR/parties/N/transcript.K.jsonl   an earlier start's transcript, kept (never overwritten)
    RUN_DIR/parties/N/private/             SECRET, never for an auditor: checkpoints/step-K.ckpt
                                           (fedhet.parties.checkpoint), the newest two

On ``--resume`` the party goes on in the same folder: its transcript continues the earlier one's
chain (a ``resume`` record, then the agreed step's ``restore`` record), and the role restarts
from the newest checkpoint every party holds.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from . import runfolder as rf
from . import failure
from . import keys as keyfiles
from .api import PartyAborted
from .checkpoint import Checkpoints, private_dir
from .faults import kill_hook, pause_hook
from .atomic import write_json_atomic
from .status import StatusFile
from .runfolder import party_dir
from .contract import Algorithm, prepare
from .identity import PartyIdentity
from .federation import Federation, check_keys_present
from .progress import LOG_LEVELS, LinePrinter
from .model_store import write_part
from .netlink import describe as describe_network, parse_network
from .role import run_role, trained_part
from .transcript import Transcript, chain_prefix

if TYPE_CHECKING:  # the transport imports zmq; only a running party needs it
    from .zmq_transport import ZmqParty


LAUNCHER_PID_ENV = "FEDHET_LAUNCHER_PID"  # set by `fedhet run` for the parties it starts


# A failed party gives queued messages this long to leave before it exits (not the whole timeout).
FAILED_LINGER_S = 2.0
# ... and its failure notice to a peer it never reached this long: a peer started by hand seconds later
# (a loaded machine) gets the notice instead of waiting out its timeout.
UNREACHED_LINGER_S = 20.0

# ``[federation] peer_lost_s`` is when a party that lost a peer has exited, not when it starts to:
# its waits give up this much earlier (a quarter of peer_lost_s at most), the time its own records,
# the notice to the others and the exit take, on a loaded machine too.
EXIT_RESERVE_S = 2.0


def _quietly(step) -> None:
    """One step of a failed party's exit: its own failure must not hide the one being reported."""
    try:
        step()
    except Exception:
        pass


def give_up_after(fed: Federation) -> float:
    """Seconds a peer's broken connection may stay down before this party's waits on it give up:
    ``peer_lost_s`` less the exit reserve, never longer than the federation's timeout, never shorter
    than ``restart_grace_s`` (a peer restarting within the grace is waited for)."""
    lost = fed.peer_lost_s - min(EXIT_RESERVE_S, fed.peer_lost_s / 4)
    return max(min(lost, fed.timeout), fed.restart_grace_s)


def exit_now(code: int) -> None:
    """End a party or host process whose records are written and transport closed: flush the log
    and the console, then exit without the interpreter's teardown (a party's heap of transcripts
    and tensors takes a second or more to free, which ``peer_lost_s`` does not allow for); its pool
    workers follow it (they watch their parent)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:   # a closed console must not change the exit code
            pass
    os._exit(code)


def die_with_launcher(report=None) -> None:
    """Under ``fedhet run``, end this party when the launcher dies, even by SIGKILL.

    The parties run in their own sessions (so a terminal's Ctrl-C reaches only
    the launcher, which then stops them in order); without this, a killed
    launcher would leave them running.  A watcher thread on the launcher's pid
    writes the "stopped" record (``report``) and exits at once, whatever the main
    thread is doing; PR_SET_PDEATHSIG (Linux) is the backstop.
    """
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if not launcher or not sys.platform.startswith("linux"):
        return
    if report is not None and str(os.getppid()) == launcher:
        from fedhet.crypto.pool import on_parent_exit

        on_parent_exit(int(launcher), lambda: report("the launcher is gone"), code=143)
        try:  # the watcher replaces the parent-death signal: one record, written by it
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, 0)  # 1 = PR_SET_PDEATHSIG, 0 = none
        except Exception:
            pass
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except Exception:  # no prctl: best effort only
        return
    if str(os.getppid()) != launcher:  # it died before the line above took effect
        os.kill(os.getpid(), signal.SIGTERM)


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` is alive."""
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


# ---------------------------------------------------------------- file limits
# Every TCP connection to a party costs it a file descriptor, so an outsider with
# no key can open idle connections until the party cannot open its own files.


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the soft limit now in force."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def _out_of_descriptors(e: OSError) -> bool:
    return e.errno in (errno.EMFILE, errno.ENFILE)


class PartyRunning(RuntimeError):
    """This party already runs in this run folder (another process holds its lock)."""


class NothingToResume(RuntimeError):
    """``--resume`` in a party folder with no earlier start in it."""


def lock_party_dir(pdir: Path, name: str) -> int:
    """Hold ``pdir/.lock`` for the life of the process (an flock: the OS drops it when the process
    dies, however it dies).  A second start of the same party in the same folder is refused here,
    before it touches any file of the first."""
    fd = os.open(pdir / rf.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        finally:
            os.close(fd)
        raise PartyRunning(f"party {name!r} is already running in {pdir} (process {holder}); a second start "
                           "would overwrite its files: stop it first, or give this run its own --out folder") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def keep_earlier_transcript(pdir: Path) -> Path | None:
    """A restarted party never destroys evidence: an earlier start's transcript is kept beside as
    ``transcript.K.jsonl`` (K = 1, 2, ...) before the new one is opened."""
    t = pdir / rf.TRANSCRIPT
    if not t.exists() or t.stat().st_size == 0:
        t.unlink(missing_ok=True)
        return None
    k = 1
    while (pdir / f"transcript.{k}.jsonl").exists():
        k += 1
    dest = pdir / f"transcript.{k}.jsonl"
    os.replace(t, dest)
    return dest


def _logger(name: str, path: Path, echo: bool, level: str = "info") -> logging.Logger:
    if level not in LOG_LEVELS:
        raise ValueError(f"log level {level!r}: choose one of {', '.join(LOG_LEVELS)}")
    log = logging.getLogger(f"fedhet.party.{name}.{os.getpid()}")
    log.setLevel(getattr(logging, level.upper()))
    log.propagate = False
    fh = logging.FileHandler(path, encoding="utf-8")
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s " + name + ": %(message)s"))
    log.addHandler(fh)
    if echo:
        sh = logging.StreamHandler(sys.stderr)
        sh.setFormatter(logging.Formatter(name + ": %(levelname)s %(message)s"))
        sh.setLevel(logging.WARNING)
        log.addHandler(sh)
    return log


def config_record(fed: Federation, run_id: str, insecure: bool) -> dict:
    d = fed.to_dict(public_only=True)
    d["run_id"] = run_id
    d["insecure"] = insecure
    d["network"] = describe_network(parse_network(fed.network))   # the simulated link (loopback: none)
    d["algorithm_cfg"] = fed.algorithm_cfg()
    return d


class _LogStream:
    """A file-like sink that writes each progress line to the party's log at INFO."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log

    def write(self, text: str) -> int:
        if text.strip():
            self.log.info("progress %s", text.strip())
        return len(text)

    def flush(self) -> None:
        pass


class Stopped(BaseException):
    """SIGTERM reached the party (the launcher or a user stopped it)."""


def _stop_on_sigterm(report=None) -> None:
    """On SIGTERM: record that this party was stopped (``report``: status "stopped" and
    error.json), then exit at once.  Exiting from the handler, rather than unwinding, keeps the
    launcher's promise that a stopped or orphaned party is gone within seconds even while it
    sits in a long C call; its pool workers follow it (they watch their parent)."""
    def handler(signum, frame):
        why = f"stopped by signal {signal.Signals(signum).name}"
        if report is not None:
            try:
                report(why)
            finally:
                os._exit(143)
        raise Stopped(why)

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (tests): the default action stays
        pass


def run_party(fed: Federation, name: str, run_dir: str | os.PathLike, algorithm: Algorithm,
              insecure: bool = False, bind: str | None = None, run_id: str | None = None,
              echo: bool = True, log_level: str = "info", resume: bool = False) -> int:
    """Run one party of ``algorithm`` to completion; returns the process exit code (0 = success).

    ``algorithm`` comes from the caller (the CLI resolves the federation's algorithm name
    through the algorithms' registry): the runtime itself knows no algorithm.
    """
    die_with_launcher()
    raise_open_file_limit()
    try:
        run = PartyRun(fed, name, run_dir, algorithm, insecure=insecure, bind=bind, run_id=run_id, echo=echo,
                       log_level=log_level, resume=resume)
    except (PartyRunning, NothingToResume) as e:   # the party's files stay as they are
        print(f"error: {e}", file=sys.stderr)
        return 1
    die_with_launcher(run.record_stop)   # now with the party's "stopped" record
    _stop_on_sigterm(run.record_stop)
    return run.run()


class PartyRun:
    """One party's run: its folder, log, keys, transport, transcript and result or error files.

    Holds no process-wide state (signals, rlimits, the launcher watch): :func:`run_party` adds
    those for a process of its own, :mod:`fedhet.parties.host` for many parties in one process,
    each :meth:`run` on its own thread.  ``zmq_context``: a context shared with the other
    parties of the process (None: the party makes its own).
    """

    def __init__(self, fed: Federation, name: str, run_dir: str | os.PathLike, algorithm: Algorithm,
                 insecure: bool = False, bind: str | None = None, run_id: str | None = None,
                 echo: bool = True, zmq_context=None, log_level: str = "info", resume: bool = False) -> None:
        self.fed, self.name, self.algorithm = fed, name, algorithm
        self.insecure, self.bind, self.zmq_context = insecure, bind, zmq_context
        self.run_dir = Path(run_dir)
        self.spec = fed.party(name)
        self.pdir = party_dir(self.run_dir, name)
        self.pdir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_party_dir(self.pdir, name)   # before anything in the folder is touched
        for stale in (rf.RESULT, rf.ERROR, rf.STATUS):
            (self.pdir / stale).unlink(missing_ok=True)
        self._status = StatusFile(self.pdir / rf.STATUS)   # the one writer of status.json
        self.resume = resume
        earlier = keep_earlier_transcript(self.pdir)
        self.restarted = earlier is not None and not resume   # started here before, now afresh
        # a resumed party's transcript goes on from the earlier one's records (those the chain holds)
        self.earlier: list[dict] | None = None
        if resume:
            if earlier is None:   # killed before its transcript's first record: the newest kept one, if any
                kept = sorted((f for f in self.pdir.glob("transcript.*.jsonl") if f.name.split(".")[1].isdigit()),
                              key=lambda f: int(f.name.split(".")[1]))
                earlier = kept[-1] if kept else None
            if earlier is None and not (self.pdir / rf.STDOUT).exists() and not (self.pdir / rf.LOG).exists():
                raise NothingToResume(f"party {name!r}: nothing to resume in {self.pdir} (it never started "
                                      "there): run it without --resume")
            # a party killed before its first record holds no checkpoint: it resumes from none (the others
            # then agree on step 0, and the run starts over, its transcript going on)
            self.earlier = chain_prefix(earlier, name) if earlier is not None else []
            self.earlier_file = earlier.name if earlier is not None else None
        self.checkpoints = Checkpoints(private_dir(self.pdir) / "checkpoints", background=True)
        self.log = _logger(name, self.pdir / rf.LOG, echo, log_level)
        # progress lines (role, step, metric, elapsed, ETA): on the terminal of `fedhet party`, and in log.txt
        self._lines = LinePrinter() if echo else None
        self._logged = LinePrinter(stream=_LogStream(self.log))
        self._pause = pause_hook(name)   # FEDHET_PAUSE_AT (tests of what watches a run in progress)
        self._stage_t = time.perf_counter()
        self.stage_at: dict[str, float] = {}  # stage -> when it ended (perf_counter)
        self.run_id = run_id or fed.derived_run_id()
        self.t0 = time.perf_counter()
        self.code: int | None = None  # the exit code once run() returned
        self.party: ZmqParty | None = None  # the ZmqParty once it is up (tests and hosts read its traffic)

    def stage(self, what: str) -> None:
        """Log a protocol stage with the time it took since the last one."""
        now = time.perf_counter()
        self.log.info("stage %s (%.2fs; %.2fs since start)", what, now - self._stage_t, now - self.t0)
        self._stage_t = self.stage_at[what] = now

    def status(self, st: dict) -> None:
        """Write the party's status (parties/status.py: forward only; a progress report that comes
        after the party stopped or ended is dropped, not written over the final state)."""
        st.update({"party": self.name, "role": self.spec.role, "state": st.get("state", "running")})
        st.setdefault("elapsed_s", time.perf_counter() - self.t0)
        try:
            if not self._status.write(st):
                return
        except OSError as e:  # progress is advisory: out of descriptors must not fail the party
            if not _out_of_descriptors(e):
                raise
        if self._lines is not None:
            self._lines.maybe(st)
        self._logged.maybe(st)
        if self._pause is not None:
            self._pause(st)

    def record_stop(self, why: str) -> None:
        """Write the "stopped" records (error.json and status) of a party stopped from outside."""
        rec = failure.record(Stopped(why), self.name, self.spec.role, stopped=True)
        rec.update(traceback="", wall_s=time.perf_counter() - self.t0)
        write_json_atomic(self.pdir / rf.ERROR, rec)
        self.status({"state": "stopped", "error": f"Stopped: {why}"})

    def announce_early(self, reason: str) -> None:
        """An abort notice from a party that failed before its transport was up (settings, device,
        data): a bare transport with the party's keys, so peers stop within seconds and name it."""
        from .zmq_transport import ZmqParty

        fed, name = self.fed, self.name
        try:
            if fed.key_dir is None:
                return
            secret = None if self.insecure else keyfiles.load_curve_secret(fed.key_dir, name)
            public = {p.name: p.public_key.encode() for p in fed.parties if p.public_key}
            extra = {} if self.zmq_context is None else {"context": self.zmq_context}
            bare = ZmqParty(name, fed.roles, {p.name: p.endpoint for p in fed.parties}, public_keys=public,
                            secret_key=secret, insecure=self.insecure, bind_endpoint=self.bind, run_id=self.run_id,
                            seed=fed.seed, device="cpu", timeout=fed.timeout, logger=self.log,
                            fingerprint=fed.fingerprint(), **extra)
        except Exception as e:  # noqa: BLE001 - no keys, or the port is taken: peers will time out
            self.log.warning("party %s could not announce its failure to its peers: %s", name, e)
            return
        try:
            bare.notify_failure(f"{name}: {reason}")
        finally:
            bare._transport_close(linger_s=FAILED_LINGER_S, unreached_s=UNREACHED_LINGER_S)

    def run(self) -> int:
        """Run the role function to completion; returns the exit code (0 = success, 1 = failed,
        130 = interrupted, 143 = stopped).  The steps: the public record, the settings, the keys, the
        transcript, the transport, the role, the results; any failure is recorded (:meth:`_fail`)."""
        self.transcript: Transcript | None = None
        try:
            write_json_atomic(self.run_dir / rf.CONFIG, config_record(self.fed, self.run_id, self.insecure))
            settings, declared, sizes = self._settings()
            signing, secret, public = self._keys()
            incarnation, offered = self._open_transcript(signing)
            party = self._connect(signing, secret, public, declared, sizes, incarnation)
            result = run_role(self.algorithm, settings, party, list(self.fed.roles.items()),
                              data_dir=self.fed.data_dir or None, data_spec=self.spec.data or None,
                              base_dir=self.fed.base_dir or None, stage=self.stage, resume=offered)
            self._finish(party, settings, result)
            self.code = 0
            return 0
        except BaseException as e:  # noqa: BLE001 - every failure is reported, then the process exits
            return self._fail(e)

    def _settings(self):
        """The algorithm's settings, declarations and sizes, before anything listens: a bad key fails here."""
        algo, fed = self.algorithm, self.fed
        if algo.name != fed.algorithm_name:
            raise ValueError(f"the federation runs {fed.algorithm_name!r}, this party was given {algo.name!r}")
        algo.check_roles({self.name: self.spec.role})
        out = prepare(algo, fed.algorithm_cfg())
        self.stage("settings parsed")
        return out

    def _keys(self):
        """This party's signing key, CURVE secret (None when insecure) and every party's CURVE public key."""
        fed, name = self.fed, self.name
        if fed.key_dir is None:
            raise ValueError(f"{fed.source}: [federation] key_dir is not set: set it to the folder of this "
                             f"machine's secret keys, then run `fedhet keys {fed.source} --update`")
        if not self.insecure:
            check_keys_present(fed)
        signing = keyfiles.load_signing_key(fed.key_dir, name)
        secret = None if self.insecure else keyfiles.load_curve_secret(fed.key_dir, name)
        public = {p.name: p.public_key.encode() for p in fed.parties if p.public_key}
        if not self.insecure and keyfiles.load_public(fed.key_dir, name).curve != self.spec.public_key:
            raise ValueError(f"the CURVE key in {fed.key_dir} for {name!r} does not match its public_key "
                             "in the federation file")
        self.stage("keys loaded")
        return signing, secret, public

    def _open_transcript(self, signing) -> tuple[int, dict | None]:
        """The transcript (after an earlier incarnation's: a resume record); returns the incarnation
        and the checkpoints this party offers to resume from (None: a fresh start)."""
        self.transcript = Transcript(self.pdir / rf.TRANSCRIPT, self.name, self.run_id, signing, earlier=self.earlier)
        incarnation, offered = 0, None
        if self.earlier is not None:
            incarnation = 1 + sum(r.get("type") == "resume" for r in self.earlier)
            offered = self.checkpoints.offer(self.earlier)
            self.transcript.mark("resume", incarnation=incarnation, earlier=self.earlier_file,
                                 offered={str(k): v for k, v in sorted(offered.items())})
            self.log.info("resuming (incarnation %d); checkpoints held: %s", incarnation, sorted(offered) or "none")
        self.status({"state": "starting", "done": 0, "total": 0})
        return incarnation, offered

    def _connect(self, signing, secret, public, declared, sizes, incarnation: int) -> ZmqParty:
        """The transport up: CURVE sockets to every peer, the checkpoints and the restart rules; the
        party's identity (its signing key, every party's pinned sign_key) for signed statements."""
        from .zmq_transport import ZmqParty

        fed, name, spec = self.fed, self.name, self.spec
        extra = {} if self.zmq_context is None else {"context": self.zmq_context}
        party = self.party = ZmqParty(
            name, fed.roles, {p.name: p.endpoint for p in fed.parties}, public_keys=public,
            secret_key=secret, insecure=self.insecure, bind_endpoint=self.bind, run_id=self.run_id, seed=fed.seed,
            device=spec.device, timeout=fed.timeout, max_message_bytes=fed.max_message_mb << 20,
            transcript=self.transcript, logger=self.log, metrics_path=self.pdir / rf.METRICS, status_cb=self.status,
            declarations=declared, sizes=sizes, fingerprint=fed.fingerprint(),
            lost_s=give_up_after(fed), incarnation=incarnation, restarted=self.restarted,
            network=parse_network(fed.network),
            identity=PartyIdentity(signing, {p.name: keyfiles.verify_key(p.sign_key) for p in fed.parties if p.sign_key}),
            **extra,
        )
        party.checkpoints, party.checkpoint_every = self.checkpoints, fed.checkpoint_every
        party.after_checkpoint = kill_hook(name, self.run_dir)
        party.restart_grace = fed.restart_grace_s > 0
        self.log.info("party %s (%s) up: run %s, %d peers, device %s%s", name, spec.role, self.run_id,
                      len(party.peers), party.device, ", INSECURE" if self.insecure else "")
        self.stage("transport up")
        return party

    def _finish(self, party: ZmqParty, settings, result: dict) -> None:
        """After the role: checkpoints flushed, the closing barrier, the trained part, the transcript
        closed, then ``result.json`` and the status "done"."""
        party.flush_checkpoints()
        party.close()
        self.stage("closing barrier passed")
        part = trained_part(self.algorithm, settings, party, self.fed.fingerprint())
        if part is not None:
            write_part(self.pdir / rf.MODEL, part, part.header)
            self.stage("model written")
        assert self.transcript is not None
        self.transcript.close()
        wall = time.perf_counter() - self.t0
        write_json_atomic(self.pdir / rf.RESULT, {
            "party": self.name, "role": self.spec.role, "run_id": self.run_id, "algorithm": self.algorithm.name,
            "resumed_from": party.resumed_from, "incarnation": party.incarnation,
            "checkpoints": party.checkpoint_stats,
            "result": result, "traffic": party.traffic(), "wall_s": wall,
            "exclusions": party.exclusions, "rounds_with_exclusions": party.exclusion_count,
            "role_wall_s": time.perf_counter() - self.stage_at["data loaded"], "device": party.device,
            "insecure": self.insecure, "network": describe_network(parse_network(self.fed.network)),
            # epoch seconds, the transcripts' clock: when the role began (its data loaded) and the party
            # ended (the network cost model's span: fedhet.parties.ops.netmodel)
            "started_at": time.time() - (time.perf_counter() - self.stage_at["data loaded"]), "ended_at": time.time(),
        })
        self.status({"state": "done", "done": 1, "total": 1, "wall_s": wall})
        self.log.info("party %s finished in %.2fs", self.name, wall)

    def _fail(self, e: BaseException) -> int:
        """Record a failure (cause, culprit, evidence: :mod:`fedhet.parties.failure`), then tell the
        peers (whoever the notice stops finds this party's own explanation already written), keep a
        checkpoint being written, and close; returns the exit code."""
        name, party = self.name, self.party
        reason = f"{type(e).__name__}: {e}"
        stopped = isinstance(e, (Stopped, KeyboardInterrupt))
        self.log.error("party %s %s: %s\n%s", name, "stopped" if stopped else "failed", reason, traceback.format_exc())
        rec = failure.record(e, name, self.spec.role, transport=party, stopped=stopped)
        rec["wall_s"] = time.perf_counter() - self.t0
        try:
            write_json_atomic(self.pdir / rf.ERROR, rec)
            self.status({"state": "stopped" if stopped else "failed", "error": reason,
                         "culprit": rec["culprit"], "cause": rec["cause"]})
        except Exception:
            pass
        if not stopped and not isinstance(e, PartyAborted):
            if party is not None:
                party.notify_failure(f"{name}: {reason}")
            else:
                self.announce_early(reason)
        if party is not None:   # a checkpoint being written is finished and recorded: a resume can use it
            _quietly(party.flush_checkpoints)
        if self.transcript is not None:
            _quietly(self.transcript.close)
        if party is not None:
            _quietly(lambda: party._transport_close(linger_s=FAILED_LINGER_S, unreached_s=UNREACHED_LINGER_S))
        self.code = 130 if isinstance(e, KeyboardInterrupt) else 143 if isinstance(e, Stopped) else 1
        return self.code
