# Prints run.sh's JSON as one line per label and measurement: tokens/s per round (batch-1 with
# its fraction of the read bandwidth; prefill with GFLOP/s and fractions of the fp32 FMA and bf16
# dot-product peaks), then the limits measured by the batch-1 runs.
import collections, glob, json, sys

T = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + '/*-r*.json')):
    label, what, _ = f.split('/')[-1][:-5].rsplit('-', 2)
    d = json.load(open(f))
    if what == 'prefill':
        for p in d['prefill']:
            T[(label, what)].append((round(p['prefill_tokens_per_s'], 1), round(p['linear_gflops'], 1),
                                     round(p['fma_fraction'], 3),
                                     round(p.get('bf16_dot_fraction') or 0, 3)))
        continue
    for run in d['runs']:
        s = run['stats']
        frac = s.get('weight_bw_fraction')
        T[(label, what)].append((round(s['tokens_per_s'], 1), round(frac, 3) if frac else None))
    if d.get('read_bandwidth'):
        rb = d['read_bandwidth']
        T[('limits', label)].append((round(rb['read_bandwidth_gbs'], 1), round(rb['fma_gflops']),
                                     round(rb.get('bf16_dot_gflops', 0))))
for k in sorted(T):
    print(k, T[k])
