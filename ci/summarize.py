"""Print the closing line CI reads ("N passed, N failed, N skipped") from meson's
testlog.json, list what failed, and exit 1 if anything failed."""
import json
import sys

counts = {"passed": 0, "failed": 0, "skipped": 0}
failed = []
with open(sys.argv[1]) as f:
    for line in f:
        if not line.strip():
            continue
        t = json.loads(line)
        r = t.get("result")
        if r in ("OK", "EXPECTEDFAIL"):
            counts["passed"] += 1
        elif r == "SKIP":
            counts["skipped"] += 1
        else:
            counts["failed"] += 1
            failed.append(f'{t.get("name")}: {r}')
for name in failed:
    print("FAILED", name)
print(f'{counts["passed"]} passed, {counts["failed"]} failed, {counts["skipped"]} skipped')
sys.exit(1 if counts["failed"] or not counts["passed"] else 0)
