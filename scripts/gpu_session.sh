#!/usr/bin/env bash
# One GPU lease's work for the open issues, in one command: the shipped pair
# (scripts/train_pair_gpu.sh), then the accelerator check at T5-XL/XXL
# shapes in whatever time is left before LIMIT seconds. Results go to $OUT
# (pair.tar.part*, pair.log, accelerator.json).
#
# Prepared where the lease is requested: data/tokenized from
# scripts/prepare_data.py, and the packages the accelerator machine lacks as
# wheels in .whl/ (gin-config; `pip download --no-deps --only-binary=:all:
# --python-version 3.12 -d .whl gin-config`). Then run, from the repository
# root there, with data/tokenized and .whl carried along (the shipped
# weights, spec_decode/pretrained/assets/t5_local_*, ~83 MB, are not needed
# there and would push the travelling tree past its 64 MiB limit: move them
# out of the checkout for the call, and back after):
#   LIMIT=530 TARGET_SECONDS=210 DRAFT_SECONDS=45 bash scripts/gpu_session.sh
set -u
OUT=${OUT:-output/gpu_session}
mkdir -p "$OUT"
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/bin && ln -sf "$(which python3)" /tmp/bin/python && export PATH=/tmp/bin:$PATH
nvidia-smi -L; nproc
python -c "import jax, flax, optax, gin; print(jax.__version__, flax.__version__, optax.__version__, jax.devices())"
LIMIT=${LIMIT:-530}
OUT_DIR=$OUT RUNS=/tmp/runs DISTILL_DIR=/tmp/distill_gpu TARGET_SECONDS=${TARGET_SECONDS:-210} \
  DRAFT_SECONDS=${DRAFT_SECONDS:-45} bash scripts/train_pair_gpu.sh > $OUT/pair.log 2>&1
echo "pair rc $? after $(( $(date +%s) - T0 )) s"
grep -E '^===|"step"|time limit|parameters in|teacher outputs in|top-16|Error|error' $OUT/pair.log | cut -c1-400 | tail -60
LEFT=$(( LIMIT - ($(date +%s) - T0) - 15 ))
echo "accelerator check with $LEFT s"
python scripts/accelerator_check.py --targets=t5_1_1_xxl,t5_1_1_xl --deadline_seconds=$LEFT --output_json=$OUT/accelerator.json 2>&1 | grep -v '^I11\|^W11' | tail -30
echo "all done after $(( $(date +%s) - T0 )) s"
