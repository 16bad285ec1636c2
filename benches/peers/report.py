"""Prints scripts/bench-peers' table from its RESULT lines.

    python report.py RESULTS_FILE N ROUNDS "LOAD AT START" "LOAD AT END" HEADER...

RESULTS_FILE has one line per contender run: `<round> RESULT <name> <seconds>
<client cpu> <sidecar cpu> <redis cpu>`.
"""

from __future__ import annotations

import statistics
import sys

#: (name, description), in the table's order. The echomq-py and echomq-go
#: contenders use their client's defaults (issue 27: "with every client's
#: defaults"); the `-1024` ones fix max_in_flight at 1024, as a user who tunes
#: would. echomq-rs has no client library: it drives the raw tonic stubs with
#: explicit settings.
CONTENDERS = [
    ("redispy-batched", "redis-py, XREADGROUP COUNT 100 + one XACK per read (hiredis)"),
    ("redispy-naive", "redis-py, one at a time: COUNT 1 + one XACK per entry (hiredis)"),
    ("echomq-py", "echomq.Consumer (Python) through the sidecar, its defaults (adaptive window up to 1024, 64 handlers)"),
    ("echomq-py-1024", "echomq.Consumer (Python) through the sidecar, max_in_flight fixed at 1024"),
    ("go-redis", "go-redis, XREADGROUP COUNT 256 + one XACK per read"),
    ("watermill", "Watermill redisstream subscriber, its defaults"),
    ("echomq-go", "echomq Go client through the sidecar, its defaults (adaptive window up to 1024, 64 handlers)"),
    ("echomq-go-1024", "echomq Go client through the sidecar, MaxInFlight fixed at 1024"),
    ("rust-direct", "redis crate (tokio), XREADGROUP COUNT 256 + one XACK per read"),
    (
        "echomq-rs",
        "raw tonic stubs (no client library) through the sidecar, explicit settings:"
        " max_in_flight 1024, max_batch 256, one Ack per frame",
    ),
]

#: (ours, peer): the ratios printed. Defaults against the peers first (what a
#: user who sets nothing gets), then what tuning adds.
RATIOS = [
    ("echomq-py", "redispy-batched"),
    ("echomq-go", "go-redis"),
    ("echomq-go", "watermill"),
    ("echomq-rs", "rust-direct"),
    ("echomq-py", "echomq-py-1024"),
    ("echomq-go", "echomq-go-1024"),
]


def thousands(x: float) -> str:
    return f"{x:,.0f}"


def main() -> None:
    path, n, rounds, load0, load1 = sys.argv[1:6]
    header = sys.argv[6:]
    n_entries = int(n)
    runs: dict[str, list[tuple[int, float, float, float, float]]] = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 7 or parts[1] != "RESULT":
                continue
            rnd, _, name, secs, client, sidecar, redis_cpu = parts
            runs.setdefault(name, []).append(
                (int(rnd), float(secs), float(client), float(sidecar), float(redis_cpu))
            )

    # Through the baseline sidecar (ECHOMQ_BENCH_BASELINE_BIN), when it ran.
    contenders = list(CONTENDERS)
    ratios = list(RATIOS)
    for name, desc in CONTENDERS:
        if f"{name}-base" in runs:
            contenders.append((f"{name}-base", f"{name} through the baseline sidecar"))
            ratios.append((name, f"{name}-base"))

    for line in header:
        print(line)
    print(f"  load     {load0} at start, {load1} at end (1, 5, 15 min)")
    print(f"  entries  {n_entries} per contender and round, 100-byte body; {rounds} round{'s' if rounds != '1' else ''}, order rotated each round")
    print()
    name_w = max(len(name) for name, _ in contenders)
    print(
        f"  {'contender':<{name_w}}  {'median/s':>9}  {'each round (entries/s)':<32}"
        f"  {'CPU s: client':>13} {'sidecar':>7} {'redis':>6}  {'CPU µs/entry':>12}"
    )
    medians: dict[str, float] = {}
    for name, _ in contenders:
        got = sorted(runs.get(name, []))
        if not got:
            continue
        rates = [n_entries / secs for _, secs, *_ in got]
        medians[name] = statistics.median(rates)
        each = " ".join(f"{thousands(r):>9}" for r in rates)
        cpu = [statistics.median(run[i] for run in got) for i in (2, 3, 4)]
        print(
            f"  {name:<{name_w}}  {thousands(medians[name]):>9}  {each:<32}"
            f"  {cpu[0]:>13.2f} {cpu[1]:>7.2f} {cpu[2]:>6.2f}  {sum(cpu) / n_entries * 1e6:>12.1f}"
        )
    print()
    print("  ratios (medians)")
    for ours, peer in ratios:
        if ours in medians and peer in medians:
            print(f"    {ours} / {peer}: {medians[ours] / medians[peer]:.2f}")
    print()
    print("  CPU s: medians over the rounds of the CPU time each process spent in the contender's timed window")
    print("  (client: the contender's own process; the sidecar idles during the direct contenders);")
    print("  CPU µs/entry: the three added up, per entry.")
    for name, desc in contenders:
        print(f"    {name:<{name_w}}  {desc}")
    print("  The Rust pair's latency and the sidecar's memory: `cargo bench --bench consume`.")


if __name__ == "__main__":
    main()
