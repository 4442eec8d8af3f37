"""Inbound generic webhooks under load: 1,000 signed deliveries, 30% of them duplicates, against
a running server on loopback (gunicorn, PostgreSQL, Redis), as release-day tooling sends them.

Creates a fresh PostgreSQL database, migrates it, makes a generic endpoint with
`create_webhook_endpoint`, starts gunicorn on a free port and posts the deliveries (signed with
the `standardwebhooks` library before the clock starts) from `--clients` concurrent clients;
each duplicate repeats the `webhook-id` and body of an earlier delivery, some while the first is
still in flight. Then it counts the jobs and deliveries in the database.

Prints deliveries/s and the p50/p99 response time (client-side wall time per request,
time.perf_counter), and PASS/FAIL: the jobs must number exactly the distinct ids and every
duplicate must be answered as one, and the p99 must stay under 100 ms. Exit status 0/1.
Stage messages land on a Redis database that is emptied at the end; no worker runs.

    .venv/bin/python benchmarks/webhooks.py [--deliveries 1000] [--duplicates 0.3] [--clients 2]

PostgreSQL (postgres@127.0.0.1:5432, trust auth) and Redis (127.0.0.1:6379) must be running
(`.ci/run` starts them). Override with `--postgres URL` / `--redis URL`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg
import redis
from standardwebhooks.webhooks import Webhook

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
P99_LIMIT_S = 0.100
DATABASE = "day0_bench_webhooks"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fresh_database(admin_url: str) -> str:
    """Drop and create the benchmark database; return its URL."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    return admin_url.rsplit("/", 1)[0] + f"/{DATABASE}"


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def wait_until_up(base_url: str, server: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"gunicorn exited with {server.returncode}")
        try:
            httpx.get(base_url + "/accounts/login/", timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    sys.exit("gunicorn did not answer within a minute")


def signed_deliveries(
    secret: str, count: int, duplicate_share: float, seed: int
) -> tuple[list[tuple[bytes, dict[str, str]]], int]:
    """`count` signed requests, `duplicate_share` of them repeats of earlier ones (same id,
    same body, same signature: a retried delivery). Returns them in send order and the number
    of distinct ids."""
    rng = random.Random(seed)
    signer = Webhook(secret)
    distinct = count - round(count * duplicate_share)
    originals: list[tuple[bytes, dict[str, str]]] = []
    now = datetime.now(tz=UTC)
    for i in range(distinct):
        body = json.dumps(
            {"repo_id": f"bench-org/model-{i % 50}", "revision": f"{i:040x}", "stages": ["fetch"]}
        ).encode()
        msg_id = f"msg_bench_{seed}_{i}"
        headers = {
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": signer.sign(msg_id, now, body.decode()),
            "content-type": "application/json",
        }
        originals.append((body, headers))
    order = list(originals)
    for _ in range(count - distinct):
        # A repeat lands a little after its original: some overlap it in flight.
        position = rng.randrange(len(order))
        original = order[rng.randrange(position + 1)]
        order.insert(min(position + rng.randrange(1, 6), len(order)), original)
    return order, distinct


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=1000)
    parser.add_argument("--duplicates", type=float, default=0.3)
    # Two senders: the load generator shares the machine's 2 cores with gunicorn, PostgreSQL
    # and Redis; at 4 the cores are saturated (~90 deliveries/s) and p99 measures queueing.
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker")
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    var_dir = tempfile.mkdtemp(prefix="day0-bench-webhooks-")
    env = {
        **os.environ,
        "DATABASE_URL": fresh_database(args.postgres),
        "CELERY_BROKER_URL": args.redis,
        "DATABASE_CONN_MAX_AGE": "60",
        "DAY0_VAR_DIR": var_dir,
        "LOG_LEVEL": "WARNING",
        "DEBUG": "0",
    }
    redis.Redis.from_url(args.redis).flushdb()
    manage(env, "migrate", "--noinput")
    created = json.loads(
        manage(
            env,
            "create_webhook_endpoint",
            "--kind",
            "generic",
            "--name",
            "bench",
            "--format",
            "json",
        )
    )
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "gunicorn",
            "day0web.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(args.workers),
            "--worker-class",
            "gthread",
            "--threads",
            str(args.threads),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        wait_until_up(base_url, server)
        deliveries, distinct = signed_deliveries(
            created["secret"], args.deliveries, args.duplicates, args.seed
        )
        url = base_url + created["url"]
        latencies: list[float] = []
        statuses: dict[int, int] = {}
        verdicts: dict[str, int] = {}

        def post(client: httpx.Client, body: bytes, headers: dict[str, str]) -> None:
            start = time.perf_counter()
            response = client.post(url, content=body, headers=headers)
            latencies.append(time.perf_counter() - start)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            verdict = response.json().get("verdict", "?")
            verdicts[verdict] = verdicts.get(verdict, 0) + 1

        clients = [httpx.Client(timeout=30) for _ in range(args.clients)]
        # Warm each gunicorn worker (imports, first connection) before the clock starts.
        for client in clients:
            client.get(base_url + "/accounts/login/")
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.clients) as pool:
            for i, (body, headers) in enumerate(deliveries):
                pool.submit(post, clients[i % args.clients], body, headers)
        elapsed_s = time.perf_counter() - started
        for client in clients:
            client.close()
    finally:
        server.terminate()
        server.wait(timeout=30)

    with psycopg.connect(env["DATABASE_URL"]) as conn:
        jobs = conn.execute("SELECT count(*) FROM adaptation_adaptationjob").fetchone()[0]
        stored = conn.execute("SELECT count(*) FROM adaptation_webhookdelivery").fetchone()[0]
        duplicates = conn.execute(
            "SELECT count(*) FROM adaptation_webhookdelivery WHERE verdict = 'duplicate'"
        ).fetchone()[0]
    redis.Redis.from_url(args.redis).flushdb()

    ordered = sorted(latencies)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    print(f"deliveries sent      {len(deliveries)} ({len(deliveries) - distinct} duplicates)")
    print(f"responses            {dict(sorted(statuses.items()))}  verdicts {verdicts}")
    print(f"deliveries stored    {stored}")
    print(f"jobs created         {jobs} (expected {distinct})")
    print(f"duplicates answered  {duplicates} (expected {len(deliveries) - distinct})")
    print(
        f"throughput           {len(deliveries) / elapsed_s:.0f} deliveries/s "
        f"({args.clients} clients, gunicorn {args.workers}x{args.threads} threads)"
    )
    print(
        f"response time        p50 {p50 * 1000:.1f} ms  p99 {p99 * 1000:.1f} ms "
        f"(limit {P99_LIMIT_S * 1000:.0f} ms)"
    )
    ok = (
        jobs == distinct
        and duplicates == len(deliveries) - distinct
        and stored == len(deliveries)
        and p99 < P99_LIMIT_S
    )
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
