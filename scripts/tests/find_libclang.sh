#!/usr/bin/env bash
# scripts/find_libclang.sh against fake trees: a Debian 12 with only libclang-cpp
# (what clang tooling installs) has no libclang; libclang1's and libclang-dev's files count.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
# expect NAME WANT(found|none) FILES...: a tree with FILES; find_libclang.sh finds one or not.
expect() {
  local name=$1 want=$2 tree="$tmp/$1" got
  shift 2
  mkdir -p "$tree"
  for f in "$@"; do
    mkdir -p "$tree/$(dirname "$f")"
    : >"$tree/$f"
  done
  if got=$(PEERLESS_SYSROOT="$tree" LIBCLANG_PATH="" LD_LIBRARY_PATH="" scripts/find_libclang.sh); then
    [ "$want" = found ] && echo "ok   $name: $got" && return
  else
    [ "$want" = none ] && echo "ok   $name: none" && return
  fi
  echo "FAIL $name: wanted $want, got '${got:-none}'" >&2
  fail=1
}
expect empty none
expect libclang-cpp-only none /usr/lib/x86_64-linux-gnu/libclang-cpp.so.14 /usr/lib/llvm-14/lib/libclang-cpp.so.14
expect libclang1-14 found /usr/lib/x86_64-linux-gnu/libclang-14.so.1 /usr/lib/llvm-14/lib/libclang.so.1
expect libclang-dev found /usr/lib/llvm-14/lib/libclang.so
expect rhel-style found /usr/lib64/libclang.so.17
expect cpp-beside-real found /usr/lib/llvm-16/lib/libclang-cpp.so.16 /usr/lib/llvm-16/lib/libclang-16.so
exit $fail
