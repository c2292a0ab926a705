#!/bin/sh
# ci/check-includes.sh, the rule behind the `rooms` test, read as a spec: on a
# small tree outside git, each forbidden include fails with the file, the line
# and the room's rule, and a tree that keeps to its rooms passes.
# Usage: rooms_rules.sh SOURCE_ROOT
check=$1/ci/check-includes.sh
t=$(mktemp -d) || exit 2
trap 'rm -rf "$t"' EXIT
fails=0
mk() { mkdir -p "$t/$(dirname "$1")" && printf '%s\n' "$2" > "$t/$1"; }
# expect STATUS TEXT: run the check on $t; its status and a line of its output
expect() {
    out=$(sh "$check" "$t" 2>&1)
    rc=$?
    if [ "$rc" != "$1" ] || ! printf '%s\n' "$out" | grep -qF -- "$2"; then
        echo "FAIL: expected status $1 and '$2', got $rc:"; printf '%s\n' "$out"
        fails=$((fails + 1))
    fi
}
mk bench/bench_model.c '#include "bench.h"
#include "flags.h"'
mk bench/bench.h '#include "dray/dray.h"'
mk bench/bench_ops.c '#include "dray/backend.h"
#include "conf_loader.h"'
mk server/buf.c '#include "dray/dray.h"'
mk core/kv.h '#include "dray/backend.h"'
mk models/llama.c '#include "kv.h"'
mk backends/cpu/cpu.c '#include "cpu_kernels.h"'
mk kernels/cpu/cpu_kernels.h '#include "dray/backend_util.h"'
expect 0 "keep to their rooms"
mk bench/bench_model.c '#include "dray/plugins.h"'
expect 1 "bench/bench_model.c:1: #include \"dray/plugins.h\""
mk bench/bench_model.c '#include "bench.h"'
mk bench/bench_ops.c '#include <dray/dray.h>'
expect 1 "room ^bench/bench_ops"
mk bench/bench_ops.c '#include "dray/backend.h"'
mk server/buf.c '#include "kv.h"'
expect 1 "server/buf.c:1:"
mk server/buf.c '#include "../core/kv.h"'
expect 1 "climbs out of its folder"
mk server/buf.c '#include "dray/dray.h"'
mk backends/cpu/cpu.c '#include "kv.h"'
expect 1 "backends/cpu/cpu.c:1:"
mk backends/cpu/cpu.c '#include "cpu_kernels.h"'
mk core/engine_internal.h '#include "kv.h"'
mk core/gguf/gguf.h '#include "error.h"'
mk core/text/tokenizer.c '#include "gguf.h"'
mk core/kv/prefix_cache.c '#include "error.h"'
expect 0 "keep to their rooms"
mk core/kv/prefix_cache.c '#include "engine_internal.h"'
expect 1 "room ^core/kv/"
mk core/kv/prefix_cache.c '#include "error.h"'
mk core/gguf/gguf.c '#include "tokenizer.h"'
mk core/text/tokenizer.h '#include "error.h"'
expect 1 "core/gguf/gguf.c:1: #include \"tokenizer.h\""
rm "$t/core/gguf/gguf.c"
mk newroom/x.c '#include "dray/dray.h"'
expect 1 "no room row matches"
rm -r "$t/newroom"
expect 0 "keep to their rooms"
[ "$fails" = 0 ] && echo "rooms_rules: ok" || exit 1
