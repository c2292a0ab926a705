#!/bin/sh
# The repository cites only what it holds: facts gathered outside it are copied
# into docs/ with their source (docs/reference/), so no source, header or doc
# may point into the project's shared folder (`../shared/`, `shared/reference/`),
# which a clone does not have. Fails naming every such line.
# Usage: check-citations.sh SOURCE_ROOT
root=${1:-.}
cd "$root" || { echo "check-citations: cannot enter '$root'" >&2; exit 2; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    files=$(git ls-files -- '*.c' '*.h' '*.cu' '*.cuh' '*.cpp' '*.py' '*.sh' '*.md' '*.build' '*.yaml')
else
    files=$(find . -path './build*' -prune -o -path './.venv' -prune -o -type f \
        \( -name '*.[ch]' -o -name '*.cu' -o -name '*.py' -o -name '*.sh' -o -name '*.md' \) -print)
fi
[ -n "$files" ] || { echo "check-citations: no files under '$root'" >&2; exit 2; }
# the copies in docs/ name where they came from on their first lines: that is the source, not a link
bad=$(printf '%s\n' "$files" | grep -v '^ci/check-citations\.sh$' | xargs grep -HnE '(\.\./|[^/a-z_])shared/(reference/|[A-Z]+\.md)' -- |
      grep -vE '^(\./)?docs/[^:]*\.md:[1-3]:')
if [ -n "$bad" ]; then
    echo "check-citations: these lines cite the shared folder, which is not in the repository;" >&2
    echo "copy the facts into docs/ (docs/reference/) with their source and cite that:" >&2
    echo "$bad" >&2
    exit 1
fi
echo "check-citations: $(printf '%s\n' "$files" | wc -l) files cite only the repository"
