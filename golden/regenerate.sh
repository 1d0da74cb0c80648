#!/usr/bin/env bash
# Regenerates the padded-batch golden loss files (golden/FORMAT.md): the padded composite baseline, fp64 on the
# CPU, one thread (every reduction in one order: a file comes out the same on any machine), for each model of
# golden/settings.sh with its fixed synthetic data, into golden/<preset>-padded.json. The only way these files are
# made; never edit them by hand. Needs fusepack-train built:
#   cmake --build ${FUSEPACK_BUILD_DIR:-build} --target fusepack-train && golden/regenerate.sh
# The packed path is checked against them by tests/golden/e2e_golden_test.cpp (CPU), e2e_gpu_golden_test.cpp (fused,
# bf16) and ci/gate.sh, or by hand:
#   build/bin/fusepack-train --preset qwen35-tiny --batching packed --backend composite --dtype fp64 --device cpu \
#     <golden/settings.sh's settings> --golden-check golden/qwen35-tiny-padded.json
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=golden/settings.sh
source golden/settings.sh

build_dir=${FUSEPACK_BUILD_DIR:-build}
train="$build_dir/bin/fusepack-train"
if [ ! -x "$train" ]; then
  echo "regenerate.sh: $train not found; build it first: cmake --build $build_dir --target fusepack-train" >&2
  exit 2
fi
train=$(realpath "$train")

# Every run first (in a scratch folder, so each file's recorded command names it as golden/ does), then the files: a
# golden written mid-loop would mark the tree dirty in the next one's provenance.
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for preset in "${golden_presets[@]}"; do
  (cd "$out" && "$train" --preset "$preset" --batching padded --backend composite --dtype fp64 --device cpu \
    "${golden_settings[@]}" --golden-write "$preset-padded.json")
done
for preset in "${golden_presets[@]}"; do mv "$out/$preset-padded.json" "golden/$preset-padded.json"; done
