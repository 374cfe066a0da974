#!/usr/bin/env bash
# Prints the first libclang that bindgen (through clang-sys, which dlopens it) would load, and
# exits 1 when there is none. clang-sys loads libclang.so, libclang.so.N, libclang-N.so and
# libclang-N.so.N; libclang-cpp (LLVM's C++ library, which Debian installs beside clang
# tooling without libclang) is not libclang, so it does not count.
# PEERLESS_SYSROOT prefixes every directory searched (scripts/tests/find_libclang.sh gives it a
# fake tree, so the check is tested without trusting what this machine has installed).
set -uo pipefail
root=${PEERLESS_SYSROOT:-}

dirs=()
# The places clang-sys looks, in its order: LIBCLANG_PATH, llvm-config's libdir, then the usual
# library directories (LD_LIBRARY_PATH's among them).
[ -n "${LIBCLANG_PATH:-}" ] && dirs+=("$LIBCLANG_PATH")
if [ -z "$root" ] && command -v llvm-config >/dev/null 2>&1; then
  dirs+=("$(llvm-config --libdir 2>/dev/null)")
fi
IFS=: read -ra ld_dirs <<<"${LD_LIBRARY_PATH:-}"
dirs+=("${ld_dirs[@]}")
for d in "$root"/usr/lib/llvm-*/lib "$root"/usr/local/llvm*/lib; do
  [ -d "$d" ] && dirs+=("${d#"$root"}")
done
dirs+=(/usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 /lib64 /usr/lib /lib /usr/local/lib)

for d in "${dirs[@]}"; do
  [ -n "$d" ] && [ -d "$root$d" ] || continue
  for f in "$root$d"/libclang.so "$root$d"/libclang.so.* "$root$d"/libclang-[0-9]*.so "$root$d"/libclang-[0-9]*.so.*; do
    if [ -e "$f" ]; then
      echo "${f#"$root"}"
      exit 0
    fi
  done
done
exit 1
