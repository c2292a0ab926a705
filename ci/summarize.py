"""Print the closing line CI reads ("N passed, N failed, N skipped") from meson's
testlog.json, list what failed, and exit 1 if anything failed.

A cmocka binary that skip()s some of its cases still exits 0, so meson calls it OK;
those cases are counted as skipped here (from cmocka's "[  SKIPPED ] K test(s)"
summary in the test's output) and named, so a skip is never silent."""
import json
import re
import sys

CMOCKA_SKIPPED = re.compile(r"^\[  SKIPPED \] (\d+) test\(s\)", re.M)
CMOCKA_SKIPPED_CASE = re.compile(r"^\[  SKIPPED \] (?!\d+ test\(s\))(\S+)\s*$", re.M)


def skipped_cases(t):
    """(count, names) of cmocka cases the test binary skipped."""
    out = (t.get("stdout") or "") + "\n" + (t.get("stderr") or "")
    count = sum(int(n) for n in CMOCKA_SKIPPED.findall(out))
    names = sorted(set(CMOCKA_SKIPPED_CASE.findall(out)))
    return count, names


def summarize(path):
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failed, skipped = [], []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            t = json.loads(line)
            r = t.get("result")
            if r in ("OK", "EXPECTEDFAIL"):
                counts["passed"] += 1
                n, names = skipped_cases(t)
                counts["skipped"] += n
                skipped += [f'{t.get("name")}: {c}' for c in names] if names else \
                    ([f'{t.get("name")}: {n} case(s)'] if n else [])
            elif r == "SKIP":
                counts["skipped"] += 1
                skipped.append(f'{t.get("name")}')
            else:
                counts["failed"] += 1
                failed.append(f'{t.get("name")}: {r}')
    return counts, failed, skipped


def main():
    counts, failed, skipped = summarize(sys.argv[1])
    for name in skipped:
        print("SKIPPED", name)
    for name in failed:
        print("FAILED", name)
    print(f'{counts["passed"]} passed, {counts["failed"]} failed, {counts["skipped"]} skipped')
    return 1 if counts["failed"] or not counts["passed"] else 0


if __name__ == "__main__":
    sys.exit(main())
