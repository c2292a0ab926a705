#!/bin/sh
# Rooms (docs/design.md): a file reaches another room's header only through the
# include paths the build gives it, so `#include "../x.h"` (a path that climbs
# out of its folder) is never needed and is how a back-edge would sneak past the
# build. Fails naming every such line. Usage: check-includes.sh SOURCE_ROOT
root=${1:-.}
cd "$root" || { echo "check-includes: cannot enter '$root'" >&2; exit 2; }
# the tracked sources in a git checkout, else every source outside build folders
list() {
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git ls-files -- '*.c' '*.h' '*.cu' '*.cuh' '*.cpp'
    else
        find . -path './build*' -prune -o -path './.venv' -prune -o \
            \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' \) \
            -type f -print
    fi
}
files=$(list)
[ -n "$files" ] || { echo "check-includes: no C sources under '$root'" >&2; exit 2; }
bad=$(printf '%s\n' "$files" | xargs grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]\.\./' --)
if [ -n "$bad" ]; then
    echo "check-includes: these includes climb out of their folder; include a public" >&2
    echo "header (include/dray/) or add an include path in meson instead:" >&2
    echo "$bad" >&2
    exit 1
fi
echo "check-includes: no '#include \"../' in $(printf '%s\n' "$files" | wc -l) source files"
