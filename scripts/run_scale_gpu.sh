#!/bin/bash
# Issue 30's GPU measurements in one call on a lent accelerator (no network there; its image has JAX with CUDA,
# PyTorch and GPyTorch, which is all `benchmarks/scale.py` needs besides this checkout).
#
#   bash scripts/run_scale_gpu.sh [SECONDS] [STAGE ...]
#
# Stages, run in the order given until SECONDS (default 540) are spent; each writes $OUT/scale-<stage>.json and
# its printed table to $OUT/log.txt:
#   ratios   N = 10,000 and 30,000, float32: ours dense and matrix-free against GPyTorch's Cholesky and CG paths
#            (the <= 0.3x target; GPyTorch runs out of memory beyond ~40,000);
#   rbf1e6   N = 100,000 and 1,000,000, float32, RBF, matrix-free only, first call (the < 10 minutes target);
#   mlp1e6   the same with the NNGP of a 3-layer ReLU MLP (`--kernel mlp`);
#   dense    N = 40,000 float64, ours dense (the 1.5 N^2 target; the device's peak is printed).
# Defaults: ratios rbf1e6. Copy $OUT's JSON files into records/benchmarks/ and quote them in RESULTS.md with the
# device's name. Test on a CPU first: JAX_PLATFORMS=cpu SCALE_SIZES_OVERRIDE="300 600" OUT=/tmp/o bash ... .
LIMIT=${1:-540}
shift
STAGES=${*:-ratios rbf1e6}
ROOT=$PWD
OUT=${OUT:-/tmp/scale_out}
mkdir -p "$OUT"
export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" || exit 4
START=$(date +%s)
for stage in $STAGES; do
  case $stage in
    ratios) args="--sizes 10000 30000 --dtype float32 --cases ours-dense ours-cg gpytorch-chol gpytorch-cg --repeats 1";;
    rbf1e6) args="--sizes 100000 1000000 --dtype float32 --cases ours-cg --repeats 0";;
    mlp1e6) args="--sizes 100000 1000000 --dtype float32 --kernel mlp --cases ours-cg --repeats 0";;
    dense) args="--sizes 40000 --dtype float64 --cases ours-dense --repeats 1";;
    *) echo "unknown stage $stage (ratios, rbf1e6, mlp1e6, dense)"; exit 2;;
  esac
  if [ -n "$SCALE_SIZES_OVERRIDE" ]; then  # a CPU rehearsal at small sizes
    args=$(echo "$args" | sed "s/--sizes [0-9 ]*--/--sizes $SCALE_SIZES_OVERRIDE --/")
  fi
  left=$((LIMIT - ($(date +%s) - START)))
  if [ "$left" -lt 30 ]; then echo "time spent: stage $stage and later not run"; break; fi
  echo "== $stage (up to $left s): benchmarks/scale.py $args" | tee -a "$OUT/log.txt"
  timeout "$left" python3 benchmarks/scale.py $args --timeout "$left" --out "$OUT/scale-$stage.json" 2>&1 \
    | grep -v "^WARNING\|^W[0-9]" | tee -a "$OUT/log.txt"
done
ls -la "$OUT"
