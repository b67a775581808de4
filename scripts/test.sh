#!/usr/bin/env bash
# The README's test command: every test, the GPU path included. The wgpu tests run on a Vulkan
# device; on a machine without one this installs Mesa's llvmpipe (a Vulkan 1.3 device that runs
# on the CPU) from Debian/Ubuntu packages, then runs `cargo test --workspace`.
set -euo pipefail
cd "$(dirname "$0")/.."

# A driver manifest in either folder (one of them may not exist), and the loader.
has_vulkan() {
    { compgen -G '/usr/share/vulkan/icd.d/*.json' || compgen -G '/etc/vulkan/icd.d/*.json'; } \
        >/dev/null && ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'
}

if [[ "$(uname -s)" == Linux ]] && ! has_vulkan; then
    echo "== no Vulkan driver: installing mesa-vulkan-drivers (llvmpipe) for the wgpu tests"
    sudo=""
    [[ "$(id -u)" == 0 ]] || sudo="sudo"
    if command -v apt-get >/dev/null; then
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq mesa-vulkan-drivers >/dev/null
    else
        echo "error: the wgpu tests need a Vulkan driver; install Mesa's (mesa-vulkan-drivers," \
             "vulkan-swrast or your distribution's name for llvmpipe)" >&2
        exit 1
    fi
fi

cargo test --workspace "$@"
