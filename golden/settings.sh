# The settings of the golden runs, sourced by golden/regenerate.sh and ci/gate.sh (tests/golden/e2e_golden_test.cpp
# and e2e_gpu_golden_test.cpp repeat them in C++ and check them through each golden's provenance: a golden
# regenerated with other settings cannot pass unnoticed).
#
# 10 steps of 2 paired micro-batches of at most 256 tokens: ~5 examples of median 40 tokens each (at most
# max_position_embeddings = 128), a quarter of each example a prompt (labels -100), so a golden also pins which tokens
# are targets. Runs in seconds on the CPU in fp64.
# shellcheck disable=SC2034  # used by the scripts that source this file
golden_settings=(
  --pairing paired --threads 1
  --data synthetic:n=128,median=40,sigma=0.6,min=1,max=128,prompt=0.25,seed=7
  --budget 256 --micro-batches 2 --steps 10
  --lr 3e-3 --warmup 2 --min-lr 3e-4 --weight-decay 0.1 --beta1 0.9 --beta2 0.95 --eps 1e-8 --clip-norm 1.0
  --seed 1234 --no-progress
)
# qwen35-tiny: the CPU model (DeltaNet heads of 16, the Hugging Face golden's); qwen35-tiny64: the same with DeltaNet
# heads of 64, which the fused backend runs on a GPU.
golden_presets=(qwen35-tiny qwen35-tiny64)
