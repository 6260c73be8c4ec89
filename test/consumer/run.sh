#!/usr/bin/env bash
# Consumer tests: nxmem as an engine integrator and a plugin author meet it, out of the tree.
#   1. `meson install --destdir` of BUILD_DIR into a temporary stage;
#   2. three engines (test/consumer/engine.cpp): nxmem as a Meson subproject, through pkg-config,
#      through CMake find_package(nxmem) -- each loads the installed posix plugin, allocates,
#      writes, shares a prefix, releases, unloads and checks the library is unmapped;
#   3. the installed example C plugin built with the Meson plugin dependency and with the CMake
#      nxmem::plugin target, each checked by the installed `nxmem conform`;
#   4. find_package(nxmem VERSION) accepts and refuses the versions docs/HOST.md says;
#   5. the installed `nxmem inspect` with no arguments finds the installed plugins;
#   6. a C++17 translation unit including <nxmem/host.hpp> stops with the C++20 message;
#   7. where BUILD_DIR built the PyTorch integration: an unmodified Python script on the installed
#      posix plugin through the installed nxmem_torch.so and sitecustomize.py (docs/TORCH.md).
# Usage: test/consumer/run.sh BUILD_DIR   (a configured and built gcc build, e.g. build/gcc)
# Prints "PASS name" / "FAIL name" per case (a failure with its log), then
# "consumer: N passed, M failed", and exits 1 if anything failed.
set -uo pipefail

if (($# != 1)); then
  echo "usage: test/consumer/run.sh BUILD_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source_root=$(cd "$here/../.." && pwd)
build_dir=$(cd "$1" && pwd) || exit 2
cxx=${CXX:-g++}
jobs=${NXMEM_CONSUMER_JOBS:-2}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/stage
passed=0 failed=0

# check NAME COMMAND...: runs COMMAND with its output in a log; prints the log on failure.
check() {
  local name=$1 log="$work/log.$((passed + failed))"
  shift
  if "$@" >"$log" 2>&1; then
    echo "PASS $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name"
    sed 's/^/  | /' "$log" | tail -40
    failed=$((failed + 1))
  fi
}

# The prefix and the directories below it as BUILD_DIR installs them (absolute, before DESTDIR).
option_value() {
  meson introspect --buildoptions "$build_dir" |
    python3 -c "import json,sys; print(next(o['value'] for o in json.load(sys.stdin) if o['name'] == '$1'))"
}
prefix=$(option_value prefix)
libdir=$(option_value libdir)
[[ $libdir == /* ]] || libdir=$prefix/$libdir
staged_libdir=$stage$libdir
staged_bindir=$stage$prefix/$(option_value bindir)

install_stage() {
  meson install -C "$build_dir" --no-rebuild --destdir "$stage" &&
    test -f "$staged_libdir/pkgconfig/nxmem.pc" &&
    test -f "$staged_libdir/cmake/nxmem/nxmemConfig.cmake" &&
    test -f "$staged_libdir/nxmem/plugins/nxmem_posix.so" &&
    test -f "$stage$prefix/share/doc/nxmem/LICENSE" &&
    test -f "$stage$prefix/share/doc/nxmem/examples/minimal_plugin.c"
}
check "meson install --destdir into a stage" install_stage
if ((failed)); then
  echo "consumer: $passed passed, $failed failed"
  exit 1
fi
nxmem_tool=$staged_bindir/nxmem
posix_plugin=$staged_libdir/nxmem/plugins/nxmem_posix.so
example_plugin=$stage$prefix/share/doc/nxmem/examples/minimal_plugin.c

# Each consumer project in a directory of its own, with the engine and the installed C example.
project_dir() {
  local dir=$work/$1
  mkdir -p "$dir"
  [[ ! -d $here/$1 ]] || cp -R "$here/$1/." "$dir/"
  cp "$here/engine.cpp" "$example_plugin" "$dir/"
  echo "$dir"
}

# --- Meson subproject: builds only nxmem's dependency objects (no tests, no tool) ---
meson_consumer() {
  local dir
  dir=$(project_dir meson)
  mkdir -p "$dir/subprojects"
  ln -s "$source_root" "$dir/subprojects/nxmem"
  CXX=$cxx meson setup "$dir/build" "$dir" &&
    ! grep -q "nxmem_testplugin\|tools/nxmem" "$dir/build/build.ninja" &&
    ninja -C "$dir/build" -j "$jobs" engine consumer_meson_plugin.so &&
    "$dir/build/engine" "$posix_plugin" &&
    "$nxmem_tool" conform "$dir/build/consumer_meson_plugin.so"
}
check "meson subproject: engine and plugin build lean, engine runs, plugin conforms" meson_consumer

# --- pkg-config, on the stage through PKG_CONFIG_SYSROOT_DIR ---
pkgconfig_consumer() {
  local dir cflags libs plugindir
  dir=$(project_dir pkgconfig)
  local -x PKG_CONFIG_PATH=$staged_libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$stage
  cflags=$(pkg-config --cflags nxmem) && libs=$(pkg-config --libs nxmem) &&
    plugindir=$(pkg-config --variable=plugindir nxmem) &&
    [[ $plugindir == "$staged_libdir/nxmem/plugins" ]] &&
    # shellcheck disable=SC2086 # the flags are words
    "$cxx" -std=c++20 -Wall -Wextra -Wpedantic -Werror $cflags "-DNXMEM_CONSUMER_PLUGIN_DIR=\"$plugindir\"" \
      "$dir/engine.cpp" $libs -o "$dir/engine" &&
    "$dir/engine"
}
check "pkg-config: engine builds and runs on the installed plugin" pkgconfig_consumer

# --- CMake find_package ---
cmake_consumer() {
  local dir
  dir=$(project_dir cmake)
  CXX=$cxx cmake -S "$dir" -B "$dir/build" -DCMAKE_PREFIX_PATH="$stage$prefix" -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "$dir/build" -j "$jobs" &&
    "$dir/build/engine" &&
    "$nxmem_tool" conform "$dir/build/consumer_cmake_plugin.so"
}
check "cmake find_package: engine builds and runs, nxmem::plugin plugin conforms" cmake_consumer

cmake_versions() {
  local dir
  dir=$(project_dir cmake-version)
  cmake -S "$dir" -B "$dir/build" -DCMAKE_PREFIX_PATH="$stage$prefix"
}
check "cmake find_package: version requests (same major and minor while 0.x)" cmake_versions

# --- the installed tool ---
installed_tool() {
  local out
  out=$(env -u NXMEM_PLUGIN_PATH "$nxmem_tool" inspect) &&
    grep -q "nxmem_posix.so" <<<"$out" &&
    "$nxmem_tool" --version | grep -q "plugin C ABI" &&
    "$nxmem_tool" --help | grep -q "$staged_libdir/nxmem/plugins"
}
check "installed nxmem inspect finds the installed plugins; --version, --help" installed_tool

# --- a C++17 parent gets one clear message ---
cxx17_refused() {
  local out
  echo '#include <nxmem/host.hpp>' >"$work/cxx17.cpp"
  ! out=$("$cxx" -std=c++17 -I"$stage$prefix/include" -fsyntax-only "$work/cxx17.cpp" 2>&1) &&
    grep -q "need C++20" <<<"$out" &&
    (($(grep -c "error:" <<<"$out") <= 2)) # the #error and the include that stops the compiler
}
check "a C++17 translation unit stops with the C++20 message" cxx17_refused

# --- the PyTorch integration as installed: no NXMEM_TORCH_LIBRARY, sitecustomize finds it ---
if [[ -f $build_dir/engines/torch/nxmem_torch.so ]]; then
  installed_torch() {
    local torch_dir=$staged_libdir/nxmem/torch
    test -f "$torch_dir/nxmem_torch.so" && test -f "$torch_dir/python/sitecustomize.py" &&
      env -u NXMEM_TORCH_LIBRARY PYTHONPATH="$torch_dir/python" NXMEM_TORCH_PLUGIN="$posix_plugin" \
        /usr/bin/python3 -c '
import torch
t = torch.ones(1000)
u = torch.ops.nxmem.usage()
assert u["installed"] == 1 and torch.ops.nxmem.owns(t) and u["pool_live_allocations"] >= 1, u
print("served by nxmem:", dict(u))'
  }
  check "installed nxmem_torch.so and sitecustomize.py serve an unmodified script's tensors" installed_torch
fi

# --- PyTorch's CUDAPluggableAllocator entry points, installed wherever the cuda plugin is built ---
if [[ -f $build_dir/engines/torch/nxmem_torch_cuda.so ]]; then
  installed_torch_cuda() {
    local module=$staged_libdir/nxmem/torch/nxmem_torch_cuda.so exported
    test -f "$module" || return 1
    exported=$(nm -D --defined-only "$module") || return 1
    local name
    for name in nxmem_cuda_malloc nxmem_cuda_free nxmem_cuda_record_stream nxmem_cuda_trim nxmem_cuda_last_error; do
      grep -q " T $name\$" <<<"$exported" || { echo "$module does not export $name"; return 1; }
    done
  }
  check "installed nxmem_torch_cuda.so exports the CUDAPluggableAllocator entry points" installed_torch_cuda
fi

echo "consumer: $passed passed, $failed failed"
((failed == 0))
