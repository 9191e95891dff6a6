#!/usr/bin/env bash
# Builds and runs the tests of lamina-core and lamina-cpu for aarch64 (NEON kernels included)
# under qemu user-mode emulation, on an x86-64 Linux host.
#
# With the aarch64 standard library installed for the toolchain in use (`rustup target add
# aarch64-unknown-linux-gnu`, tried here when it is missing), that target is used directly.
# Where rustup cannot download it, std is rebuilt from the nightly toolchain's `rust-src`
# component (-Zbuild-std) instead. Linking uses Debian's gcc-aarch64-linux-gnu and the tests
# run through qemu-aarch64 with the cross sysroot.
#
# Usage: scripts/test-aarch64.sh [extra cargo test args, e.g. `--lib neon`]
# Exit status 3: neither the aarch64 std nor nightly's rust-src can be had on this machine.
# Env:   TOOLCHAIN (default: the default toolchain when it has the aarch64 target, else
#        nightly with -Zbuild-std), CARGO_TARGET_DIR (default <repo>/target-arm),
#        PACKAGES (default "-p lamina-core -p lamina-cpu").
set -euo pipefail

cd "$(dirname "$0")/.."
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

# `+toolchain` argument for rustup/cargo: empty means the default (or rust-toolchain) one.
tc_arg=()
[ -n "${TOOLCHAIN:-}" ] && tc_arg=("+$TOOLCHAIN")

has_target() {
    rustup "${tc_arg[@]}" target list --installed 2>/dev/null | grep -qx "$TARGET"
}
if ! has_target; then
    echo "trying: rustup ${tc_arg[*]:+${tc_arg[*]} }target add $TARGET" >&2
    rustup "${tc_arg[@]}" target add "$TARGET" >&2 || true
fi

build_std=()
if ! has_target; then
    # Fall back to rebuilding std from source on nightly.
    TOOLCHAIN="${TOOLCHAIN:-nightly}"
    tc_arg=("+$TOOLCHAIN")
    if ! rustup "+$TOOLCHAIN" component list --installed 2>/dev/null | grep -q '^rust-src'; then
        echo "error: no installed $TARGET std, and toolchain '$TOOLCHAIN' lacks the rust-src" >&2
        echo "       component needed by -Zbuild-std" >&2
        echo "       (rustup target add $TARGET, or rustup +$TOOLCHAIN component add rust-src)" >&2
        # 3: no toolchain to be had here (.ci/run reports it as skipped).
        exit 3
    fi
    echo "using $TOOLCHAIN with -Zbuild-std (no installed $TARGET std)" >&2
    build_std=(-Zbuild-std=std,panic_abort)
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target-arm}"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $SYSROOT"

# shellcheck disable=SC2086 # PACKAGES is a list of arguments
exec cargo "${tc_arg[@]}" test "${build_std[@]}" --target "$TARGET" \
    ${PACKAGES:--p lamina-core -p lamina-cpu} "$@"
