# flashgen bench --random (issue 23, item 4) on a GPU within one call: the
# drawn specs are first compiled in parallel (flashgen's modules and kernels,
# FlexAttention's graphs: the Triton and Inductor caches then hold them), and
# then benched one after another in one process, as `flashgen bench --random`
# runs, with the caches warm.  The timing phase has the machine to itself.
#   bash scripts/gpu_random_bench.sh N SEED "HEAD_DIMS" [SEQLEN] [WORKERS]
# Records go to $OUT/random.jsonl; $RANDOM_FIRST (default 0) and $RANDOM_LAST
# (default N-1) bench a slice of the N drawn specs, $SYSTEMS the systems
# (default: flashgen flex).
source scripts/gpu_env.sh
n=$1 seed=$2 dims=$3 seqlen=${4:-4096} workers=${5:-8}
first=${RANDOM_FIRST:-0} last=${RANDOM_LAST:-$((n - 1))}
start=$SECONDS
names=$(seq "$first" "$last" | sed "s/^/rand${seed}_/")
systems=${SYSTEMS:-flashgen flex}
# shellcheck disable=SC2086
printf '%s\n' $names | xargs -P "$workers" -I{} sh -c \
  "s=\$(date +%s); python3 -m flashgen bench --random $n --seed $seed --name {} --head-dim $dims \
   --seqlens $seqlen --systems $systems > /tmp/warm_{}.log 2>&1 \
   && echo 'warm {}:' \$((\$(date +%s) - s)) s || echo 'warm-up {} failed:' \$(tail -3 /tmp/warm_{}.log)"
echo "warm-up: $((SECONDS - start)) s"
# The record: one `flashgen bench --random` process over the slice, as a user runs it.
# shellcheck disable=SC2086
python3 -m flashgen bench --random "$n" --seed "$seed" --name $names --head-dim $dims \
  --seqlens "$seqlen" --systems $systems --jsonl "$OUT/random.jsonl" > "$OUT/random_record.log" 2>&1
grep -A80 "^flashgen / Flex" "$OUT/random_record.log" || tail -20 "$OUT/random_record.log"
echo "benched: $((SECONDS - start)) s"
python3 - "$OUT/random.jsonl" <<'PY'
import json, statistics, sys
from collections import defaultdict
points = defaultdict(dict)
for line in open(sys.argv[1]):
    r = json.loads(line)
    points[(r["spec"], r["D"], r["Nq"])][(r["system"], r["direction"])] = r
ratios = {"forward": [], "backward": []}
for key, got in sorted(points.items()):
    cells = []
    for pass_, direction, field in (("forward", "fwd", "ms"), ("backward", "fwd+bwd", "bwd_ms")):
        ours, flex = got.get(("flashgen", direction)), got.get(("flex", direction))
        if ours and flex and ours.get(field) and flex.get(field):
            ratios[pass_].append(flex[field] / ours[field])
            cells.append(f"{pass_} {flex[field] / ours[field]:.2f}")
        else:
            cells.append(f"{pass_} -")
    paced = got.get(("flashgen", "fwd+bwd"), {}).get("host_paced")
    print(*key, *cells, "host-paced" if paced else "")
for pass_, values in ratios.items():
    if values:
        print(f"{pass_}: {len(values)} points, median {statistics.median(values):.2f}, "
              f"min {min(values):.2f}, below 1.0: {sum(x < 1 for x in values)}")
PY
