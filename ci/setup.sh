#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test fusepack, idempotently:
#   - Debian packages: compilers' companions (ninja, ccache), Eigen, GoogleTest, RapidCheck, Gloo headers,
#     nlohmann-json, CLI11, and clang with its runtime libraries (libFuzzer) for ci/fuzz.sh;
#   - LibTorch from the PyPI `torch` wheel, pinned to FUSEPACK_TORCH_VERSION (default 2.11.0, the GPU machine's
#     version), in a virtual environment under FUSEPACK_DEPS (default ~/.cache/fusepack);
#   - matplotlib, pinned to FUSEPACK_MATPLOTLIB_VERSION (default 3.9.2), in the same environment, for the plots of
#     the gate's report (ci/report.py).
# A second run only checks and returns within seconds. Writes the LibTorch CMake prefix to
# $FUSEPACK_DEPS/torch_prefix so ci/build.sh can find it.
set -euo pipefail

FUSEPACK_DEPS=${FUSEPACK_DEPS:-$HOME/.cache/fusepack}
TORCH_VERSION=${FUSEPACK_TORCH_VERSION:-2.11.0}
MATPLOTLIB_VERSION=${FUSEPACK_MATPLOTLIB_VERSION:-3.9.2}
DEB_PACKAGES=(cmake ninja-build ccache g++ python3-venv libeigen3-dev libgtest-dev librapidcheck-dev libgloo-dev
              nlohmann-json3-dev libcli11-dev clang libclang-rt-dev)

log() { printf '[setup] %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else log "need root to run: $*"; exit 1; fi
}

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "Debian packages present"
fi

command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  log "nvcc not found: CUDA kernels will not be compiled (set FUSEPACK_REQUIRE_CUDA=1 to make that an error)"

venv="$FUSEPACK_DEPS/venv"
py="$venv/bin/python"
have() { [ -x "$py" ] && "$py" - "$1" "$2" <<'PY' 2>/dev/null  # PACKAGE VERSION: installed in the venv
import importlib.metadata as md, sys
sys.exit(0 if md.version(sys.argv[1]).split("+")[0] == sys.argv[2] else 1)
PY
}
if have torch "$TORCH_VERSION"; then
  log "torch $TORCH_VERSION present in $venv"
else
  log "installing torch==$TORCH_VERSION from PyPI into $venv (a few GB, one time)"
  mkdir -p "$FUSEPACK_DEPS"
  python3 -m venv "$venv"
  "$py" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION"
fi
if have matplotlib "$MATPLOTLIB_VERSION"; then
  log "matplotlib $MATPLOTLIB_VERSION present in $venv"
else
  log "installing matplotlib==$MATPLOTLIB_VERSION from PyPI into $venv (the gate report's plots)"
  "$py" -m pip install -q --disable-pip-version-check "matplotlib==$MATPLOTLIB_VERSION"
fi

# LibTorch's CUDA major version must match nvcc's, or kernels and torch disagree on the runtime.
"$py" -W ignore - <<'PY' > "$FUSEPACK_DEPS/torch_info"
import torch, torch.utils
print(torch.utils.cmake_prefix_path)
print(torch.__version__)
print(torch.version.cuda or "none")
PY
torch_prefix=$(sed -n 1p "$FUSEPACK_DEPS/torch_info")
torch_cuda=$(sed -n 3p "$FUSEPACK_DEPS/torch_info")
echo "$torch_prefix" > "$FUSEPACK_DEPS/torch_prefix"
nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ -x "$nvcc_bin" ]; then
  nvcc_cuda=$("$nvcc_bin" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
  if [ "${torch_cuda%%.*}" != "${nvcc_cuda%%.*}" ]; then
    log "torch $(sed -n 2p "$FUSEPACK_DEPS/torch_info") is built for CUDA $torch_cuda but nvcc is CUDA $nvcc_cuda:" \
        "the major versions must match"
    exit 1
  fi
  log "torch $(sed -n 2p "$FUSEPACK_DEPS/torch_info") (CUDA $torch_cuda) matches nvcc CUDA $nvcc_cuda"
fi
log "done"
