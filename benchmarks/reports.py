"""The managers' reports under a year's load: 1,000 releases and 11,250 stage runs.

Seeds a fresh database (SQLite in a temporary DAY0_VAR_DIR by default; `--database-url` for
PostgreSQL, where a fresh database `day0_bench_reports` is created next to the one the URL
names) with bulk inserts: three pools, 1,000 releases discovered over the last 30 days (so the
default report period covers every one; one in ten without a publication time), a cpu job of
all nine stages for each and an h200 job for one in four (11,250 stage runs): 70% of jobs
complete, 20% failed at a random stage (with an error, the later stages skipped), 10% still
running; readiness, blocking stage and Day-0 time set as `services.job_refresh_status` would
(`adaptation.readiness.readiness_from_runs`), and 500 open known limitations.

Then it renders `/reports/` and `/reports/readiness` (default parameters: the last 30 days,
every pool) through Django's test client signed in as a manager: `--warmup` untimed requests,
then `--runs` timed ones (time.perf_counter around each request), and prints the median and
p95 of each page, the SQL queries per request, and PASS/FAIL: the p95 of both pages must stay
under `--limit-ms` (300). Exit status 0 on PASS, 1 on FAIL.

    .venv/bin/python benchmarks/reports.py [--runs 20] [--database-url postgres://...]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELEASES = 1000
SECOND_POOL_EVERY = 4  # 1,000 cpu jobs + 250 h200 jobs, 9 stages each: 11,250 runs
DATABASE = "day0_bench_reports"


def fresh_postgres(url: str) -> str:
    """Drop and create the benchmark database next to the one `url` names; its URL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    return url.rsplit("/", 1)[0] + f"/{DATABASE}"


def configure(database_url: str | None) -> None:
    """Environment for a throwaway day0 before Django starts."""
    os.environ["DAY0_VAR_DIR"] = tempfile.mkdtemp(prefix="day0-bench-reports-")
    os.environ["ALLOWED_HOSTS"] = "testserver,localhost"
    os.environ["DEBUG"] = "0"
    # Connections kept between requests, as a production server keeps them.
    os.environ["DATABASE_CONN_MAX_AGE"] = "600"
    os.environ["DJANGO_SETTINGS_MODULE"] = "day0web.settings"
    if database_url:
        os.environ["DATABASE_URL"] = fresh_postgres(database_url)
    else:
        os.environ.pop("DATABASE_URL", None)
    sys.path.insert(0, str(ROOT))


def seed(*, releases: int, seed_value: int) -> dict[str, int]:
    """Bulk-insert the sample; returns what was written, counted."""
    from adaptation.models import (
        AcceleratorPool,
        AdaptationJob,
        KnownLimitation,
        ModelRelease,
        StageRun,
    )
    from adaptation.readiness import readiness_from_runs
    from engine.registry import stage_names

    rng = random.Random(seed_value)
    stages = stage_names()
    now = datetime.now(UTC)
    cpu, _ = AcceleratorPool.objects.get_or_create(name="cpu", defaults={"backend": "cpu"})
    h200 = AcceleratorPool.objects.create(
        name="h200", backend="manifest", accelerator="h200", queue="pool.h200"
    )
    AcceleratorPool.objects.create(
        name="mi300x", backend="manifest", accelerator="mi300x", queue="pool.mi300x"
    )
    rows = []
    for n in range(releases):
        discovered = now - timedelta(seconds=rng.uniform(60, 29 * 86400))
        published = (
            None
            if rng.random() < 0.1
            else discovered - timedelta(seconds=rng.uniform(30, 6 * 3600))
        )
        rows.append(
            ModelRelease(
                hub_kind="huggingface",
                hub_endpoint="https://huggingface.co",
                repo_id=f"bench-org/model-{n:04d}",
                revision=f"{n:040x}",
                published_at=published,
                discovered_at=discovered,
                found_by="poll",
            )
        )
    created = ModelRelease.objects.bulk_create(rows, batch_size=500)
    plans: list[tuple[AdaptationJob, list[StageRun]]] = []
    for n, release in enumerate(created):
        pools = [cpu] + ([h200] if n % SECOND_POOL_EVERY == 0 else [])
        for pool in pools:
            start = release.discovered_at + timedelta(seconds=rng.uniform(5, 600))
            roll = rng.random()
            fail_at = rng.randrange(len(stages)) if 0.7 <= roll < 0.9 else None
            running_at = rng.randrange(len(stages)) if roll >= 0.9 else None
            runs, at = [], start
            for position, name in enumerate(stages):
                at = at + timedelta(seconds=rng.uniform(30, 4 * 3600))
                if fail_at is not None and position > fail_at:
                    status, finished = "skipped", None
                elif running_at is not None and position >= running_at:
                    status = "running" if position == running_at else "pending"
                    finished = None
                else:
                    status = "failed" if position == fail_at else "succeeded"
                    finished = min(at, now)
                runs.append(
                    StageRun(
                        stage=name,
                        position=position,
                        attempt=1,
                        status=status,
                        started_at=finished - timedelta(seconds=20) if finished else None,
                        finished_at=finished,
                        worker_host="bench-1" if finished else "",
                        error=(
                            f"{name}: the bench's failure #{rng.randrange(1000)}\nTraceback ..."
                            if status == "failed"
                            else ""
                        ),
                    )
                )
            level = readiness_from_runs(stages=stages, runs=runs)
            status = (
                "failed"
                if fail_at is not None
                else "running"
                if running_at is not None
                else "succeeded"
            )
            job = AdaptationJob(
                release=release,
                pool=pool,
                trigger="poll",
                stages=stages,
                status=status,
                created_at=start,
                started_at=start,
                finished_at=max((r.finished_at for r in runs if r.finished_at), default=None)
                if status != "running"
                else None,
                readiness=level.readiness,
                blocking_stage=level.blocking_stage,
                ready_at=level.ready_at,
            )
            plans.append((job, runs))
    jobs = AdaptationJob.objects.bulk_create([job for job, _ in plans], batch_size=500)
    runs = []
    for job, (_, job_runs) in zip(jobs, plans, strict=True):
        for run in job_runs:
            run.job = job
            runs.append(run)
    StageRun.objects.bulk_create(runs, batch_size=1000)
    limitations = [
        KnownLimitation(
            release=rng.choice(created),
            pool=rng.choice([None, cpu, h200]),
            title=f"bench limitation {n}",
            severity=rng.choice(["blocker", "major", "minor", "info"]),
            key=f"bench:{n}",
        )
        for n in range(500)
    ]
    KnownLimitation.objects.bulk_create(limitations, batch_size=500)
    return {
        "releases": ModelRelease.objects.count(),
        "jobs": AdaptationJob.objects.count(),
        "stage_runs": StageRun.objects.count(),
        "limitations": KnownLimitation.objects.count(),
    }


def measure(client, url: str, *, warmup: int, runs: int) -> tuple[list[float], int]:
    """Seconds per request of `runs` timed GETs after `warmup` untimed ones, and the SQL
    queries of one request."""
    from django.db import connection

    for _ in range(warmup):
        response = client.get(url)
        if response.status_code != 200:
            sys.exit(f"{url} answered {response.status_code}")
    queries: list[str] = []

    def count(execute, sql, params, many, context):
        queries.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        client.get(url)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(url)
        times.append(time.perf_counter() - started)
        assert response.status_code == 200
    return times, len(queries)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", type=int, default=RELEASES)
    parser.add_argument("--runs", type=int, default=20, help="timed requests per page")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--limit-ms", type=float, default=300.0)
    parser.add_argument("--database-url", help="a PostgreSQL URL (default: SQLite in a temp dir)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    configure(args.database_url)
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from adaptation.roles import MANAGER, role_grant

    call_command("migrate", verbosity=0, interactive=False)
    started = time.perf_counter()
    counts = seed(releases=args.releases, seed_value=args.seed)
    print(
        f"seeded {counts['releases']} releases, {counts['jobs']} jobs, "
        f"{counts['stage_runs']} stage runs, {counts['limitations']} limitations "
        f"on {connection.vendor} in {time.perf_counter() - started:.1f} s"
    )
    manager = get_user_model().objects.create_user(username="bench-manager")
    role_grant(user=manager, role=MANAGER)
    client = Client()
    client.force_login(manager)

    passed = True
    for url in ("/reports/", "/reports/readiness"):
        times, queries = measure(client, url, warmup=args.warmup, runs=args.runs)
        median_ms = statistics.median(times) * 1000
        p95_ms = p95(times) * 1000
        ok = p95_ms < args.limit_ms
        passed &= ok
        print(
            f"{url:<20} median {median_ms:7.1f} ms  p95 {p95_ms:7.1f} ms  "
            f"({args.runs} runs, {queries} queries)  {'PASS' if ok else 'FAIL'}"
        )
    print(f"{'PASS' if passed else 'FAIL'}: p95 under {args.limit_ms:g} ms on both pages")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
