#!/usr/bin/env bash
# Prepare a fresh machine for `make test` and `make demo`: Debian packages, the project's virtual
# environment and the test bed's binaries. Every step is skipped when it is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

# 1. Debian packages: iproute2 for emulated slow links; debootstrap, buildah, podman and runc to build
#    the images and run pods as containers (runc: crun cannot set up this kernel's cgroups).
need_apt=()
command -v tc >/dev/null 2>&1 || need_apt+=(iproute2)
for tool in debootstrap buildah podman runc; do
  command -v "$tool" >/dev/null 2>&1 || need_apt+=("$tool")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing Debian packages: ${need_apt[*]}"
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  # Packages must not start system services of their own: the test bed starts what it needs.
  guard=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo_cmd tee /usr/sbin/policy-rc.d >/dev/null
    $sudo_cmd chmod +x /usr/sbin/policy-rc.d
    guard=1
  fi
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  [ -z "$guard" ] || $sudo_cmd rm -f /usr/sbin/policy-rc.d
fi

# 2. Go, for the test bed's binaries.
if ! command -v go >/dev/null 2>&1; then
  echo "Go >= 1.26 is required to build the test bed (https://go.dev/doc/install)" >&2
  exit 1
fi

# 3. The virtual environment, reinstalled whenever pyproject.toml changes.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.heterotrain-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  say "installing heterotrain and its dependencies into .venv (torch is large: the first time takes minutes)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[runtime,dev,examples]'
  echo "$want" > "$stamp"
fi

# 4. The test bed's binaries, built once into a versioned cache.
.venv/bin/heterotrain testbed build

# 5. The images, built when missing for these sources (cached by content).
.venv/bin/heterotrain testbed images
