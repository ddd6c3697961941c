#!/bin/bash
# The full-width BNN baseline of `mbnn-uci` (paper Table 1) on a machine with an accelerator and no network.
#
#   bash scripts/run_bnn_gpu.sh [SECONDS]      (DATASETS=energy,concrete SPLITS=4 to choose; defaults below)
#
# MODELS=mbnn-0.075,mbnn-0.125 runs other `mbnn-uci` models the same way (default: bnn, the full-width BNN); on one
# H100 an mBNN split takes 130-240 s (against 1,100-5,800 s on the 2-core CPU); on one H200 a full-width BNN split
# took 44-74 s.
#
# It expects, in the repository root (`.gpu/` is ignored by git, so prepare it on the machine you send from):
#   .gpu/whl/   wheels of what the machine lacks (e.g. `pip download --no-deps blackjax==1.7.1 -d .gpu/whl`);
#   .gpu/data/  a mirror of the data directory (`.gpu/data/uci/yacht/...`, as under $SMNNGP_DATA_DIR);
#   .gpu/prev/  optional: finished `cells/` of an earlier call, so that they are not run again.
# It runs as many splits as fit in SECONDS (default 470) into /tmp/gpu and leaves $OUT/bnn_cells.tgz (the
# finished cells, no checkpoints) and $OUT/log.txt; copy the cells into records/mbnn-uci/cells/ and run
# `python -m experiments mbnn-uci --aggregate-only --out records/mbnn-uci`. On a machine with network access the
# same job is simply `pip install -e ".[cuda]" && python -m experiments mbnn-uci --models bnn --out records/mbnn-uci`.
LIMIT=${1:-470}
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$ROOT SMNNGP_DATA_DIR=$ROOT/.gpu/data JAX_DEFAULT_MATMUL_PRECISION=highest
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
python3 -c "import jax, blackjax, samplers.mbnn, experiments.mbnn_uci; print('jax', jax.__version__, 'blackjax',
blackjax.__version__, jax.devices())" || exit 4
mkdir -p /tmp/gpu && cp -r .gpu/prev/cells /tmp/gpu/ 2>/dev/null
timeout "$LIMIT" python3 -m experiments mbnn-uci --datasets "${DATASETS:-yacht,boston,energy,concrete}" --models "${MODELS:-bnn}" \
    --splits "${SPLITS:-4}" --out /tmp/gpu > "$OUT/log.txt" 2>&1
echo "exit $? (124: stopped at the time limit; finished splits are kept)"
tr '\r' '\n' < "$OUT/log.txt" | grep -v "it/s\]$" | grep -v "^\s*$" | tail -25
cd /tmp/gpu && tar czf "$OUT/bnn_cells.tgz" --exclude='*.chk.pkl' . && ls -la "$OUT"
