#!/usr/bin/env bash
# The vendor kit, end to end, as a vendor would use it:
#   1. install dray from an existing build folder into a temporary staging root
#      (meson install --destdir) and check what a vendor gets: dray/backend.h,
#      dray-backend.pc with Cflags, a plugindir that holds the installed plugins,
#      and no Libs (a plugin links nothing of dray);
#   2. build plugins/template OUT of tree against that install, found only
#      through pkg-config (PKG_CONFIG_PATH + PKG_CONFIG_SYSROOT_DIR), warnings
#      as errors, and check it exports exactly one symbol;
#   3. certify it with the standalone kit (no engine):
#      <build>/plugins/conformance/dray-conformance --plugin <the built .so>;
#   4. find it by name (libdray-<name>.so on a plugin path) through `dray conformance`.
# Usage: ci/vendor-kit.sh BUILD_DIR      (tests/meson.build runs it as `vendor_kit`)
# Needs meson, ninja, pkg-config and a C compiler; no network. Exit 0 when all
# passes, 1 on any failure, 77 (meson's "skipped") when pkg-config is absent.
# KEEP_VENDOR_KIT=1 keeps the temporary folder for a look afterwards.
set -euo pipefail

fail() { echo "vendor-kit: FAIL: $*" >&2; exit 1; }
step() { echo "vendor-kit: $*"; }

[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd) || fail "build folder '$1' does not exist"
src=$(cd "$(dirname "$0")/.." && pwd)
dray="$build/tools/dray"
kit="$build/plugins/conformance/dray-conformance"
[ -f "$build/meson-private/install.dat" ] || fail "$build is not a configured meson build folder"
[ -x "$dray" ] || fail "$dray is missing: build dray first (ninja -C $build)"
command -v pkg-config >/dev/null || { echo "vendor-kit: SKIP: pkg-config is not installed"; exit 77; }
command -v meson >/dev/null || fail "meson is not on PATH"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dray-vendor-kit.XXXXXX")
if [ "${KEEP_VENDOR_KIT:-0}" = 1 ]; then
  echo "vendor-kit: keeping $tmp"
else
  trap 'rm -rf "$tmp"' EXIT
fi
stage="$tmp/stage"

# ---- 1. install into the staging root --------------------------------------
step "installing $build into $stage"
# --no-rebuild: the test harness has built everything; a nested ninja would race it
meson install -C "$build" --no-rebuild --quiet --destdir "$stage" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log" >&2; fail "meson install failed"; }

pc=$(find "$stage" -name dray-backend.pc -print -quit)
[ -n "$pc" ] || fail "no dray-backend.pc was installed (see include/meson.build)"
export PKG_CONFIG_PATH="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$stage"
export PKG_CONFIG_LIBDIR="$PKG_CONFIG_PATH" # nothing from the system's pkg-config dirs
step "using $pc"

cflags=$(pkg-config --cflags dray-backend) || fail "pkg-config cannot read $pc"
libs=$(pkg-config --libs dray-backend)
[ -z "$libs" ] || fail "dray-backend.pc has Libs '$libs': a plugin must link nothing of dray"
inc=$(pkg-config --variable=includedir dray-backend)
case "$inc" in "$stage"/*) ;; *) inc="$stage$inc" ;; esac # pkg-config 0.29 does not prefix variables
[ -f "$inc/dray/backend.h" ] || fail "backend.h is not at $inc/dray/backend.h (Cflags: $cflags)"
[ -f "$inc/dray/backend_util.h" ] || fail "the plugin helper backend_util.h is not installed beside backend.h"
case " $cflags " in *" -I$inc "*) ;; *) fail "Cflags '$cflags' do not name $inc" ;; esac
plugindir=$(pkg-config --variable=plugindir dray-backend)
[ -n "$plugindir" ] || fail "dray-backend.pc has no plugindir variable"
case "$plugindir" in "$stage"/*) ;; *) plugindir="$stage$plugindir" ;; esac
[ -f "$plugindir/libdray-cpu.so" ] || fail "plugindir $plugindir does not hold the installed CPU plugin"
step "backend.h at $inc/dray, plugindir $plugindir"

# the installed dray, run from where it was installed, finds the installed plugins on
# its own: no DRAY_PLUGIN_PATH, and none of the build tree's folders
installed=$(find "$stage" -path '*/bin/dray' -type f -print -quit)
[ -x "$installed" ] || fail "no bin/dray was installed"
env -u DRAY_PLUGIN_PATH "$installed" devices >"$tmp/devices.log" 2>&1 ||
  { cat "$tmp/devices.log" >&2; fail "the installed $installed devices failed"; }
grep -q "^  cpu .*$plugindir/libdray-cpu.so" "$tmp/devices.log" ||
  { cat "$tmp/devices.log" >&2; fail "the installed dray did not load its plugins from $plugindir"; }
! grep -q "$build/backends" "$tmp/devices.log" ||
  fail "the installed dray loaded plugins from the build tree $build"
step "installed dray loads its own plugins from $plugindir"

# ---- 2. build the template out of tree -------------------------------------
step "building plugins/template out of tree"
meson setup "$tmp/template" "$src/plugins/template" -Dwerror=true --wrap-mode=nodownload \
  >"$tmp/setup.log" 2>&1 || { cat "$tmp/setup.log" >&2; fail "meson setup of plugins/template failed"; }
ninja -C "$tmp/template" >"$tmp/ninja.log" 2>&1 ||
  { cat "$tmp/ninja.log" >&2; fail "plugins/template does not build warning-clean"; }
so="$tmp/template/libdray-template.so"
[ -f "$so" ] || fail "the build made no $so"
if command -v nm >/dev/null; then
  syms=$(nm -D --defined-only "$so" | awk '$2 ~ /^[TDBRVWiu]$/ { print $3 }' | sort | tr '\n' ' ')
  [ "$syms" = "dray_plugin_negotiate " ] ||
    fail "$so must export only dray_plugin_negotiate, it exports: $syms"
  step "exports: $syms"
fi

# ---- 3. certify it ----------------------------------------------------------
[ -x "$kit" ] || fail "$kit is missing: build dray first (ninja -C $build)"
step "$kit --plugin $so"
"$kit" --plugin "$so" || fail "the template plugin does not pass conformance"

# ---- 4. found by name on a plugin path ---------------------------------------
mkdir -p "$tmp/plugins"
cp "$so" "$tmp/plugins/"
"$dray" conformance --plugin template --plugin-path "$tmp/plugins" --op add --reps 2 --no-timing \
  >"$tmp/byname.log" 2>&1 || { cat "$tmp/byname.log" >&2; fail "dray conformance does not find libdray-template.so by the name 'template'"; }
step "found by name: $(grep '^subject:' "$tmp/byname.log")"
step "PASS"
