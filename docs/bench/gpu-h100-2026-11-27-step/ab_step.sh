# A/B on the GPU: morserve-base (023ef6b, per-layer runner calls) vs morserve (segment calls,
# runner-held states, GatedAdd, reserved buffers), same models, two rounds in alternating order.
set -u
b=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/tmp/l/lib
mkdir -p /tmp/l && tar xzf "$b/libs.tgz" -C /tmp/l
m=/tmp/m; log=$OUT/ab.log; j=/tmp/j; mkdir -p $j
s="--hidden 960 --heads 15 --kv-heads 5 --intermediate 2560 --vocab 49152 --layers 32 --max-pos 1024"
nvidia-smi -L | tee "$log"
"$b/morserve" mkmodel --family vanilla $s --out $m/v >>"$log" 2>&1 &
"$b/morserve" mkmodel --family mor-ec --recursions 3 --capacity 1,0.67,0.33 $s --out $m/m3 >>"$log" 2>&1 &
"$b/morserve" mkmodel --family mor-ec --sharing cycle --recursions 4 --capacity 1,0.75,0.5,0.25 $s --out $m/m4 >>"$log" 2>&1 &
wait
for r in 1 2; do
  order="base new"; [ $r = 2 ] && order="new base"
  for w in $order; do
    [ $SECONDS -gt ${STOP_S:-330} ] && { echo "=== skipped round $r $w (time)" >>"$log"; continue; }
    e=$b/morserve; [ $w = base ] && e=$b/morserve-base
    echo "=== round $r $w b1" >>"$log"
    timeout 60 "$e" bench --device cuda --models $m/v,$m/m3 --batches 1 --requests 4 --mean-tokens 64 \
      --std-tokens 0 --prompt-len 512 --warmup 1 --modes depth --kv-cache-mb 4096 --membw-mb 0 \
      --out "$j/b1-$w-$r.json" >>"$log" 2>&1
    echo "=== round $r $w b32,256 rc=$?" >>"$log"
    timeout 100 "$e" bench --device cuda --models $m/m4,$m/m3,$m/v --requests ${REQ:-512} --mean-tokens 128 \
      --std-tokens 32 --kv-cache-mb 16384 --membw-mb 0 --batches 32,256 --out "$j/bb-$w-$r.json" >>"$log" 2>&1
    echo "=== rc=$? at ${SECONDS}s" >>"$log"
  done
done
tar czf $OUT/ab-json.tgz -C $j .
grep -E '^===|depth|sequence' "$log" | grep -v '^\[' | head -80
