"""The board's columns from the rungs run.sh wrote (target/bench/board.jsonl): a table, and each
gateway's ratio to bare Pingora's figure on every column."""
import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
targets = list(dict.fromkeys(r["target"] for r in rows))
BOUNDS_MS = [1, 5, 10, 50, 100]


def of(phase, target):
    return [r for r in rows if r["phase"] == phase and r["target"] == target]


def clean(r):
    return r["result"]["errors"] == 0 and r["result"]["non2xx"] == 0 and r["result"]["requests"] > 0


def best(phase, target, bound_us=None):
    """The rung of most requests/s with no failure (and p99 under the bound)."""
    ok = [r for r in of(phase, target) if clean(r) and (bound_us is None or r["result"]["p99_us"] < bound_us)]
    return max(ok, key=lambda r: r["result"]["rps"], default=None)


def stall_free(target):
    """The highest rung of the stream ladder below which every rung held every stream."""
    top = None
    for r in sorted(of("streams", target), key=lambda r: r["c"]):
        if r["result"]["stalled"] or r["result"]["failed"]:
            break
        top = r
    return top


col = {}
direct_p99 = statistics.median(r["result"]["p99_us"] for r in of("c1", "direct")) if of("c1", "direct") else None
for t in targets:
    c1 = of("c1", t)
    p99 = statistics.median(r["result"]["p99_us"] for r in c1) if c1 else None
    p50 = statistics.median(r["result"]["p50_us"] for r in c1) if c1 else None
    mx = best("max", t)
    sus = best("sustained", t, 1_000_000)
    sf = stall_free(t)
    ttfe = {r["c"]: r["result"]["ttft_ms"] for r in of("ttfe", t)}
    col[t] = {
        "p50_c1_us": p50,
        "p99_c1_us": p99,
        "added_p99_us": None if p99 is None or direct_p99 is None or t == "direct" else p99 - direct_p99,
        "sustained_rps": sus and sus["result"]["rps"],
        "max_rps": mx and mx["result"]["rps"],
        "max_at_c": mx and mx["c"],
        "cpu_us_per_request": None if t == "direct" else mx and mx["result"].get("cpu_us_per_request"),
        "frontier": {b: (lambda r: r and r["result"]["rps"])(best("max", t, b * 1000)) for b in BOUNDS_MS},
        "stall_free_streams": sf and sf["c"],
        "frames_per_s": sf and sf["result"]["events_per_s"],
        "ttfe_ms": ttfe,
    }


def f(v, fmt="{:,.0f}"):
    return "—" if v is None else fmt.format(v)


print()
print("| target | p99 c=1 µs | added p99 µs | sustained req/s (20 ms, p99<1 s) | max req/s (at c) | CPU µs/req at max | "
      + " | ".join(f"p99<{b} ms" for b in BOUNDS_MS) + " | stall-free streams | TTFE c=1 p50/p99 ms | TTFE c=8 p50/p99 ms |")
print("|" + "---|" * (9 + len(BOUNDS_MS)))
for t, c in col.items():
    ttfe = lambda k: "—" if k not in c["ttfe_ms"] else f"{c['ttfe_ms'][k]['p50']:.3f} / {c['ttfe_ms'][k]['p99']:.3f}"
    keys = sorted(c["ttfe_ms"])
    print(f"| {t} | {f(c['p99_c1_us'])} | {f(c['added_p99_us'])} | {f(c['sustained_rps'])} | {f(c['max_rps'])} ({f(c['max_at_c'])}) | "
          f"{f(c['cpu_us_per_request'], '{:.1f}')} | " + " | ".join(f(c["frontier"][b]) for b in BOUNDS_MS)
          + f" | {f(c['stall_free_streams'])} | {ttfe(1)} | {ttfe(keys[-1]) if keys and keys[-1] != 1 else '—'} |")

if "bare" in col:
    b = col["bare"]
    print("\nagainst bare Pingora (ratio; for latency and CPU lower is better, for the rest higher):")
    for t, c in col.items():
        if t in ("bare", "direct"):
            continue

        def ratio(x, y):
            return "—" if x is None or y in (None, 0) else f"{x / y:.2f}"
        tt = {k: (ratio(c["ttfe_ms"].get(k, {}).get("p50"), b["ttfe_ms"].get(k, {}).get("p50")),
                  ratio(c["ttfe_ms"].get(k, {}).get("p99"), b["ttfe_ms"].get(k, {}).get("p99"))) for k in b["ttfe_ms"]}
        print(f"  {t}: added p99 {ratio(c['added_p99_us'], b['added_p99_us'])}, sustained {ratio(c['sustained_rps'], b['sustained_rps'])}, "
              f"max {ratio(c['max_rps'], b['max_rps'])}, CPU/req {ratio(c['cpu_us_per_request'], b['cpu_us_per_request'])}, "
              f"stall-free {ratio(c['stall_free_streams'], b['stall_free_streams'])}, "
              + ", ".join(f"TTFE c={k} p50 {v[0]} p99 {v[1]}" for k, v in tt.items()))
print("\n" + json.dumps(col))
