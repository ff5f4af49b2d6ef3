#!/usr/bin/env bash
# fetch_deps.sh: the C libraries fp8-grpo builds with (cJSON, PCRE2; Check for the tests), fetched
# from Debian/Ubuntu's package archive into a local folder, without root: apt-get download, then
# dpkg -x. The Makefile runs it when the system has not got them, and prints that it does.
#
#   ./fetch_deps.sh [DIR]        (default .deps; the Makefile then builds with DEPS_PREFIX=DIR/usr)
set -euo pipefail
dir=${1:-.deps}
pkgs=(libcjson-dev libcjson1 libpcre2-dev libpcre2-8-0 check libsubunit-dev libsubunit0)
if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
  echo "fetch_deps: no apt-get/dpkg here: install cJSON, PCRE2 and Check with your package manager" \
       "(Debian: libcjson-dev libpcre2-dev check) or unpack them and pass make DEPS_PREFIX=dir" >&2
  exit 1
fi
mkdir -p "$dir/debs" "$dir/lists/partial"
dir=$(cd "$dir" && pwd)
# apt-get download needs the package lists; refresh them once if the first try fails
if ! (cd "$dir/debs" && apt-get download "${pkgs[@]}" >"$dir/debs/apt.log" 2>&1); then
  apt-get update -qq -o Dir::State::Lists="$dir/lists" >>"$dir/debs/apt.log" 2>&1 || true
  (cd "$dir/debs" && apt-get download -o Dir::State::Lists="$dir/lists" "${pkgs[@]}" >>"$dir/debs/apt.log" 2>&1) || {
    echo "fetch_deps: apt-get download failed (see $dir/debs/apt.log): install ${pkgs[*]} (as root: apt-get install" \
         "libcjson-dev libpcre2-dev check), or pass make DEPS_PREFIX=dir" >&2
    exit 1
  }
fi
for f in "$dir"/debs/*.deb; do dpkg -x "$f" "$dir"; done
echo "fetch_deps: ${pkgs[*]} unpacked into $dir"
