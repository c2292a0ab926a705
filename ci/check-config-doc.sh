#!/bin/sh
# docs/config.md's key table is generated from the table of keys in core/config.c
# (`dray config --markdown`), so the two cannot drift: this fails when the table
# between the BEGIN/END markers differs from what the binary prints, and with
# --update rewrites it. Usage: check-config-doc.sh DRAY SOURCE_ROOT [--update]
set -eu
dray=$1 root=$2 mode=${3:-check}
doc="$root/docs/config.md"
[ -x "$dray" ] || { echo "check-config-doc: $dray is not an executable: build dray first" >&2; exit 2; }
[ -f "$doc" ] || { echo "check-config-doc: no $doc" >&2; exit 2; }
grep -q '^<!-- BEGIN generated' "$doc" && grep -q '^<!-- END generated -->' "$doc" ||
    { echo "check-config-doc: $doc lacks the BEGIN/END generated markers" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dray-config-doc.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$dray" config --markdown >"$tmp/table"
# the doc with the generated table replaced by what the binary prints now
awk -v table="$tmp/table" '
    /^<!-- END generated -->/ { while ((getline line < table) > 0) print line; skip = 0 }
    !skip { print }
    /^<!-- BEGIN generated/ { skip = 1 }
    /^     edit the table there/ && skip { print }
' "$doc" >"$tmp/doc"
if cmp -s "$doc" "$tmp/doc"; then
    echo "check-config-doc: docs/config.md matches dray config --markdown"
    exit 0
fi
if [ "$mode" = --update ]; then
    cp "$tmp/doc" "$doc"
    echo "check-config-doc: rewrote the key table of $doc"
    exit 0
fi
echo "check-config-doc: docs/config.md is stale against core/config.c's key table:" >&2
diff -u "$doc" "$tmp/doc" >&2 || true
echo "run: ci/check-config-doc.sh $dray $root --update" >&2
exit 1
