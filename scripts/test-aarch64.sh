#!/usr/bin/env bash
# Builds and runs the tests of lamina-core and lamina-cpu for aarch64 (NEON kernels included)
# under qemu user-mode emulation, on an x86-64 Linux host.
#
# rustup cannot download the aarch64 standard library here, so std is rebuilt from the
# nightly toolchain's `rust-src` component (-Zbuild-std); linking uses Debian's
# gcc-aarch64-linux-gnu and the tests run through qemu-aarch64 with the cross sysroot.
#
# Usage: scripts/test-aarch64.sh [extra cargo test args, e.g. `--lib neon`]
# Env:   TOOLCHAIN (default nightly), CARGO_TARGET_DIR (default <repo>/target-arm),
#        PACKAGES (default "-p lamina-core -p lamina-cpu").
set -euo pipefail

cd "$(dirname "$0")/.."
TOOLCHAIN="${TOOLCHAIN:-nightly}"
TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu

need_apt=()
command -v aarch64-linux-gnu-gcc >/dev/null || need_apt+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || need_apt+=(qemu-user)
if ((${#need_apt[@]})); then
    echo "installing ${need_apt[*]}" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${need_apt[@]}"
fi

if ! rustup "+$TOOLCHAIN" component list --installed 2>/dev/null | grep -q '^rust-src'; then
    echo "error: toolchain '$TOOLCHAIN' lacks the rust-src component needed by -Zbuild-std" >&2
    echo "       (rustup +$TOOLCHAIN component add rust-src, where the network allows)" >&2
    exit 1
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target-arm}"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $SYSROOT"

# shellcheck disable=SC2086 # PACKAGES is a list of arguments
exec cargo "+$TOOLCHAIN" test -Zbuild-std=std,panic_abort --target "$TARGET" \
    ${PACKAGES:--p lamina-core -p lamina-cpu} "$@"
