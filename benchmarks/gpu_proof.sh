#!/usr/bin/env bash
# The GPU proof in one call: everything a lent device (an H100 or H200 with torch preinstalled
# and no network) should run, inside a wall-clock budget (--budget-s, default 520 s), writing
# its tables as it goes so a cut-off run still returns rows.
#
#   1. GPT-2 size training (gpu_train_bench.py, each variant in its own process, cold caches):
#      eager, Inductor at torch's budgets 1.0 and 0.5, ours at 0.5, and ours under two peak
#      caps ("0.8 peak" and "0.6 peak": 80% and 60% of the uncapped peak, priced by the
#      Inductor model); predicted and measured peak per row. Started first: its rows are the
#      ones no other machine can give.
#   2. beside it, the CUDA-marked tests (the memory model against max_memory_allocated,
#      offloading, Inductor modes, the split's ops) and the compiled-program memory model
#      against the measured peak on the device (compiled_memory_bench.py); then the split
#      (split_bench.py --quick: GPT-2's head, 8 x 1024 tokens: Inductor, torch@0.5, split). Peaks are per process and unaffected;
#      step times are taken with these running beside, so they are indicative only.
#   2b. beside them (full size only), what a cap costs to compile (cap_compile_bench.py): the
#      cold first step of the built-in GPT at 2 and 8 layers under Inductor, ours uncapped and
#      ours under "0.8 peak", each in a fresh process with an empty cache.
#   3. beside them, torch's own chunkers against our split (chunkers_bench.py, each variant in
#      its own process with an empty Inductor cache; a 2-layer GPT with GPT-2's head, 8 x 1024
#      tokens): eager, Inductor, Inductor + auto_chunker, F.linear_cross_entropy compiled by
#      Inductor, ours split=8, ours under a cap of 0.7x the auto_chunker's peak. Rows are
#      written as each variant ends, so a cut-off run keeps the ones done.
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
budget_s=520
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --budget-s) budget_s=$2; shift 2 ;;
    *) echo "gpu_proof.sh: unknown argument $1 (use --device cuda|cpu, --size full|tiny, --budget-s N)" >&2
       exit 2 ;;
  esac
done
case "$device" in cuda|cpu) ;; *) echo "gpu_proof.sh: --device must be cuda or cpu" >&2; exit 2 ;; esac
case "$size" in full|tiny) ;; *) echo "gpu_proof.sh: --size must be full or tiny" >&2; exit 2 ;; esac
case "$budget_s" in ''|*[!0-9]*) echo "gpu_proof.sh: --budget-s must be a whole number of seconds" >&2
                   exit 2 ;; esac
deadline=$((SECONDS + budget_s))
left() { local n=$((deadline - SECONDS - ${1:-0})); [ "$n" -gt 5 ] && echo "$n" || echo 5; }

out=${OUT:-benchmarks/out/gpu_proof}
mkdir -p "$out"
python=${PYTHON:-python3}
# On the device our packages come as wheels (.whl-proof); on CPU, from the environment.
if [ "$device" = cuda ] && [ -d .whl-proof ] && ls .whl-proof/*.whl >/dev/null 2>&1; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/aot-site .whl-proof/*.whl || exit 1
  export PYTHONPATH=/tmp/aot-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
status=0
step() { echo "== $(date -u +%H:%M:%S) $*"; }

# Tiny (the CPU smoke test): the same steps on fewer cells and variants, to keep CI short.
if [ "$size" = tiny ]; then
  steps=1; warmup=1; per_variant=600; bench_models=zoo-gpt; bench_cells=--smoke
  variants=eager,ours@1.0+peakfrac=0.95
else
  steps=10; warmup=2; per_variant=200; bench_models=zoo-gpt,hf-gpt2,zoo-llama,hf-llama,tv-resnet18,zoo-convnet
  bench_cells=
  variants=eager,ours@1.0+peakfrac=0.8,inductor@0.5,ours@0.5,ours@1.0+peakfrac=0.6,inductor@1.0
fi

step "GPT-2 size training: eager, Inductor, ours, ours under two peak caps ($size)"
timeout "$(left 5)" "$python" benchmarks/gpu_train_bench.py --device "$device" --size "$size" \
    --models gpt2 --variants "$variants" \
    --steps "$steps" --warmup "$warmup" --timeout "$per_variant" --out "$out" \
    > "$out/gpu_train_bench.log" 2>&1 &
train=$!

step "beside it: torch's chunkers (auto_chunker, F.linear_cross_entropy) against our split"
if [ "$size" = tiny ]; then chunkers_args="--smoke --variants eager"  # no compile: seconds
else chunkers_args="--models gpt-gpu --variants eager,inductor,inductor+ac,lce-inductor,split8,cap-ac --timeout 200"; fi
timeout "$(left 10)" "$python" benchmarks/chunkers_bench.py --device "$device" $chunkers_args \
    --out "$out" > "$out/chunkers_bench.log" 2>&1 &
chunkers=$!

if [ "$size" = full ]; then
  step "beside it: what a cap costs to compile (cold first step by depth)"
  timeout "$(left 10)" "$python" benchmarks/cap_compile_bench.py --device "$device" --models gpt \
      --layers 2 8 --variants inductor ours ours-peak --timeout 240 --out "$out" --results \
      > "$out/cap_compile_bench.log" 2>&1 &
  compile_cost=$!
fi

step "beside it: the compiled-program memory model, predicted vs measured ($device)"
timeout "$(left 10)" "$python" benchmarks/compiled_memory_bench.py --device "$device" \
    --models "$bench_models" $bench_cells --out "$out" > "$out/compiled_memory_bench.log" 2>&1 &
bench=$!
if [ "$device" = cuda ]; then
  step "beside it: the CUDA-marked tests"
  timeout 240 "$python" -m pytest -q -p no:cacheprovider -m cuda \
      tests/aot_partition/test_inductor_memory.py tests/aot_partition/test_offload_cuda.py \
      tests/aot_partition/test_estimators.py tests/aot_pipeline/test_pipeline_inductor.py \
      tests/aot_pipeline/test_pipeline_modes.py tests/aot_partition/test_chunked_loss.py \
      > "$out/cuda_tests.log" 2>&1 || status=1
  tail -n 15 "$out/cuda_tests.log"
fi
step "beside it: the split (the LM head and loss in chunks) against Inductor and torch@0.5"
if [ "$size" = tiny ]; then split_args="--smoke"
else split_args="--quick --vocab 50304 --dim 768 --layers 2 --seq 1024 --batch 8"; fi
timeout "$(left 10)" "$python" benchmarks/split_bench.py --device "$device" $split_args \
    --out "$out" > "$out/split_bench.log" 2>&1 || status=1
cat "$out/split_bench.md" 2>/dev/null
wait "$bench" || status=1
wait "$chunkers" || status=1
step "torch's chunkers against our split"
cat "$out/chunkers_bench.md" 2>/dev/null
step "compiled-program memory model"
cat "$out/compiled_memory_bench.md" 2>/dev/null
if [ -n "${compile_cost:-}" ]; then
  wait "$compile_cost" || status=1
  step "what a cap costs to compile"
  cat "$out/cap_compile_bench.md" 2>/dev/null
fi
wait "$train" || status=1
step "GPT-2 size training"
cat "$out/gpu_train_bench.md" 2>/dev/null
step "done (status $status); tables in $out"
exit "$status"
