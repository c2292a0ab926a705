"""ci/summarize.py counts cmocka cases skipped inside a passing test binary:
the closing line must not call a binary with skipped cases fully passed."""
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ci", "summarize.py")

CMOCKA_OUT = """[==========] Running 3 test(s).
[ RUN      ] test_a
[       OK ] test_a
[ RUN      ] test_real_model
[  SKIPPED ] test_real_model
[ RUN      ] test_gpu
[  SKIPPED ] test_gpu
[==========] 3 test(s) run.
[  PASSED  ] 1 test(s).
[  SKIPPED ] 2 test(s), listed below:
[  SKIPPED ] test_real_model
[  SKIPPED ] test_gpu

 2 SKIPPED TEST(S)
"""


def run(records):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    p = subprocess.run([sys.executable, SCRIPT, f.name], capture_output=True, text=True)
    os.unlink(f.name)
    return p.returncode, p.stdout.strip().splitlines()


def main():
    rc, out = run([
        {"name": "dray / unit", "result": "OK", "stdout": CMOCKA_OUT, "stderr": ""},
        {"name": "dray / plain", "result": "OK", "stdout": "[  PASSED  ] 4 test(s).\n"},
        {"name": "dray:reference / ref", "result": "SKIP", "stdout": ""},
    ])
    assert rc == 0, (rc, out)
    assert out[-1] == "2 passed, 0 failed, 3 skipped", out
    assert "SKIPPED dray / unit: test_real_model" in out, out
    assert "SKIPPED dray / unit: test_gpu" in out, out
    rc, out = run([{"name": "dray / bad", "result": "FAIL", "stdout": CMOCKA_OUT},
                   {"name": "dray / ok", "result": "OK", "stdout": ""}])
    assert rc == 1 and out[-1] == "1 passed, 1 failed, 0 skipped", (rc, out)
    print("summarize: ok")


if __name__ == "__main__":
    main()
