#!/usr/bin/env bash
# Everything that needs an NVIDIA GPU, in one go: tests/gpu, then the real-hardware runtime benchmark
# (one GPU worker beside CPU workers of different thread counts) at two global batches, then the
# simulated-speed benchmark undilated on this machine's cores. Run from the repository root with a
# Python whose torch has CUDA; logs and JSON artifacts go to OUTDIR (copy the artifacts you cite into
# bench/results/).
#
#     bash bench/gpu_checks.sh OUTDIR [pytest arguments...]
set -uo pipefail
out=${1:?usage: bash bench/gpu_checks.sh OUTDIR [pytest arguments...]}
shift
mkdir -p "$out"
export PYTHONPATH="operator:trainer_image:bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

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
stage gpu-tests 200 "$py" -m pytest --confcutdir=tests/gpu tests/gpu -p no:cacheprovider -rA "${xdist[@]}" "$@"
stage real-hetero-1024 80 "$py" bench/runtime_real_hetero.py --out "$out/runtime_real_hetero-gpu.json"
stage real-hetero-8192 100 "$py" bench/runtime_real_hetero.py --global-batch 8192 \
  --out "$out/runtime_real_hetero-gpu-b8192.json"
stage balance-undilated 80 "$py" bench/runtime_balance.py --out "$out/runtime_balance-undilated-gpu-host.json"
