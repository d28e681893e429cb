#!/usr/bin/env bash
# The GPU proof in one call: everything a lent device (an H100 or H200 with torch preinstalled
# and no network) should run, in under 9 minutes, writing its tables as it goes so a cut-off
# run still returns rows.
#
#   1. the CUDA-marked tests (the memory model against max_memory_allocated, offloading,
#      Inductor modes, compiled autograd);
#   2. the compiled-program memory model against the measured peak, on the device
#      (compiled_memory_bench.py: the zoo GPT at five budgets, beside the tests);
#   3. GPT-2 size training (gpu_train_bench.py, each variant in its own process, cold caches):
#      eager, Inductor at torch's budgets 1.0 and 0.5, ours at 0.5, and ours under two peak
#      caps (80% and 60% of the uncapped peak, priced by the Inductor model); predicted and
#      measured peak per row.
#
# Prepare here (our wheels travel; the machine has torch, transformers, pytest, scipy):
#   uv build --all-packages -o .whl-proof      # .whl-proof/ is git-ignored
# then run there, carrying .whl-proof:
#   bash benchmarks/gpu_proof.sh               # results under $OUT (or benchmarks/out/gpu_proof)
# On CPU, as CI's smoke test runs it (tiny sizes, no CUDA tests):
#   bash benchmarks/gpu_proof.sh --device cpu --size tiny
set -uo pipefail
cd "$(dirname "$0")/.."

device=cuda
size=full
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    *) echo "gpu_proof.sh: unknown argument $1 (use --device cuda|cpu, --size full|tiny)" >&2
       exit 2 ;;
  esac
done
case "$device" in cuda|cpu) ;; *) echo "gpu_proof.sh: --device must be cuda or cpu" >&2; exit 2 ;; esac
case "$size" in full|tiny) ;; *) echo "gpu_proof.sh: --size must be full or tiny" >&2; exit 2 ;; esac

out=${OUT:-benchmarks/out/gpu_proof}
mkdir -p "$out"
python=${PYTHON:-python3}
if [ -d .whl-proof ] && ls .whl-proof/*.whl >/dev/null 2>&1; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/aot-site .whl-proof/*.whl || exit 1
  export PYTHONPATH=/tmp/aot-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
status=0
step() { echo "== $(date -u +%H:%M:%S) $*"; }

# Tiny (the CPU smoke test): the same steps on fewer cells and variants, to keep CI short.
if [ "$size" = tiny ]; then
  steps=1; warmup=1; per_variant=600; bench_cells=--smoke
  variants=eager,ours@1.0+peakfrac=0.8
else
  steps=10; warmup=2; per_variant=120; bench_cells=
  variants=eager,inductor@1.0,inductor@0.5,ours@0.5,ours@1.0+peakfrac=0.8,ours@1.0+peakfrac=0.6
fi

# The memory-model table (small models, memory only) runs beside the tests; the training
# rows, which report time, run alone afterwards.
step "compiled-program memory model: predicted vs measured ($device), in the background"
timeout 240 "$python" benchmarks/compiled_memory_bench.py --device "$device" --models zoo-gpt \
    $bench_cells --out "$out" > "$out/compiled_memory_bench.log" 2>&1 &
bench=$!
if [ "$device" = cuda ]; then
  step "CUDA-marked tests"
  timeout 180 "$python" -m pytest -q -p no:cacheprovider -m cuda \
      tests/aot_partition/test_inductor_memory.py tests/aot_partition/test_offload_cuda.py \
      tests/aot_partition/test_estimators.py tests/aot_pipeline/test_pipeline_inductor.py \
      tests/aot_pipeline/test_pipeline_modes.py 2>&1 | tee "$out/cuda_tests.log" || status=1
fi
wait "$bench" || status=1
cat "$out/compiled_memory_bench.md" 2>/dev/null

step "GPT-2 size training: eager, Inductor, ours, ours under two peak caps ($size)"
"$python" benchmarks/gpu_train_bench.py --device "$device" --size "$size" --models gpt2 \
    --variants "$variants" \
    --steps "$steps" --warmup "$warmup" --timeout "$per_variant" --out "$out" \
    > "$out/gpu_train_bench.log" 2>&1 || status=1
cat "$out/gpu_train_bench.md" 2>/dev/null
step "done (status $status); tables in $out"
exit "$status"
