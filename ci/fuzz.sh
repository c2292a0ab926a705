#!/usr/bin/env bash
# Fuzz one parser with clang's libFuzzer under ASan + UBSan.
#   ci/fuzz.sh TARGET SECONDS [WORK_DIR]   TARGET: gguf | config | tokenizer | request | schema | grammar
#   ci/fuzz.sh smoke [SECONDS] [WORK_DIR]  every target for SECONDS (default 5) each (CI)
# Builds tests/fuzz/fuzz_TARGET.c with the core sources it needs into WORK_DIR
# (default build-fuzz/), runs it on a scratch corpus seeded from
# tests/fuzz/corpus/TARGET (the committed seeds are never written), and prints the
# execution count. Crashes, leaks, timeouts and out-of-memory leave their input in
# WORK_DIR/TARGET/ and fail. Exit 77 (meson's "skipped") if clang or its libFuzzer
# runtime is missing (Debian: clang and libclang-rt-14-dev, or clang-14 with its
# runtime in libclang-common-14-dev).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
target="${1:?usage: ci/fuzz.sh gguf|config|tokenizer|request|schema|grammar|smoke SECONDS [WORK_DIR]}"
secs="${2:-5}"
work="${3:-$root/build-fuzz}"
cc="${CC_FUZZ:-clang}"

# Core files each target links (the parser and what it calls; no engine, no plugins).
declare -A srcs=(
  [gguf]="core/gguf/gguf.c core/gguf/gguf_get.c core/gguf/ggml_types.c core/gguf/dequant.c core/error.c core/log.c"
  [config]="core/config.c core/config_print.c core/error.c core/log.c"
  [tokenizer]="core/text/tokenizer.c core/text/tokenizer_encode.c core/text/tokenizer_detok.c core/text/tokenizer_bpe.c core/text/utf8.c core/gguf/gguf.c core/gguf/gguf_get.c core/gguf/ggml_types.c tests/gguf_write.c core/gguf/dequant.c core/error.c core/log.c"
  [request]="server/request.c server/tools.c server/json_grammar.c server/json_values.c server/json_pattern.c server/json_range.c core/text/grammar_parse.c core/text/grammar_check.c core/text/grammar_match.c core/text/grammar_mask.c core/text/grammar_budget.c core/text/utf8.c server/buf.c server/fields.c server/jfield.c server/sampling.c server/logprobs.c server/logprobs_json.c server/apierr.c server/mhderr.c core/config.c core/config_print.c core/error.c core/log.c"
  [schema]="server/json_grammar.c server/json_values.c server/json_pattern.c server/json_range.c server/buf.c server/apierr.c server/jfield.c core/text/grammar_parse.c core/text/grammar_check.c core/text/grammar_match.c core/text/grammar_mask.c core/text/grammar_budget.c core/text/utf8.c core/error.c core/log.c"
  [grammar]="core/text/grammar_parse.c core/text/grammar_check.c core/text/grammar_match.c core/text/grammar_mask.c core/text/grammar_budget.c core/text/utf8.c core/error.c core/log.c"
)
declare -A libs=([gguf]="-lm" [config]="-lyaml -lm" [tokenizer]="-lpcre2-8 -lm" [request]="-ljansson -lyaml -lxxhash -lm" [schema]="-ljansson -lxxhash -lm" [grammar]="-lxxhash -lm")
# Longest input: headers and configs are small; the tokenizer takes MiBs so that
# size-dependent memory blow-ups are reachable; grammars, schemas and request
# bodies take enough for nesting past every depth limit (a grammar's 1024
# parentheses are 2 KiB, 45,000 were 90 KiB), and their lengths grow without
# libFuzzer's slow ramp (len_control 0: any length up to max_len at once).
declare -A maxlen=([gguf]=65536 [config]=65536 [tokenizer]=4194304 [request]=262144 [schema]=131072 [grammar]=131072)
declare -A lenctl=([gguf]=100 [config]=100 [tokenizer]=100 [request]=0 [schema]=0 [grammar]=0)

have_fuzzer() {
  command -v "$cc" >/dev/null 2>&1 || return 1
  echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' \
    > "$work/probe.c"
  "$cc" -fsanitize=fuzzer,address,undefined "$work/probe.c" -o "$work/probe" 2>/dev/null
}

build() { # TARGET -> $work/fuzz_TARGET
  local t="$1" src=()
  for f in ${srcs[$t]}; do src+=("$root/$f"); done
  "$cc" -g -O1 -fno-omit-frame-pointer -std=gnu11 -D_GNU_SOURCE \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$root/include" -I"$root/core" -I"$root/core/gguf" -I"$root/core/text" -I"$root/core/kv" -I"$root/core/weights" -I"$root/server" -I"$root/tests" "$root/tests/fuzz/fuzz_$t.c" "${src[@]}" \
    ${libs[$t]} -o "$work/fuzz_$t"
}

run() { # TARGET SECONDS
  local t="$1" s="$2"
  local dir="$work/$t"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  build "$t" || { echo "fuzz $t: FAILED to build (the compiler's message is above)"; return 1; }
  local log="$dir/fuzz.log"
  local rc=0
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$work/fuzz_$t" "$dir/corpus" "$root/tests/fuzz/corpus/$t" \
      -max_total_time="$s" -max_len="${maxlen[$t]}" -len_control="${lenctl[$t]}" -timeout=20 -rss_limit_mb=2048 \
      -artifact_prefix="$dir/artifacts/" -print_final_stats=1 >"$log" 2>&1 || rc=$?
  local execs
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  if [ "$rc" -ne 0 ]; then
    echo "fuzz $t: FAILED after ${execs:-?} execs (exit $rc); inputs in $dir/artifacts/"
    grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$log" | head -20
    return 1
  fi
  echo "fuzz $t: ${execs:-?} execs in ${s}s, no crash, leak, timeout or OOM" \
       "(corpus $(ls "$dir/corpus" | wc -l) inputs)"
}

mkdir -p "$work"
if ! have_fuzzer; then
  echo "fuzz: SKIPPED: $cc with the libFuzzer runtime (-fsanitize=fuzzer) is not available"
  exit 77
fi
case "$target" in
  smoke) fail=0; for name in gguf config tokenizer request schema grammar; do run "$name" "$secs" || fail=1; done; exit $fail ;;
  gguf|config|tokenizer|request|schema|grammar) run "$target" "$secs" ;;
  *) echo "ci/fuzz.sh: unknown target '$target' (gguf, config, tokenizer, request, schema, grammar, smoke)" >&2; exit 2 ;;
esac
