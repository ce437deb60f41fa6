#!/usr/bin/env bash
# Trains the shipped pair on one GPU in minutes: the target
# (configs/train/target_gpu.gin), its distillation data, two tiny drafts
# (offline only, and offline mixed with on-policy steps), then packs every
# model into small files (scripts/pack_run.py) under OUT_DIR.
#
#   DATA_DIR=data OUT_DIR=/tmp/out TARGET_SECONDS=200 DRAFT_SECONDS=50 \
#       bash scripts/train_pair_gpu.sh
#
# Needs data/tokenized from scripts/prepare_data.py. SMOKE=1 runs every stage
# for a few steps (to check an environment before spending its time). The
# packed files are tarred and cut into parts under 16 MB
# (OUT_DIR/pair.tar.partNN; `cat pair.tar.part* | tar x` joins them), after
# each model, so a run stopped early still returns what it finished.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${DATA_DIR:-data}
OUT_DIR=${OUT_DIR:-output/gpu_pair}
RUNS=${RUNS:-runs}
TARGET_SECONDS=${TARGET_SECONDS:-200}
DRAFT_SECONDS=${DRAFT_SECONDS:-50}
DISTILL_DIR=${DISTILL_DIR:-data/distill_gpu}
STAGE=$(mktemp -d)
mkdir -p "$OUT_DIR"
small=()
examples=50000,20000
validation=1000
if [[ "${SMOKE:-0}" == 1 ]]; then
  small=(--gin.train.TrainConfig.num_steps=4 --gin.train.TrainConfig.log_every=2
         --gin.train.TrainConfig.eval_every=4 --gin.train.TrainConfig.eval_examples=16
         --gin.train.TrainConfig.batch_tokens=4096)
  examples=64,64
  validation=64
fi
common=(--gin.train.TrainConfig.data_dir="'$DATA_DIR'")
stamp() { echo "=== $(date +%T) $*"; }
bundle() {
  rm -f "$OUT_DIR"/pair.tar.part*
  tar cf - -C "$STAGE" . | split -b 15900000 -d - "$OUT_DIR/pair.tar.part"
}

stamp target
python scripts/train_model.py --gin_file=configs/train/target_gpu.gin "${common[@]}" \
  --gin.MODEL_DIR="'$RUNS/target_gpu'" \
  --gin.train.TrainConfig.time_limit_seconds="$TARGET_SECONDS" "${small[@]}"
python scripts/pack_run.py pack --run_dir="$RUNS/target_gpu" --output_dir="$STAGE" \
  --name=target --part_mib=1000
bundle

stamp distill
python scripts/distill_target.py --target_dir="$RUNS/target_gpu" --data_dir="$DATA_DIR" \
  --output_dir="$DISTILL_DIR" --max_examples="$examples" --batch_size=1024 \
  --top_k_batch_size=512 --length_multiple=32 --validation_examples=$validation

for mode in offline on_policy; do
  stamp "draft $mode"
  fraction=0.5; [[ $mode == offline ]] && fraction=0.0
  python scripts/train_model.py --gin_file=configs/train/draft_tiny_gpu.gin "${common[@]}" \
    --gin.MODEL_DIR="'$RUNS/draft_tiny_gpu_$mode'" \
    --gin.train.TrainConfig.distillation_dir="'$DISTILL_DIR'" \
    --gin.train.TrainConfig.teacher_dir="'$RUNS/target_gpu'" \
    --gin.train.TrainConfig.on_policy_fraction=$fraction \
    --gin.train.TrainConfig.time_limit_seconds="$DRAFT_SECONDS" "${small[@]}"
  python scripts/pack_run.py pack --run_dir="$RUNS/draft_tiny_gpu_$mode" \
    --output_dir="$STAGE" --name="draft_$mode" --part_mib=1000
  bundle
done
stamp done
