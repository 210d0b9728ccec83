#!/bin/bash
# Packs what bench/gpu/check.sh runs on a GPU machine that has a driver and Python wheels but none of Debian's
# libraries: the CUDA build's meshrun-gpu-check, meshrun-nccl-check and meshrun-train (stripped), every shared
# library they load apart from glibc, libstdc++/libgcc and NVIDIA's (cuBLASLt and NCCL come from the machine or
# its pip wheels; they are hundreds of MB), and Open MPI's and PMIx's plugins, so that meshrun-train starts as
# an MPI singleton at world 1 there.
#   bench/gpu/bundle.sh [BUILD_DIR [OUT_DIR]]     (defaults: build, .gpu-bundle; OUT_DIR is replaced)
# BUILD_DIR is a -DMESHRUN_CUDA=ON tree with the three targets built (ninja -C build meshrun-train
# meshrun-gpu-check meshrun-nccl-check). check.sh finds OUT_DIR/env.sh when run with MESHRUN_BUNDLE=OUT_DIR.
# Exit 2 with one line when something is missing.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build}"
out="${2:-$root/.gpu-bundle}"
die() { echo "bench/gpu/bundle.sh: $*" >&2; exit 2; }

bins=(trainer/meshrun-train device/meshrun-gpu-check device/meshrun-nccl-check)
for b in "${bins[@]}"; do
  [ -x "$build/$b" ] || die "$build/$b not found: build it with 'cmake -S . -B $build -G Ninja -DMESHRUN_CUDA=ON && ninja -C $build meshrun-train meshrun-gpu-check meshrun-nccl-check'"
done
grep -q 'libcublasLt' <(ldd "$build/trainer/meshrun-train") ||
  die "$build/trainer/meshrun-train is not a CUDA build (it links no cuBLASLt): configure $build with -DMESHRUN_CUDA=ON"

# Open MPI's and PMIx's plugin directories as this Debian installs them.
ompi_plugins=$(ls -d /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3 2>/dev/null) || die "Open MPI's plugins (libopenmpi3) not found"
pmix_plugins=$(ls -d /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix 2>/dev/null) || die "PMIx's plugins (libpmix2) not found"

# Libraries the GPU machine brings itself: glibc, the compiler's runtime, the driver and NVIDIA's libraries.
system_lib() {
  case "$(basename "$1")" in
    ld-linux*|libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libresolv.so*|libutil.so*) return 0 ;;
    libstdc++.so*|libgcc_s.so*) return 0 ;;
    libcuda.so*|libcublas*|libnccl*|libcudart*|libnvidia*) return 0 ;;
  esac
  return 1
}

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/openmpi" "$out/pmix" "$out/share"
declare -A copied=()
# copy_deps FILE: the libraries FILE loads, recursively (ldd resolves the whole closure); 1 when one is missing.
copy_deps() {
  local line name path ok=0
  while read -r line; do
    case "$line" in
      *"=> not found"*) ok=1; continue ;;
      *"=> /"*) name=${line%% *}; path=${line#*=> }; path=${path%% (*} ;;
      *) continue ;;
    esac
    system_lib "$name" && continue
    [ -n "${copied[$name]:-}" ] && continue
    cp -L "$path" "$out/lib/$name"
    copied[$name]=1
  done < <(ldd "$1" 2>/dev/null)
  return $ok
}
for b in "${bins[@]}"; do
  strip -o "$out/bin/$(basename "$b")" "$build/$b"
  copy_deps "$build/$b" || die "$build/$b loads a library ldd cannot find here"
done
# Plugins whose libraries are all here (those for InfiniBand verbs, UCX, libfabric, PSM need hardware
# libraries this machine lacks and a one-GPU singleton never uses).
skipped=()
for dir in "$ompi_plugins:openmpi" "$pmix_plugins:pmix"; do
  src=${dir%%:*} dst=${dir##*:}
  for p in "$src"/*.so; do
    if ldd "$p" 2>/dev/null | grep -q 'not found'; then skipped+=("$(basename "$p")"); continue; fi
    cp -L "$p" "$out/$dst/"
    copy_deps "$p"
  done
done
cp /usr/share/openmpi/help-*.txt "$out/share/" 2>/dev/null || true
cp /etc/openmpi/openmpi-mca-params.conf "$out/share/" 2>/dev/null || true
strip --strip-unneeded "$out"/lib/*.so* "$out"/openmpi/*.so "$out"/pmix/*.so 2>/dev/null || true

cat > "$out/env.sh" <<'ENV'
# Sourced by bench/gpu/check.sh: meshrun's binaries and the libraries bundled beside them.
b="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export LD_LIBRARY_PATH="$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$b/bin:$PATH"
# Open MPI as a singleton (no mpirun, no orted): its plugins, help texts and Debian's defaults from here.
export OMPI_MCA_mca_base_component_path="$b/openmpi" PMIX_MCA_mca_base_component_path="$b/pmix"
export OMPI_MCA_mca_base_param_files="$b/share/openmpi-mca-params.conf" OPAL_PKGDATADIR="$b/share"
export OMPI_MCA_ess_singleton_isolated=1
export MESHRUN_GPU_CHECK="$b/bin/meshrun-gpu-check" MESHRUN_NCCL_CHECK="$b/bin/meshrun-nccl-check"
export MESHRUN_TRAIN="$b/bin/meshrun-train"
ENV
# The newest glibc and libstdc++ symbol versions anything here needs: the GPU machine must have at least these.
newest() { find "$out" -type f \( -name '*.so*' -o -path "$out/bin/*" \) -exec objdump -T {} + 2>/dev/null |
           grep -o "$1[0-9.]*" | sed "s/$1//" | sort -uV | tail -1; }
echo "bench/gpu/bundle.sh: $out: $(du -sb "$out" | cut -f1) bytes; ${#copied[@]} libraries; needs glibc $(newest GLIBC_) and GLIBCXX_$(newest GLIBCXX_); plugins left out (libraries absent here): ${skipped[*]:-none}"
