"""Lost work under repeated kills: 20 pool children SIGKILLed mid-stage and 5 whole cpu workers
SIGKILLed (each with two stages running, a new worker started at once), on real Celery workers
over a PostgreSQL and a Redis of the benchmark's own (`tests.e2e.faults.FaultLab`, the machinery
of tests/e2e/test_faults.py: stub stages, a heartbeat every second, stale after 10 s, the
reaper every 2 s).

Each job runs `fetch` then `analyze` (stubs sleeping `--stage-s`); every kill hits a running
`fetch`. Prints the jobs that succeeded, the attempts per stage run, and the seconds from each
kill to the start of the attempt that replaced the lost one (median and max, per kind), then
PASS/FAIL against: no job lost (every one succeeds), no stage succeeding twice (in its
attempts, or a stub run to its end twice), every resume within 60 s. Exit status 0/1.

    .venv/bin/python benchmarks/faults.py [--child-kills 20] [--worker-kills 5] [--stage-s 2]

Needs PostgreSQL's binaries (/usr/lib/postgresql/15/bin, or DAY0_FAULTS_PG_BIN) and
redis-server; nothing else running. About four minutes.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "day0web.settings")

import django

django.setup()

from adaptation.models import AdaptationJob, JobStatus
from tests.e2e.faults import (
    FaultLab,
    attempt_started,
    jobs_finished,
    lab_database,
    missing_tools,
    running_attempt,
    stage_runs,
    succeeded_attempts,
)

DB = "faults"
RESUME_LIMIT_S = 60
# Pool processes of the cpu worker (each whole-worker kill takes this many running stages).
CONCURRENCY = 2


def running_batch(job_ids: list[int]) -> list[dict] | None:
    """The open first-stage attempt of each job, once all of them run; else None."""
    attempts = [running_attempt(job_id, "fetch", using=DB) for job_id in job_ids]
    return attempts if all(attempts) else None


def kill_children(lab: FaultLab, count: int) -> tuple[list[int], dict[tuple[int, int], datetime]]:
    """`count` jobs, `CONCURRENCY` at a time (so a lost attempt queued again waits behind no
    other job): once their `fetch` runs, each one's pool process is SIGKILLed; the next batch
    once they finished. Returns the job ids and the kill time by (job id, attempt n)."""
    job_ids: list[int] = []
    kills: dict[tuple[int, int], datetime] = {}
    for first in range(0, count, CONCURRENCY):
        labels = range(first, min(first + CONCURRENCY, count))
        batch = lab.jobs_create([f"sleep/child-{n}" for n in labels])
        job_ids += batch
        attempts = lab.wait_until(
            lambda batch=batch: running_batch(batch), timeout_s=90, what="stages to run"
        )
        for job_id, attempt in zip(batch, attempts, strict=True):
            kills[(job_id, attempt["n"])] = datetime.now(UTC)
            os.kill(attempt["pid"], signal.SIGKILL)
        lab.wait_until(
            lambda batch=batch: jobs_finished(batch, using=DB), timeout_s=120, what="jobs"
        )
    return job_ids, kills


def kill_workers(lab: FaultLab, rounds: int) -> tuple[list[int], dict[tuple[int, int], datetime]]:
    """`rounds` times: `CONCURRENCY` jobs whose `fetch` runs on the cpu worker, then the worker's
    whole process group SIGKILLed and a new worker started; the next round once those jobs
    finished. Returns the job ids and the kill time by (job id, attempt n)."""
    job_ids: list[int] = []
    kills: dict[tuple[int, int], datetime] = {}
    for n in range(rounds):
        batch = lab.jobs_create([f"sleep/worker-{n}-{k}" for k in range(CONCURRENCY)])
        job_ids += batch
        attempts = lab.wait_until(
            lambda batch=batch: running_batch(batch), timeout_s=90, what="stages to run"
        )
        killed_at = datetime.now(UTC)
        lab.cpu_worker.kill_group()
        lab.cpu_worker = lab.start_cpu_worker()
        for job_id, attempt in zip(batch, attempts, strict=True):
            kills[(job_id, attempt["n"])] = killed_at
        lab.wait_until(
            lambda batch=batch: jobs_finished(batch, using=DB), timeout_s=120, what="jobs"
        )
    return job_ids, kills


def resumes_s(kills: dict[tuple[int, int], datetime]) -> list[float]:
    """Seconds from each kill to the start of the next attempt of the same stage run (inf when
    none started)."""
    waits = []
    for (job_id, n), killed_at in kills.items():
        attempts = stage_runs(job_id, using=DB)["fetch"].attempts
        after = attempts[n] if len(attempts) > n else None
        waits.append((attempt_started(after) - killed_at).total_seconds() if after else 1e9)
    return waits


def summary(waits: list[float]) -> str:
    if not waits:
        return "none"
    return f"median {statistics.median(waits):.1f} s, max {max(waits):.1f} s (n={len(waits)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child-kills", type=int, default=20)
    parser.add_argument("--worker-kills", type=int, default=5)
    parser.add_argument("--stage-s", type=float, default=2)
    args = parser.parse_args()
    missing = missing_tools()
    if missing:
        print(f"FAIL: cannot run: {missing}")
        return 1
    started = time.monotonic()
    job_ids: list[int] = []
    child_kills: dict[tuple[int, int], datetime] = {}
    worker_kills: dict[tuple[int, int], datetime] = {}
    problem = ""
    with (
        FaultLab(stage_s=args.stage_s, concurrency=CONCURRENCY) as lab,
        lab_database(lab.postgres.url, DB),
    ):
        try:
            child_jobs, child_kills = kill_children(lab, args.child_kills)
            worker_jobs, worker_kills = kill_workers(lab, args.worker_kills)
            job_ids = child_jobs + worker_jobs
        except TimeoutError as exc:  # reported below; what finished is still counted
            problem = str(exc)
            job_ids = sorted(AdaptationJob.objects.using(DB).values_list("pk", flat=True))
        jobs = list(AdaptationJob.objects.using(DB).filter(pk__in=job_ids))
        runs = [run for job_id in job_ids for run in stage_runs(job_id, using=DB).values()]
        completions = lab.completions()
        child_waits, worker_waits = resumes_s(child_kills), resumes_s(worker_kills)
    wall_s = time.monotonic() - started
    if problem:
        print(problem)

    succeeded = sum(1 for job in jobs if job.status == JobStatus.SUCCEEDED)
    lost = len(job_ids) - succeeded
    doubles = sum(1 for run in runs if succeeded_attempts(run) > 1)
    doubles += sum(1 for count in completions.values() if count > 1)
    per_stage = Counter((run.stage, len(run.attempts)) for run in runs)
    endings = Counter(a["ended"] for run in runs for a in run.attempts)
    waits = child_waits + worker_waits
    slowest = max(waits, default=0)

    print(f"jobs: {len(job_ids)} ({args.child_kills} child kills, {args.worker_kills} worker kills "
          f"x {CONCURRENCY} running stages), {wall_s:.0f} s")  # fmt: skip
    print(f"jobs succeeded: {succeeded}/{len(job_ids)}")
    for stage in ("fetch", "analyze"):
        counts = ", ".join(
            f"{n} attempt{'s' if n > 1 else ''}: {per_stage[(stage, n)]}"
            for n in sorted({n for s, n in per_stage if s == stage})
        )
        print(f"attempts per stage run, {stage}: {counts}")
    print(f"attempt endings: {dict(endings)}")
    print(f"kill to resume, child kills: {summary(child_waits)}")
    print(f"kill to resume, worker kills: {summary(worker_waits)}")
    print(f"kill to resume, all: {summary(waits)}")
    checks = {
        f"jobs run {len(job_ids)} > 0": bool(job_ids),
        f"lost jobs {lost} == 0": lost == 0,
        f"double successes {doubles} == 0": doubles == 0,
        f"slowest resume {slowest:.1f} s <= {RESUME_LIMIT_S} s": slowest <= RESUME_LIMIT_S,
    }
    for check, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {check}")
    ok = all(checks.values())
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
