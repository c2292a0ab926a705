#!/bin/sh
# Rooms (docs/design.md): which headers each folder may include. A file may
# include a header that sits next to it, and beyond that only what its room's
# row below allows; `#include "../x.h"` (a path that climbs out of its folder)
# is never allowed, since it is how a back-edge would sneak past the include
# paths the build gives each target. Fails naming every offending line and the
# rule it breaks. Usage: check-includes.sh SOURCE_ROOT
root=${1:-.}
cd "$root" || { echo "check-includes: cannot enter '$root'" >&2; exit 2; }
# the tracked sources in a git checkout, else every source outside build folders
list() {
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git ls-files -- '*.c' '*.h' '*.cu' '*.cuh' '*.cpp'
    else
        find . -path './build*' -prune -o -path './.venv' -prune -o \
            \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' \) \
            -type f -print | sed 's|^\./||'
    fi
}
files=$(list)
[ -n "$files" ] || { echo "check-includes: no C sources under '$root'" >&2; exit 2; }
listfile=$(mktemp) || exit 2
trap 'rm -f "$listfile"' EXIT
printf '%s\n' "$files" > "$listfile"

# One row per room: the file pattern (awk regex on the path; first match wins)
# and what it may include besides its neighbours. "core" = any header of core/
# (its rooms too) or models/ (the engine's private headers); "core/ROOM" = any
# header of that subfolder of core/; "kernels" = any header of kernels/. Core's
# rooms each take the base headers at core/'s root and the rooms below them.
rules='
^tests/                                   *
^include/dray/                            dray/backend.h dray/dray.h
^core/gguf/                               dray/* error.h log.h
^core/text/                               dray/* error.h log.h core/gguf
^core/kv/                                 dray/* error.h log.h
^core/weights/                            dray/* error.h log.h caps.h core/gguf core/text core/kv
^(core|models)/                           dray/* core
^bench/bench_ops\.[ch]$                   dray/backend.h conf_loader.h flags.h
^bench/grammar_mask\.c$                   dray/* core
^bench/grammar_worst\.c$                  dray/* core
^bench/                                   dray/dray.h flags.h
^tools/flags/                             -
^tools/cmd_devices\.c$                    dray/dray.h dray/plugins.h
^tools/cert_json\.c$                      dray/backend.h
^tools/cmd_(info|tokenize|perplexity)\.c$ dray/dray.h dray/gguf.h dray/tokenizer.h flags.h
^tools/                                   dray/dray.h flags.h bench.h bench_ops.h conformance.h server.h
^server/                                  dray/dray.h
^plugins/                                 dray/backend.h dray/backend_util.h
^transports/                              dray/dist.h
^kernels/                                 dray/backend.h dray/backend_util.h
^backends/                                dray/backend.h dray/backend_util.h kernels
'

printf '%s\n' "$files" | xargs awk -v listfile="$listfile" -v rules="$rules" '
BEGIN {
    while ((getline p < listfile) > 0) {
        have[p] = 1
        if (p ~ /^(core\/([^\/]+\/)?|models\/)[^\/]+\.h$/) {
            d = p; sub(/\/[^\/]*$/, "", d); sub(/^.*\//, "", p)
            core[p] = 1; hdir[p] = d
        }
    }
    nr = 0
    n = split(rules, line, "\n")
    for (i = 1; i <= n; i++) {
        if (line[i] ~ /^[ \t]*$/) continue
        nr++
        pat[nr] = line[i]; sub(/[ \t].*/, "", pat[nr])
        allow[nr] = line[i]; sub(/^[^ \t]+[ \t]+/, "", allow[nr])
    }
}
function kernel_header(h,    p) {
    for (p in have) if (p ~ /^kernels\// && substr(p, length(p) - length(h)) == "/" h) return 1
    return 0
}
function allowed(f, h,    r, k, a, i) {
    for (r = 1; r <= nr; r++) {
        if (f !~ pat[r]) continue
        k = split(allow[r], a, /[ \t]+/)
        for (i = 1; i <= k; i++) {
            if (a[i] == "*" || a[i] == h) return 1
            if (a[i] == "dray/*" && h ~ /^dray\//) return 1
            if (a[i] == "core" && (h in core)) return 1
            if (a[i] ~ /^core\// && (h in hdir) && hdir[h] == a[i]) return 1
            if (a[i] == "kernels" && kernel_header(h)) return 1
        }
        why = "room " pat[r] " allows " allow[r]
        return 0
    }
    why = "no room row matches this file (add one to ci/check-includes.sh)"
    return 0
}
/^[ \t]*#[ \t]*include[ \t]*("[^"]+"|<dray\/[^>]+>)/ {
    h = $0
    sub(/^[^"<]*["<]/, "", h); sub(/[">].*/, "", h)
    if (h ~ /^\.\.\//) {
        printf "%s:%d: %s\n    climbs out of its folder: include a public header (include/dray/) or add an include path in meson\n", FILENAME, FNR, $0
        bad++
        next
    }
    dir = FILENAME; sub(/\/[^\/]*$/, "", dir)
    if ((dir "/" h) in have) next
    if (!allowed(FILENAME, h)) {
        printf "%s:%d: %s\n    %s\n", FILENAME, FNR, $0, why
        bad++
    }
}
END { exit bad ? 1 : 0 }
' >&2 || { echo "check-includes: the includes above break the rooms (docs/design.md)" >&2; exit 1; }
echo "check-includes: $(printf '%s\n' "$files" | wc -l) source files keep to their rooms"
