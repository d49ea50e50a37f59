"""bench_run.py: what the *_vs_torch.py scripts share: run one side of a comparison and take its
JSON line. Exercised by every script that imports it (loss_vs_torch.py, step_vs_torch.py,
qwen35_vs_torch.py); not a test.
"""
import json
import subprocess
import sys


def run_json(tool, cmd, env):
    """cmd's last stdout line starting with '{' as an object, and all it printed; (None, what it
    printed) when it exits 77 (skipped: no torch, no GPU); any other failure ends the script,
    named after `tool`, with cmd's stderr."""
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode == 77:
        return None, done.stdout + done.stderr
    if done.returncode != 0:
        sys.exit(f"{tool}: {' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]), done.stdout
