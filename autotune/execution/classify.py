"""How a trial ended, read from what it left: its exit code, its ``metrics.json``, its logs.

Contract: :func:`classify` turns a finished trial program (exit code, trial folder, log folder)
into an `autotune.jobs.Result` (:func:`outputs_complete`: whether every rank wrote its last
outputs, so a program whose workers all exited after them has finished): ``ok`` or ``diverged`` with the metrics (and their
``underflow_note`` as the detail), ``oom``, or ``error``; :func:`stopped_in_probe` one its
launcher stopped while the underflow probe ran after training (``ok``, the share unmeasured).

An ``oom`` needs evidence, and there are three kinds: a line of any log saying so in the
backend's words (`autotune.spec.backends`); the runner's memory budget crossed (decided while
it runs, `autotune.execution.runner`); the kernel's out-of-memory report naming one of the
trial's own processes, by pid and time (``/dev/kmsg``, where it is readable:
`autotune.procfs.kernel_oom_kills`). A SIGKILL / exit 137 without any of them — an operator's
``kill``, the OOM killer hitting a neighbour, a node going away — is an infrastructure
``error``, never remembered as the candidate's. Out-of-memory evidence from a launch that never
got to the candidate (a device held by another process while joining the cluster) is the
infrastructure's ``error``, the evidence kept in the detail: it says nothing about the
candidate. An ``error`` says whose failure it is
(``Result.infrastructure``): the candidate's own once the trial program got to run the
candidate — a rank printed `autotune.train.CANDIDATE_STARTED` (the launch was done), or the
program gave a verdict other than `autotune.train.LAUNCH_FAILED` (a config error, a bad model
entry, an exception while building, compiling or training); the infrastructure's when the
program never got there (msrun or the process launch failed before any verdict, or the verdict
is ``LaunchError``: communication init, the cluster join). A verdict of `autotune.train.REFUSED`
after the launch — a MindFormers trial refused at start-up, before training, by MindFormers or
MindSpore (`autotune.mindformers`) — is the candidate's ``infeasible``. A failure of the
collective library to reach a peer (:func:`link_failure`: the backend's words, HCCL's EI0006 link
timeout and EI0002 notify timeout on Ascend) is the infrastructure's ``error`` even after the
candidate ran: a peer that never arrived within the library's timeout — set to the trial's own
(`autotune.execution.environment`) — is a node or a link that failed, a rank that crashed being
msrun's to end first (it stops a node's other workers when one fails). The verdict is searched in
the whole logs (:func:`program_verdict`). The detail is one line of reason, then :func:`log_tail`.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from autotune.jobs import Result
from autotune.procfs import kernel_oom_kills, start_seconds
from autotune.spec.backends import Backend
from autotune.train import CANDIDATE_STARTED, LAUNCH_FAILED, REFUSED, VERDICT
from autotune.train.metrics import PROBE_UNFINISHED


def _logs(log_dir: Path) -> dict:
    return {
        log: log.read_text(errors="replace").strip().splitlines()
        for log in sorted(log_dir.glob("**/*.log"))
    }


def log_tail(log_dir: Path, lines: int = 20) -> str:
    """The last lines of two of the logs under ``log_dir``: the lowest rank's (that is where
    errors surface), then another that holds the trial program's verdict, else another
    worker's, else msrun's."""
    texts = _logs(log_dir)

    def worker_rank(log):
        number = log.stem.removeprefix("worker_")
        return int(number) if log.name.startswith("worker_") and number.isdigit() else 1 << 30

    lowest = min(map(worker_rank, texts), default=None)

    def rank(log):
        verdict = any(line.startswith(VERDICT) for line in texts[log])
        return (
            worker_rank(log) != lowest,
            not verdict,
            not log.name.startswith("worker_"),
            log.name,
        )

    chunks = [
        f"[{log.name}] " + "\n".join(texts[log][-lines:])
        for log in sorted(texts, key=rank)
        if texts[log]
    ]
    return "\n".join(chunks[:2])


def outputs_complete(trial_dir: Path, workers: int) -> bool:
    """Every rank wrote ``metrics.rank<r>.json`` (after its probe) and rank 0 its final
    ``metrics.json`` (not the one written before the probe): the program's last outputs."""
    if not all((trial_dir / f"metrics.rank{r}.json").exists() for r in range(workers)):
        return False
    try:
        metrics = json.loads((trial_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return False
    return metrics.get("underflow_note") != PROBE_UNFINISHED


def classify(
    returncode: int,
    trial_dir: Path,
    log_dir: Path,
    run_s: float,
    backend: Backend,
    processes: dict[int, int] | None = None,
    kernel_kills: dict | None = None,
) -> Result:
    """How the trial program that exited with ``returncode`` ended (see the module doc).
    ``processes``: the trial's processes, pid → start (clock ticks since boot);
    ``kernel_kills``: the kernel's OOM kills (`autotune.procfs.kernel_oom_kills`), read from
    the kernel's log when None and a kill needs explaining."""
    metrics_file = trial_dir / "metrics.json"
    if returncode == 0 and metrics_file.exists():
        metrics = json.loads(metrics_file.read_text())
        outcome = "diverged" if metrics.get("diverged") else "ok"
        return Result(outcome, metrics, detail=metrics.get("underflow_note") or "", run_s=run_s)
    tail = log_tail(log_dir)
    # The trial program's own one-line verdict, if it got to say one, beats msrun's epilogue
    # (searched in the whole logs: teardown lines can push it out of the tail).
    verdict = program_verdict(log_dir)
    reason = verdict or (tail.splitlines() or [""])[-1]
    infrastructure = not _candidate_ran(log_dir)
    killed = returncode in (-signal.SIGKILL, 137)
    if killed and kernel_kills is None:
        kernel_kills = kernel_oom_kills()
    evidence = oom_evidence(log_dir, backend) or (
        kernel_oom_report(processes or {}, kernel_kills) if killed else None
    )
    if evidence and not infrastructure:
        return Result("oom", detail=f"{evidence}\n{tail}", run_s=run_s)
    if killed and not evidence:
        unread = "" if kernel_kills is not None else " (the kernel's log is not readable here)"
        why = (
            f"infrastructure: killed by SIGKILL (exit code {returncode}) with no sign of "
            f"running out of memory: no memory line in its logs, the budget not crossed, no "
            f"kernel OOM report for its processes{unread}"
        )
        return Result("error", detail=f"{why}\n{tail}", run_s=run_s, infrastructure=True)
    if verdict and verdict.startswith(REFUSED) and not infrastructure:
        return Result("infeasible", detail=f"{verdict}\n{tail}", run_s=run_s)
    why = f"exit code {returncode}" if returncode else "exited 0 without metrics.json"
    link = None if evidence else link_failure(log_dir, backend)
    if link and not infrastructure:
        why = f"infrastructure: {why}, the collectives lost a peer: {link}"
        return Result("error", detail=f"{why}\n{tail}", run_s=run_s, infrastructure=True)
    if infrastructure:
        why = f"infrastructure: {why}, before the candidate ran"
        if evidence:
            why += f" (out of memory while launching: {evidence})"
    return Result(
        "error", detail=f"{why}: {reason}\n{tail}", run_s=run_s, infrastructure=infrastructure
    )


def program_verdict(log_dir: Path) -> str | None:
    """The trial program's last verdict line (`autotune.train.VERDICT`) in the logs under
    ``log_dir``, the lowest rank's first (msrun's worker logs, then the rest); None without."""

    def order(log: Path):
        number = log.stem.removeprefix("worker_")
        return (0, int(number)) if number.isdigit() else (1, 0)

    for _, lines in sorted(_logs(log_dir).items(), key=lambda item: order(item[0])):
        said = [line.strip() for line in lines if line.startswith(VERDICT)]
        if said:
            return said[-1]
    return None


def oom_evidence(log_dir: Path, backend: Backend) -> str | None:
    """The first line of any log under ``log_dir`` (every worker's, msrun's) that says it ran
    out of memory on ``backend``, as ``[log] line``; None when none does."""
    for log, lines in _logs(log_dir).items():
        for line in lines:
            if backend.oom_in(line):
                return f"[{log.name}] {line.strip()}"
    return None


def link_failure(log_dir: Path, backend: Backend) -> str | None:
    """The first line of any log under ``log_dir`` in which the collective library says it lost
    a peer (``Backend.link_failures``), as ``[log] line``; None when none does."""
    for log, lines in _logs(log_dir).items():
        for line in lines:
            if backend.link_failure_in(line):
                return f"[{log.name}] {line.strip()}"
    return None


def kernel_oom_report(processes: dict[int, int], kills: dict | None) -> str | None:
    """The kernel's report of killing one of ``processes`` (pid → start ticks) for memory: a
    kill of that pid after that process started, as ``[kernel] line``; None when none."""
    for pid, start in processes.items():
        when, line = (kills or {}).get(pid, (None, ""))
        if when is not None and when >= start_seconds(start):
            return f"[kernel] {line}"
    return None


def stopped_in_probe(
    trial_dir: Path, outcome: str, detail: str, run_s: float, stop_s: float | None
) -> Result | None:
    """A trial its launcher stopped (``outcome`` ``timeout`` or ``oom``, why in ``detail``)
    while its underflow probe ran — its training done and its metrics written
    (`autotune.train.metrics.PROBE_UNFINISHED`) — ends as its training did, ``underflow_share``
    unmeasured with the reason (`autotune.train.step.probe.measure`: the probe never fails a trial
    that trained); None for a trial stopped before that."""
    metrics_file = trial_dir / "metrics.json"
    if outcome not in ("timeout", "oom") or not metrics_file.exists():
        return None
    metrics = json.loads(metrics_file.read_text())
    if metrics.get("underflow_note") != PROBE_UNFINISHED:
        return None
    reason = detail.splitlines()[0] if detail else outcome
    metrics["underflow_note"] = f"{PROBE_UNFINISHED}: stopped by its launcher ({outcome}: {reason})"
    return Result(
        "diverged" if metrics.get("diverged") else "ok",
        metrics,
        detail=metrics["underflow_note"],
        run_s=run_s,
        stop_s=stop_s,
    )


class CandidateStart:
    """Whether a rank of a running trial started the candidate: it printed
    `autotune.train.CANDIDATE_STARTED` into a log under ``log_dir`` (msrun's worker logs, the
    one process's, a warm worker's trial log). :meth:`seen` reads only what the logs gained
    since it last looked, so a launcher may ask at every poll."""

    MARKER = CANDIDATE_STARTED.encode()

    def __init__(self, log_dir: Path):
        self.log_dir, self.offsets, self.started = Path(log_dir), {}, False

    def seen(self) -> bool:
        """Whether a rank has started the candidate (True from then on)."""
        for log in [] if self.started else self.log_dir.glob("**/*.log"):
            try:
                with open(log, "rb") as f:
                    # from a marker's length before the end of the last read: a line cut in two
                    f.seek(max(0, self.offsets.get(log, 0) - len(self.MARKER)))
                    self.started = self.MARKER in f.read()
                    self.offsets[log] = f.tell()
            except OSError:  # a log not there yet, or gone with a retired pool's folder
                continue
            if self.started:
                break
        return self.started


def _candidate_ran(log_dir: Path) -> bool:
    """Whether any rank got to run the candidate: it said it started it, or gave a verdict
    that is not a failed launch (config errors are the candidate's too)."""
    for lines in _logs(log_dir).values():
        for line in lines:
            if line.startswith(CANDIDATE_STARTED) or (
                line.startswith(VERDICT) and not line.startswith(LAUNCH_FAILED)
            ):
                return True
    return False
