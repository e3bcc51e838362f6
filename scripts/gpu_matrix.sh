#!/usr/bin/env bash
# The whole `flashgen bench` matrix in one device call on a machine of one or
# more GPUs: every spec at each head dim, N = $SEQLENS, against FlexAttention
# and cuDNN.
#
#   [SPECS="..."] [SEQLENS="1024 4096 16384"] [PROBE="spec:d:N ..."] \
#       bash scripts/gpu_matrix.sh SECONDS HEAD_DIM [HEAD_DIM...]
#
# 1. Warm-up: one process per (spec, head dim), all in parallel, runs every
#    case once without timing, which fills Triton's and torch.compile's
#    on-disk caches (compiling is most of a cold bench's time).
# 2. Timing: head dim i on GPU i mod (number of GPUs), head dims of one GPU
#    one after another, each spec in its own process (a fresh torch._dynamo),
#    so nothing else runs on a GPU while it is timed.  PROBE cases
#    (scripts/bench_probe.py) run first on the GPU of the last head dim.
# Per-spec JSON is merged into $OUT/bench_d<D>.json; logs into $OUT/gpu<G>.log,
# GPU clocks and power into $OUT/clocks.csv.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
seconds=$1
shift
end=$((SECONDS + seconds))
specs=${SPECS:-examples/*.attn}
seqlens=${SEQLENS:-1024 4096 16384}
gpus=$(nvidia-smi -L | wc -l)
systems="flashgen flex sdpa-cudnn"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 1000 >"$OUT/clocks.csv" 2>/dev/null &
clocks=$!

warm_py='
import sys
from flashgen import bench
from flashgen.cli import _check_sources, _read
variants, _ = _check_sources(_read([sys.argv[1]]))
once = lambda fn: (fn(), 1.0)[1]
bench.bench(variants, seqlens=[int(n) for n in sys.argv[3:]], head_dim=int(sys.argv[2]),
            timer=once, systems=("flashgen", "flex"), progress=False)
'
i=0
for d in "$@"; do
  for spec in $specs; do
    CUDA_VISIBLE_DEVICES=$((i % gpus)) TORCHINDUCTOR_COMPILE_THREADS=2 timeout $((seconds / 2)) python3 -c "$warm_py" "$spec" "$d" \
      $seqlens >/dev/null 2>"$OUT/warm_$(basename "$spec" .attn)_$d.err" &
    i=$((i + 1))
  done
done
wait $(jobs -p | grep -v "^$clocks\$")
echo "warm-up done at ${SECONDS}s"
for f in "$OUT"/warm_*.err; do
  grep -q Error "$f" && { echo "== $f"; tail -3 "$f"; }
  rm -f "$f"
done

timing() {  # head_dim gpu
  local d=$1 gpu=$2 spec name left
  for spec in $specs; do
    left=$((end - SECONDS))
    [ "$left" -gt 20 ] || { echo "d$d: out of time before $spec"; break; }
    name=$(basename "$spec" .attn)
    CUDA_VISIBLE_DEVICES=$gpu timeout "$left" python3 -m flashgen bench "$spec" --head-dim "$d" \
      --seqlens $seqlens --systems $systems --json "$OUT/part_${d}_$name.json" 2>/dev/null
    echo "d$d $name: exit $? at ${SECONDS}s"
  done
}
dims=("$@")
for ((gpu = 0; gpu < gpus && gpu < ${#dims[@]}; gpu++)); do
  (
    if [ -n "${PROBE:-}" ] && [ "$gpu" -eq $(((${#dims[@]} - 1) % gpus)) ]; then
      CUDA_VISIBLE_DEVICES=$gpu timeout $((end - SECONDS)) python3 scripts/bench_probe.py $PROBE
    fi
    for ((j = gpu; j < ${#dims[@]}; j += gpus)); do timing "${dims[j]}" "$gpu"; done
  ) >"$OUT/gpu$gpu.log" 2>&1 &
done
wait $(jobs -p | grep -v "^$clocks\$")
kill "$clocks"
python3 - "$OUT" "$@" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
for d in sys.argv[2:]:
    rows = []
    for path in sorted(glob.glob(os.path.join(out, f"part_{d}_*.json"))):
        rows += json.load(open(path))
        os.remove(path)
    json.dump(rows, open(os.path.join(out, f"bench_d{d}.json"), "w"), indent=1)
PY
cat "$OUT"/gpu*.log
