#!/usr/bin/env bash
# Regenerates the padded-batch golden loss file(s) (DESIGN.md section 7): the padded composite baseline, fp64 on the
# CPU, one thread (every reduction in one order: the file comes out the same on any machine), on qwen35-tiny with
# fixed synthetic data. The only way these files are made; never edit them by hand. Needs fusepack-train built:
#   cmake --build ${FUSEPACK_BUILD_DIR:-build} --target fusepack-train && golden/regenerate.sh
# The packed path is checked against it by tests/golden/e2e_golden_test.cpp (which runs the same settings with
# --batching packed; keep the two in step) or by hand:
#   build/bin/fusepack-train <the options below, with --batching packed> --golden-check golden/qwen35-tiny-padded.json
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${FUSEPACK_BUILD_DIR:-build}
train="$build_dir/bin/fusepack-train"
if [ ! -x "$train" ]; then
  echo "regenerate.sh: $train not found; build it first: cmake --build $build_dir --target fusepack-train" >&2
  exit 2
fi

# 10 steps of 2 paired micro-batches of at most 256 tokens: ~5 examples of median 40 tokens each (at most max_position_embeddings = 128), a quarter of each
# example a prompt (labels -100), so the golden also pins which tokens are targets. Runs in seconds.
"$train" \
  --preset qwen35-tiny --batching padded --pairing paired --backend composite --dtype fp64 --device cpu --threads 1 \
  --data synthetic:n=128,median=40,sigma=0.6,min=1,max=128,prompt=0.25,seed=7 \
  --budget 256 --micro-batches 2 --steps 10 \
  --lr 3e-3 --warmup 2 --min-lr 3e-4 --weight-decay 0.1 --beta1 0.9 --beta2 0.95 --eps 1e-8 --clip-norm 1.0 \
  --seed 1234 --no-progress \
  --golden-write golden/qwen35-tiny-padded.json
