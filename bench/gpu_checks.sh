#!/usr/bin/env bash
# Everything that needs an NVIDIA GPU, in one go: tests/gpu, then the real-hardware runtime benchmark
# (one GPU worker beside CPU workers of different thread counts) at three sizes; with WITH_SIMULATED=1
# also the simulated-speed benchmark undilated on this machine's cores. Run from the repository root with a
# Python whose torch has CUDA; logs and JSON artifacts go to OUTDIR (copy the artifacts you cite into
# bench/results/).
#
#     bash bench/gpu_checks.sh OUTDIR [pytest arguments...]
#
# A machine that cannot reach a package index and whose Python lacks pydantic installs it from the wheels
# in .gpuwheels, fetched beforehand on a machine that can:
#     pip download pydantic pydantic-settings --python-version 3.12 --platform manylinux2014_x86_64 \
#       --only-binary=:all: -d .gpuwheels
set -uo pipefail
out=${1:?usage: bash bench/gpu_checks.sh OUTDIR [pytest arguments...]}
shift
mkdir -p "$out"
export PYTHONPATH="operator:trainer_image:bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
if ! "$py" -c 'import pydantic' 2>/dev/null && [[ -d .gpuwheels ]]; then
  "$py" -m pip install -q --no-index --find-links .gpuwheels pydantic pydantic-settings
fi

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
  echo "cores: $(nproc)"
  "$py" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
} >"$out/machine.txt" 2>&1

stage() { # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  local started=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - started)) s" | tee -a "$out/stages.txt"
  tail -n 3 "$out/$name.log"
}

# tests/gpu alone: the suite's root conftest starts the test bed, which a GPU machine need not have.
xdist=()
"$py" -c 'import xdist' 2>/dev/null && xdist=(-n 4)
stage gpu-tests 150 "$py" -m pytest --confcutdir=tests/gpu tests/gpu -p no:cacheprovider -rA "${xdist[@]}" "$@"
# The fixed part of a step (the all-reduce, the launch) weighs less on longer steps: three sizes.
stage real-hetero-b8192 120 "$py" bench/runtime_real_hetero.py --global-batch 8192 --length 512 \
  --steps 20 --even-steps 5 --out "$out/runtime_real_hetero-gpu-b8192-l512.json"
stage real-hetero-b32768 150 "$py" bench/runtime_real_hetero.py --global-batch 32768 --length 512 \
  --steps 10 --even-steps 3 --out "$out/runtime_real_hetero-gpu-b32768-l512.json"
stage real-hetero-b1024 60 "$py" bench/runtime_real_hetero.py --out "$out/runtime_real_hetero-gpu.json"
# The simulated-speed benchmark needs many cores, not the GPU: only when asked for.
if [[ -n "${WITH_SIMULATED:-}" ]]; then
  stage balance-undilated 80 "$py" bench/runtime_balance.py --out "$out/runtime_balance-undilated-gpu-host.json"
fi
