#!/usr/bin/env bash
# Certification of the serving path (`dray conformance --model FILE --certify OUT`,
# tools/certify.c and tools/cert_json.c) on a tiny Gemma 3 written by the tests'
# GGUF writer: every in-tree plugin built here that has a device, and the template
# (as ABI 4, its packed-weight and version-4 rows included, and as ABI 1), must pass, and their certificates must say so; a
# plugin with a wrong op must get a failing certificate that names why.
# Certificates are kept in BUILD/certificates/ (CI can publish them).
# Usage: tests/certify.sh DRAY WRITE_TINY_GEMMA BUILD_DIR
set -euo pipefail
fail() { echo "certify: FAIL: $*" >&2; exit 1; }
dray=$1 writer=$2 build=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dray-certify.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export DRAY_CACHE_DIR="$tmp/cache" # the calibration cache stays out of $HOME
certs="$build/certificates"
mkdir -p "$certs"
"$writer" "$tmp/tiny.gguf" || fail "cannot write the tiny model"
version=$("$dray" --version | awk '{ print $2 }')

# check CERT NAME ABI RESULT: the certificate's keys and verdicts (python3: JSON);
# ABI may list the versions allowed, "2|3"
check() {
  python3 - "$@" "$version" <<'PY' || fail "certificate $1 is not what it should be (above)"
import json, re, sys
path, name, abi, result, version = sys.argv[1:6]
c = json.load(open(path))
def need(cond, what):
    if not cond:
        print(f"{path}: {what}", file=sys.stderr); sys.exit(1)
need(c["format"] == "dray-certificate/1", "format")
need(c["result"] == result, f"result {c['result']}, expected {result}")
need(c["dray_version"] == version, "dray_version")
need(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", c["date"]), "date")
need(c["plugin"]["name"] == name, f"plugin name {c['plugin']['name']}")
need(c["abi"]["plugin"] in [int(a) for a in abi.split("|")] and c["abi"]["host"] >= c["abi"]["plugin"], "abi")
need(c["device"]["name"], "device name")
v = c["ops"]["variants"]
# one row per op x dtype the kit knows (the kit's table grows with the ABI)
need(len(v) >= 12 and len({(r["op"], r["dtype"]) for r in v}) == len(v), "one row per op variant")
need(c["ops"]["variants_run"] <= len(v) and c["ops"]["variants_passed"] <= c["ops"]["variants_run"], "counts")
m = c["model"]
checks = {k["name"]: k for k in m["checks"]}
if result == "pass":
    need(c["ops"]["passed"] and all(r["passed"] or r["verdict"] == "not supported" for r in v), "ops")
    need(m["passed"] and m["error"] is None, "model")
    for k in ("logits", "greedy", "batched", "prefix_cache", "kv_spill", "kv_transfer"):
        off = k in ("prefix_cache", "kv_spill") and not checks["prefix_cache"]["ran"]
        need(checks[k]["ran"] and checks[k]["passed"] or (off and not checks[k]["ran"]), f"check {k}")
    need(checks["logits"]["measured"] <= checks["logits"]["tolerance"], "logits within tolerance")
    need(checks["greedy"]["measured"] == checks["greedy"]["tolerance"] > 0, "greedy tokens")
    need(not checks["prefix_cache"]["ran"] or checks["prefix_cache"]["measured"] >= 1, "prefix cache reuse")
    need(not checks["kv_spill"]["ran"] or checks["kv_spill"]["measured"] >= 1, "KV restored from the host")
    # the tiny model's KV moved subject -> cpu and cpu -> subject: both continue with
    # their cold tokens (its plugins agree to ~1e-13 KL, so no near-tie is needed)
    kt = checks["kv_transfer"]
    need(kt["measured"] == kt["tolerance"] > 0, f"kv_transfer tokens: {kt['detail']}")
    need(re.search(r"-> cpu: [1-9]\d* tokens' KV", kt["detail"]) and
         re.search(r"cpu -> \w+: [1-9]\d* tokens' KV", kt["detail"]), f"kv_transfer moved KV both ways: {kt['detail']}")
else:
    need(not c["ops"]["passed"] or not m["passed"], "a failing certificate says where")
print(f"{path}: {c['result']}: {name} ABI {c['abi']['plugin']} on {c['device']['name']}")
PY
}

certify() { # certify PLUGIN OUT [ARGS...]: exit status of dray conformance
  local p=$1 out=$2; shift 2
  "$dray" conformance --plugin "$p" --no-timing --reps 3 --model "$tmp/tiny.gguf" --tokens 12 \
    --certify "$out" "$@" >"$tmp/log" 2>&1
}

# every in-tree plugin with a device
n=0
for so in "$build"/backends/*/libdray-*.so; do
  [ -e "$so" ] || continue
  name=$(basename "$so" .so); name=${name#libdray-}
  "$dray" devices --plugin-path "$(dirname "$so")" 2>/dev/null | grep -q "^    $name: no device" && continue
  certify "$name" "$certs/$name.json" || { cat "$tmp/log" >&2; fail "$name does not certify"; }
  check "$certs/$name.json" "$name" "2|3|4|5" pass # the in-tree plugins move to a new ABI one by one
  n=$((n + 1))
done
[ "$n" -ge 1 ] || fail "no in-tree plugin certified"

# the template, as built in tree for the tests (tests/plugins: tplv4, tplv1); as
# ABI 4 it declares every packed format (version 4's two-level ones included),
# and each has a passing row of its own, as do both refusal rows and version
# 4's rope factors and attention softcap
certify "$build/tests/plugins/libdray-tplv4.so" "$certs/template.json" ||
  { cat "$tmp/log" >&2; fail "the template does not certify"; }
check "$certs/template.json" tplv4 4 pass
python3 - "$certs/template.json" <<'PY' || fail "the ABI-4 template's certificate lacks its packed-weight or v4 rows"
import json, sys
v = json.load(open(sys.argv[1]))["ops"]["variants"]
packed = [r for r in v if r["dtype"].startswith("q")]
assert len(packed) == 45 and all(r["passed"] for r in packed), packed  # (12 + 3) embed + (12 + 3) x 2 matmul
two_level = {r["dtype"] for r in packed if "-k" in r["dtype"]}
assert two_level == {"q4-k", "q5-k", "q6-k", "q4-k-x2", "q5-k-x2", "q6-k-x2"}, two_level
refusals = {r["dtype"]: r["passed"] for r in v if r["op"] == "weight_create"}
assert refusals == {"refusals": True, "refusals-k": True}, refusals
v4 = {(r["op"], r["dtype"]): r["passed"] for r in v if r["dtype"] in ("f32-ff-mscale", "i8-softcap", "f16-softcap")}
assert len(v4) == 3 and all(v4.values()), v4
PY
certify "$build/tests/plugins/libdray-tplv1.so" "$tmp/tplv1.json" --set prefix_cache=false ||
  { cat "$tmp/log" >&2; fail "the ABI-1 template does not certify"; }
check "$tmp/tplv1.json" tplv1 1 pass
grep -q '"name": "prefix_cache", "ran": false' "$tmp/tplv1.json" ||
  fail "with prefix_cache=false the prefix_cache check must be reported as not run"

# a plugin whose add is off by 1e-3: exit 1, a failing certificate naming why
set +e; certify "$build/tests/plugins/libdray-fakewrongadd.so" "$tmp/bad.json"; rc=$?; set -e
[ "$rc" = 1 ] || { cat "$tmp/log" >&2; fail "a wrong plugin exited $rc, expected 1"; }
check "$tmp/bad.json" fakewrongadd 1 fail
grep -q '"op": "add", "dtype": "f32", "passed": false' "$tmp/bad.json" || fail "the wrong add is not named"
grep -q '"error": "the model does not open on' "$tmp/bad.json" || fail "the model error is not named"

# usage errors write nothing
set +e; "$dray" conformance --plugin cpu --set nosuchkey=1 --certify "$tmp/u.json" >"$tmp/log" 2>&1; rc=$?; set -e
[ "$rc" = 2 ] && [ ! -e "$tmp/u.json" ] || fail "--set nosuchkey=1 exited $rc, expected 2 and no file"
echo "certify: PASS ($n in-tree plugins and the template certified; certificates in $certs)"
