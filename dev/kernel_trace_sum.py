"""Summarize dev/cuda/kernel_trace.c's CSV: the decode steps (from one embedding kernel to the next),
the share of each kernel and of the gaps between kernels. python3 dev/kernel_trace_sum.py trace.csv [steps [first kernel]]"""
import collections, csv, statistics, sys

rows = sorted((int(r['start_ns']), int(r['end_ns']), r['name']) for r in csv.DictReader(open(sys.argv[1])))
last = int(sys.argv[2]) if len(sys.argv) > 2 else 20
mark = sys.argv[3] if len(sys.argv) > 3 else 'gather_kernel'  # the step's first kernel: the embedding
starts = [i for i, r in enumerate(rows) if mark in r[2]]
steps = list(zip(starts[:-1], starts[1:]))[-last:]
agg = collections.defaultdict(list)
spans, gaps, busy = [], [], []
for a, b in steps:
    spans.append(rows[b][0] - rows[a][0])
    busy.append(sum(e - s for s, e, _ in rows[a:b]))
    for i in range(a, b):
        agg[rows[i][2][:80]].append(rows[i][1] - rows[i][0])
        nxt = rows[i + 1][0]
        gaps.append(max(0, nxt - rows[i][1]))
n = len(steps)
step = statistics.median(spans)
print(f"{n} steps: median {step / 1e3:.1f} us, {min(b - a for a, b in steps)}-{max(b - a for a, b in steps)} kernels a step, busy {statistics.median(busy) / 1e3:.1f} us, "
      f"gaps {sum(gaps) / n / 1e3:.1f} us a step (median gap {statistics.median(gaps) / 1e3:.2f} us)")
for nm, ds in sorted(agg.items(), key=lambda kv: -sum(kv[1]))[:20]:
    print(f"{100 * sum(ds) / n / step:5.1f}%  {len(ds) / n:5.0f} a step  {statistics.mean(ds) / 1e3:6.2f} us  {nm}")
