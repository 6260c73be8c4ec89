# shellcheck shell=bash
# Shared by scripts/test and scripts/run: make sure the Debian packages the build needs are present.
# Sourced, not executed. Defines nxmem_ensure_deps.

NXMEM_DEB_PACKAGES=(
  meson ninja-build g++ gcc clang pkg-config cmake
  libboost-dev librange-v3-dev catch2 libbenchmark-dev libcli11-dev nlohmann-json3-dev
  librapidcheck-dev # the conformance suite's model check (include/nxmem/conform/model/), property tests (test/pool)
  libclang-rt-14-dev abigail-tools
  valgrind # the instruction budgets (test/perf): callgrind
  libjemalloc-dev libmimalloc-dev # bench/: in-run baselines of the pool, dlopen'd beside glibc malloc
  libtorch-dev python3-torch libopenblas0 # the PyTorch integration (engines/torch, docs/TORCH.md)
  libucx-dev ucx-utils # the transfer layer (docs/TRANSFER.md); ucx_perftest is the bench's in-run baseline
  python3-matplotlib # bench/transfer_plot.py: bandwidth against block size, as a PNG
  iproute2 # test/transfer: the two-machine test's network namespaces (ip netns, a veth pair)
)

# Prints the packages of NXMEM_DEB_PACKAGES that dpkg does not report as installed.
nxmem_missing_packages() {
  local pkg status
  for pkg in "${NXMEM_DEB_PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    [[ "$status" == installed ]] || printf '%s\n' "$pkg"
  done
}

# Installs what is missing when run as root; otherwise prints the apt-get line and fails.
nxmem_ensure_deps() {
  if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "nxmem: dpkg-query not found (not Debian?); not checking packages: ${NXMEM_DEB_PACKAGES[*]}" >&2
    return 0
  fi
  local missing
  mapfile -t missing < <(nxmem_missing_packages)
  ((${#missing[@]} == 0)) && return 0

  local install=(apt-get install -y --no-install-recommends "${missing[@]}")
  if ((EUID != 0)); then
    {
      echo "nxmem: missing Debian packages: ${missing[*]}"
      echo "nxmem: install them as root, then run this again:"
      echo "  apt-get update && DEBIAN_FRONTEND=noninteractive ${install[*]}"
    } >&2
    return 1
  fi
  echo "nxmem: installing missing Debian packages: ${missing[*]}" >&2
  apt-get update
  DEBIAN_FRONTEND=noninteractive "${install[@]}" </dev/null
}
