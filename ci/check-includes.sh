#!/bin/sh
# Rooms (docs/design.md): a file reaches another room's header only through the
# include paths the build gives it, so `#include "../x.h"` (a path that climbs
# out of its folder) is never needed and is how a back-edge would sneak past the
# build. Fails naming every such line. Usage: check-includes.sh SOURCE_ROOT
root=${1:-.}
cd "$root" || { echo "check-includes: cannot enter '$root'" >&2; exit 2; }
bad=$(git ls-files -- '*.c' '*.h' '*.cu' '*.cpp' 2>/dev/null |
      xargs -r grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]\.\./' --)
if [ -z "$(git ls-files -- '*.c' | head -n1)" ]; then
    echo "check-includes: no C sources found under '$root' (not a git checkout?)" >&2
    exit 2
fi
if [ -n "$bad" ]; then
    echo "check-includes: these includes climb out of their folder; include a public" >&2
    echo "header (include/dray/) or add an include path in meson instead:" >&2
    echo "$bad" >&2
    exit 1
fi
echo "check-includes: no '#include \"../' in the tree"
