#!/usr/bin/env bash
# `dray plugin new NAME [DIR]` (tools/plugin_new.c), from the build tree (which
# copies the source tree's plugins/template): the copy is renamed everywhere,
# bad names and non-empty folders are refused with a reason and write nothing.
# The installed path (share/dray/template, pkg-config lines, a build and
# certification of the copy) is ci/vendor-kit.sh's.
# Usage: tests/plugin_new.sh DRAY
set -euo pipefail
fail() { echo "plugin_new: FAIL: $*" >&2; exit 1; }
dray=$1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dray-plugin-new.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# a good name: every file renamed, no "template"/"tpl" left in any case
"$dray" plugin new my_chip2 "$tmp/m" >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; fail "plugin new my_chip2 failed"; }
for f in my_chip2.h my_chip2_plugin.c my_chip2_ops.c my_chip2_kv.c my_chip2_check.c my_chip2_packed.c meson.build; do
  [ -f "$tmp/m/$f" ] || fail "no $f in the copy: $(ls "$tmp/m")"
done
! grep -rniE 'template|tpl' "$tmp/m" || fail "the copy still says template/tpl (above)"
grep -q '#define MY_CHIP2_NAME "my_chip2"' "$tmp/m/my_chip2.h" || fail "the plugin name is not my_chip2"
grep -q "shared_module('dray-my_chip2'" "$tmp/m/meson.build" || fail "the module is not libdray-my_chip2.so"
grep -q '"my_chip2 (host memory' "$tmp/m/my_chip2_plugin.c" || fail "the device name is not renamed"
grep -q "wrote plugin 'my_chip2' to $tmp/m" "$tmp/log" || fail "no summary line: $(cat "$tmp/log")"

# refusals: exit 2 for a bad name, 1 for a folder in the way; nothing written
expect() { # expect STATUS TEXT ARGS...
  local want=$1 text=$2; shift 2
  set +e; "$dray" plugin new "$@" >"$tmp/out" 2>&1; local rc=$?; set -e
  [ "$rc" = "$want" ] || fail "plugin new $* exited $rc, expected $want: $(cat "$tmp/out")"
  grep -qF "$text" "$tmp/out" || fail "plugin new $*: no '$text' in: $(cat "$tmp/out")"
}
expect 2 "must start with a lower-case letter" Bad "$tmp/b1"
expect 2 "is not a-z, 0-9 or '_'" my-chip "$tmp/b2"
expect 2 "is taken by a plugin dray ships" cuda "$tmp/b3"
expect 2 "contains 'template' or 'tpl'" mytemplate "$tmp/b4"
expect 2 "NAME is required"
expect 1 "exists and is not empty" other "$tmp/m"
expect 1 "no plugin template" acme2 "$tmp/b5" --template "$tmp/nowhere"
for d in b1 b2 b3 b4 b5; do [ ! -e "$tmp/$d" ] || fail "a refused plugin new wrote $tmp/$d"; done
[ "$(ls "$tmp/m" | wc -l)" = 8 ] || fail "a refused plugin new changed $tmp/m: $(ls "$tmp/m")"
echo "plugin_new: PASS"
