"""The batch import rate against a real `memgate serve`, beside single writes, audit on.

    .venv/bin/python -m bench.batch_import [--memories 5000] [--batch 500] [--singles 500]
        [--seconds 240]

Starts `memgate serve` on a fresh embedded PostgreSQL (bench/http_load.py `served`, one worker),
makes an agent (README "First steps"), then from one client:

- writes `--memories` memories in batches of `--batch` through `POST /v1/memories:batch`
  (each under an `Idempotency-Key`, as `memgate import` sends them);
- writes `--singles` memories one `POST /v1/memories` at a time.

Every call appends its audit row in its own transaction (audit is always on). It prints
memories/s of each, the median and p95 seconds per batch (and per single write), and the ratio
of the rates. Both loops stop at `--seconds` each, whatever is left: the counts printed are the
ones written.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import httpx

from bench.http_load import HERE, agent_token, served


def _item(i: int, run: str) -> dict[str, object]:
    return {
        "subject": f"user:{i % 101}",
        "kind": "fact",
        "key": f"{run}.{i}",
        "value": f"imported memory {i}: the customer prefers invoices in {i % 12 + 1} parts",
        "new_key": True,
    }


def _p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def batches(http: httpx.Client, memories: int, size: int, budget: float) -> tuple[int, list[float]]:
    written, took, deadline = 0, [], time.monotonic() + budget
    while written < memories and time.monotonic() < deadline:
        items = [_item(written + i, "batch") for i in range(min(size, memories - written))]
        started = time.perf_counter()
        answer = http.post(
            "/v1/memories:batch",
            json={"items": items},
            headers={"Idempotency-Key": str(uuid.uuid4())},
        )
        took.append(time.perf_counter() - started)
        answer.raise_for_status()
        written += answer.json()["count"]
    return written, took


def singles(http: httpx.Client, memories: int, budget: float) -> tuple[int, list[float]]:
    written, took, deadline = 0, [], time.monotonic() + budget
    while written < memories and time.monotonic() < deadline:
        started = time.perf_counter()
        answer = http.post("/v1/memories", json=_item(written, "single"))
        took.append(time.perf_counter() - started)
        answer.raise_for_status()
        written += 1
    return written, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--singles", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=240.0)
    args = parser.parse_args()
    with served(HERE, 1) as server:
        token = agent_token(server)
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=300) as http:
            http.post("/v1/memories:batch", json={"items": [_item(0, "warm")]}).raise_for_status()
            started = time.perf_counter()
            in_batches, per_batch = batches(http, args.memories, args.batch, args.seconds)
            batch_rate = in_batches / (time.perf_counter() - started)
            started = time.perf_counter()
            one_by_one, per_single = singles(http, args.singles, args.seconds)
            single_rate = one_by_one / (time.perf_counter() - started)
    print(f"{'path':<24} {'memories':>8} {'per s':>8} {'median s':>9} {'p95 s':>8}")
    print(
        f"{'batch of ' + str(args.batch):<24} {in_batches:>8} {batch_rate:>8.0f} "
        f"{statistics.median(per_batch):>9.3f} {_p95(per_batch):>8.3f}"
    )
    print(
        f"{'single writes':<24} {one_by_one:>8} {single_rate:>8.0f} "
        f"{statistics.median(per_single):>9.4f} {_p95(per_single):>8.4f}"
    )
    print(f"batch / single rate: {batch_rate / single_rate:.1f}x (audit on: one row per call)")


if __name__ == "__main__":
    main()
