# The Gluon against the Triton backward on drawn specs (issue 23, item 3):
# flashgen alone, benched with its default plan and with
# --plan gluon_backward=off, spec by spec, so that kernel_choice's rule can be
# placed from measurements rather than from the examples.
#   bash scripts/gpu_backward_choice.sh N SEED DIM [SEQLEN] [FIRST] [LAST]
# Records go to $OUT/choice.jsonl (the plan knob in each record's command);
# the end prints each spec's backward time with both kernels.
source scripts/gpu_env.sh
n=$1 seed=$2 dim=$3 seqlen=${4:-4096} first=${5:-0} last=${6:-$(($1 - 1))}
names=$(seq "$first" "$last" | sed "s/^/rand${seed}_/")
for plan in default gluon_backward=off; do
  # shellcheck disable=SC2046,SC2086
  python3 -m flashgen bench --random "$n" --seed "$seed" --name $names --head-dim "$dim" \
    --seqlens "$seqlen" --systems flashgen $([ "$plan" = default ] || echo --plan "$plan") \
    --jsonl "$OUT/choice.jsonl" 2>&1 | grep -E "^(rand|  *rand)|rror" | head -80
done
python3 - "$OUT/choice.jsonl" <<'PY'
import collections, json, sys

times = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["direction"] != "fwd+bwd" or r.get("bwd_ms") is None:
        continue
    plan = "triton" if "gluon_backward=off" in r["command"] else "gluon"
    times[(r["spec"], r["D"])][plan] = r["bwd_ms"]
print("spec D gluon_bwd_ms triton_bwd_ms triton/gluon_speed")
for (spec, d), t in sorted(times.items()):
    if len(t) == 2:
        print(spec, d, f"{t['gluon']:.3f}", f"{t['triton']:.3f}", f"{t['gluon'] / t['triton']:.2f}")
PY
