# flashgen bench --random (issue 23, item 4) on a GPU, in slices that fit one
# call: the drawn specs FIRST .. LAST of N (seed SEED) at the head dims DIMS,
# benched beside FlexAttention in one process, as `flashgen bench --random`
# runs them.  About 15 s a spec at one head dim (compiling both systems, B4
# H16 N4096, H200, 2026-12-02), so 30 specs take about 450 s.  Compiling in
# parallel first does not help: ten warm-up processes on 16 cores finished no
# spec in 300 s (each starts its own Inductor compile workers).
#   [TIMER=cuda-graph] bash scripts/gpu_random_bench.sh N SEED "DIMS" [SEQLEN] [FIRST] [LAST]
# (TIMER: flashgen bench's --timer; the drawn-spec records since 2026-12-04 take cuda-graph.)
# Records are appended to $OUT/random.jsonl; the end sums up every run there
# (scripts/benchmarks_md.py's drawn-spec table).
source scripts/gpu_env.sh
n=$1 seed=$2 dims=$3 seqlen=${4:-4096} first=${5:-0} last=${6:-$(($1 - 1))}
names=$(seq "$first" "$last" | sed "s/^/rand${seed}_/")
# shellcheck disable=SC2086
python3 -m flashgen bench --random "$n" --seed "$seed" --name $names --head-dim $dims \
  --seqlens "$seqlen" --systems flashgen flex ${TIMER:+--timer "$TIMER"} --jsonl "$OUT/random.jsonl" 2>&1 \
  | grep -A80 "^flashgen / Flex"
# Every drawn-spec run in the file, as BENCHMARKS.md sums them up.
PYTHONPATH=scripts:$PYTHONPATH python3 -c \
  "import benchmarks_md as b; print('\n'.join(b.random_table(b.load('$OUT/random.jsonl'))))"
