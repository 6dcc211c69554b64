"""Mutation check of tests/test_relaunch.py on a GPU: a plan that relaunches its first remembered call whatever the
addresses (the bug the tests guard against) must fail them. Patches ropekit.fused.plan in a copy of the tree."""
import pathlib, shutil, subprocess, sys
src = pathlib.Path.cwd()
dst = pathlib.Path("/tmp/mutant")
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".git", ".ab", ".peers", ".whl", "exp", "docs", "notebooks"))
plan = dst / "ropekit/fused/plan.py"
text = plan.read_text()
old = "        relaunch = self.calls.get(at)\n"
assert old in text
plan.write_text(text.replace(old, "        relaunch = next(iter(self.calls.values()), None)\n"))
r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "tests/test_relaunch.py"],
                   cwd=dst, env={**__import__("os").environ, "PYTHONPATH": f"{dst}:" + __import__("os").environ.get("PYTHONPATH", "")},
                   capture_output=True, text=True)
print(r.stdout[-1500:])
print("mutant:", "caught" if r.returncode else "NOT caught")
