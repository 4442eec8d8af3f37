"""The pages people read on a busy day: board, release page, reports and pools, timed.

Seeds a fresh database with `benchmarks/reports.py`'s sample (1,000 releases, 1,250 jobs of
every stage, 500 open known limitations; see its docstring: 11,250 stage runs when it was
written for nine stages, 12,500 with today's ten, a little more than a busy site's load), plus
one release with 20 jobs holding the engine's own results (see `release_with_jobs`;
`--copied-jobs` for copies of a seeded job instead) and one with a single such job. SQLite
in a temporary DAY0_VAR_DIR by default; `--database-url
postgres://postgres@127.0.0.1:5432/bench` drops and creates the database that URL names
(never `test` or `postgres`).

Then, through Django's test client signed in as a reader (the `manager` role, which reads
every page and triggers nothing), it times the board (`/`), the release page of the release
with 20 jobs, `/reports/` and `/pools/`: `--warmup` untimed requests, then `--runs` timed
ones. It prints a table: median and p95 (ms), SQL queries per request
(`CaptureQueriesContext`) and HTML size. The query count must not grow with the data: the
board's is also counted after deleting all but 10 releases, the release page's also for the
release with one job. PASS/FAIL against the pages' speed targets:

- p95 under `--limit-ms` (150) on every page;
- the same query count for the board at 10 and at 1,000 releases, and for a release page with
  1 and with 20 jobs (the reports and pools pages are shown at both sizes too);
- board HTML under `--board-kb-per-50` (100) KB per 50 release rows.

Exit status 0 on PASS, 1 on FAIL.

    .venv/bin/python benchmarks/pages.py [--runs 20] [--database-url postgres://...]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.reports import RELEASES, p95, seed

RELEASE_JOBS = 20
SMALL_BOARD_RELEASES = 10
REFUSED_DATABASES = {"", "test", "postgres", "template0", "template1"}
RELEASE_LINK = re.compile(r'href="/releases/(\d+)/"')


def fresh_postgres(url: str) -> str:
    """Drop and create the database `url` names (through the server's `postgres` database);
    `url`."""
    import psycopg

    base, name = url.rsplit("/", 1)
    name = name.split("?", 1)[0]
    if name in REFUSED_DATABASES or name.startswith("test"):
        sys.exit(f"refusing to use the database {name!r}: name a benchmark's own database")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return url


def configure(database_url: str | None) -> None:
    """Environment for a throwaway day0 before Django starts."""
    os.environ["DAY0_VAR_DIR"] = tempfile.mkdtemp(prefix="day0-bench-pages-")
    os.environ["ALLOWED_HOSTS"] = "testserver,localhost"
    os.environ["DEBUG"] = "0"
    # Connections kept between requests, as a production server keeps them.
    os.environ["DATABASE_CONN_MAX_AGE"] = "600"
    os.environ["DJANGO_SETTINGS_MODULE"] = "day0web.settings"
    if database_url:
        os.environ["DATABASE_URL"] = fresh_postgres(database_url)
    else:
        os.environ.pop("DATABASE_URL", None)


def release_with_jobs(*, jobs: int, name: str, measured: bool) -> int:
    """A release with `jobs` jobs; its id.

    `measured`: each job holds the engine's own results (`tests.performance_rows`: real twins
    of Llama-3.1-8B and DeepSeek-V3 measured on this CPU once, about 15 s; analysis, plan,
    performance sweep with its stored rows, stability, one job in three failing its stability
    run on a leak) on an h200x8 pool, as a release page shows after real work. Otherwise
    copies of a seeded finished job, whose runs hold no results (quick, but a light page)."""
    from django.utils import timezone

    from adaptation.models import AdaptationJob, ModelRelease, StageRun

    release = ModelRelease.objects.create(
        hub_kind="huggingface",
        hub_endpoint="https://huggingface.co",
        repo_id=f"bench-org/{name}",
        revision=f"{name:0>40}"[-40:],
        published_at=timezone.now(),
        discovered_at=timezone.now(),
        found_by="poll",
    )
    if measured:
        from tests.performance_rows import DENSE, MOE, measured_job

        for n in range(jobs):
            dense = n % 2 == 0
            stability = ("stability_leak" if n % 3 == 2 else "stability") if dense else ""
            measured_job(DENSE if dense else MOE, release=release, stability=stability)
        return release.pk
    template = AdaptationJob.objects.filter(status="succeeded").order_by("id").first()
    template_runs = list(StageRun.objects.filter(job=template).order_by("position"))
    for n in range(jobs):
        job = AdaptationJob.objects.get(pk=template.pk)
        job.pk = None
        job.id = None
        job.release = release
        job.status = "failed" if n % 4 == 1 else "succeeded"
        job.save()
        copies = []
        for run in template_runs:
            run.pk = None
            run.id = None
            run.job = job
            copies.append(run)
        StageRun.objects.bulk_create(copies)
    return release.pk


def count_queries(client, url: str) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, f"{url} answered {response.status_code}"
    return len(captured.captured_queries)


def measure(client, url: str, *, warmup: int, runs: int) -> dict:
    """Seconds of `runs` timed GETs after `warmup` untimed ones; queries and HTML bytes of
    one request."""
    for _ in range(warmup):
        response = client.get(url)
        if response.status_code != 200:
            sys.exit(f"{url} answered {response.status_code}")
    queries = count_queries(client, url)
    times, html = [], b""
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(url)
        times.append(time.perf_counter() - started)
        assert response.status_code == 200
        html = response.content
    return {"times": times, "queries": queries, "html": html}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", type=int, default=RELEASES)
    parser.add_argument("--runs", type=int, default=20, help="timed requests per page")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--limit-ms", type=float, default=150.0)
    parser.add_argument("--board-kb-per-50", type=float, default=100.0)
    parser.add_argument("--database-url", help="a PostgreSQL URL (default: SQLite in a temp dir)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--copied-jobs",
        action="store_true",
        help="the release page's jobs without measured results (quick; a lighter page)",
    )
    args = parser.parse_args()

    configure(args.database_url)
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from adaptation.models import ModelRelease
    from adaptation.roles import MANAGER, role_grant

    call_command("migrate", verbosity=0, interactive=False)
    started = time.perf_counter()
    counts = seed(releases=args.releases, seed_value=args.seed)
    measured = not args.copied_jobs
    many_jobs = release_with_jobs(jobs=RELEASE_JOBS, name="many-jobs", measured=measured)
    one_job = release_with_jobs(jobs=1, name="one-job", measured=measured)
    print(
        f"seeded {counts['releases']} releases, {counts['jobs']} jobs, "
        f"{counts['stage_runs']} stage runs, {counts['limitations']} limitations "
        f"(+ a release with {RELEASE_JOBS} {'measured' if measured else 'copied'} jobs "
        "and one with 1) "
        f"on {connection.vendor} in {time.perf_counter() - started:.1f} s"
    )
    reader = get_user_model().objects.create_user(username="bench-reader")
    role_grant(user=reader, role=MANAGER)
    client = Client()
    client.force_login(reader)

    pages = {
        "board": "/",
        f"release ({RELEASE_JOBS} jobs)": f"/releases/{many_jobs}/",
        "reports": "/reports/",
        "pools": "/pools/",
    }
    results = {
        name: measure(client, url, warmup=args.warmup, runs=args.runs)
        for name, url in pages.items()
    }
    one_job_queries = count_queries(client, f"/releases/{one_job}/")
    board_rows = len(set(RELEASE_LINK.findall(results["board"]["html"].decode())))

    # The same pages over 10 releases: everything but the two extra releases and 8 others goes.
    # Kept: releases with a running, a failed and a finished job each, so that the pages take
    # the same paths (a running stage makes the board ask after the pools' workers).
    others = ModelRelease.objects.exclude(pk__in=[many_jobs, one_job]).order_by("pk")
    keep = [many_jobs, one_job]
    for status, count in (("running", 3), ("failed", 3), ("succeeded", 2)):
        keep += (
            others.filter(jobs__status=status)
            .exclude(pk__in=keep)[:count]
            .values_list("pk", flat=True)
        )
    ModelRelease.objects.exclude(pk__in=keep).delete()
    small = {name: count_queries(client, url) for name, url in pages.items() if name != "board"}
    small["board"] = count_queries(client, "/")

    print(
        f"\n{'page':<20} {'median ms':>10} {'p95 ms':>8} {'queries':>8} "
        f"{'queries (small)':>16} {'HTML KB':>8}  verdict"
    )
    passed = True
    for name, result in results.items():
        median_ms = statistics.median(result["times"]) * 1000
        p95_ms = p95(result["times"]) * 1000
        small_queries = one_job_queries if name.startswith("release") else small[name]
        ok = p95_ms < args.limit_ms and result["queries"] == small_queries
        passed &= ok
        print(
            f"{name:<20} {median_ms:10.1f} {p95_ms:8.1f} {result['queries']:8d} "
            f"{small_queries:16d} {len(result['html']) / 1024:8.1f}  {'PASS' if ok else 'FAIL'}"
        )
    board_kb_per_50 = len(results["board"]["html"]) / 1024 * 50 / max(board_rows, 1)
    html_ok = board_kb_per_50 < args.board_kb_per_50
    passed &= html_ok
    print(
        f"\nboard HTML: {len(results['board']['html']) / 1024:.1f} KB for {board_rows} releases, "
        f"{board_kb_per_50:.1f} KB per 50  {'PASS' if html_ok else 'FAIL'}"
    )
    print(
        "queries (small): the board and reports/pools at "
        f"{SMALL_BOARD_RELEASES} releases, the release page with 1 job"
    )
    print(
        f"{'PASS' if passed else 'FAIL'} ({connection.vendor}, {args.runs} runs per page): "
        f"p95 under {args.limit_ms:g} ms, constant query counts, board HTML under "
        f"{args.board_kb_per_50:g} KB per 50 releases"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
