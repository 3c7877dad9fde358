#!/usr/bin/python3
"""tools/commit_msg_check.py on good and bad messages: by its function, as a command on a
message file and on stdin, and as the commit-msg hook of a git checkout made in a temporary
folder (a bad message refused, a good one committed). Run by Bazel (//tests/style) or alone:
python3 tests/style/commit_msg_check_test.py."""
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest


def checker_path():
    runfiles = os.environ.get("TEST_SRCDIR")
    if runfiles:
        return os.path.join(runfiles, os.environ.get("TEST_WORKSPACE", "qlink"), "tools", "commit_msg_check.py")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "commit_msg_check.py")


CHECKER = os.path.realpath(checker_path())
spec = importlib.util.spec_from_file_location("commit_msg_check", CHECKER)
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)

GOOD = [
    "bench: each run's raw outputs as one .tar.xz archive\n",
    "tools/pack.sh: one packer for the GPU machine\n\nWhy: dist.sh and prepare.sh built twice.\n",
    "host_allocator: a loop's start reads the snapshot once\n\nFigures: 12.1 s -> 11.8 s.\n",
    "docs, tools: the commit-msg hook\n",
    "core/copy_plan.cc: " + "x" * (72 - len("core/copy_plan.cc: ")) + "\n",  # exactly 72
    "\n\nbench: leading blank lines are dropped as git drops them\n",
    "tests: comments are not the message\n# Please enter the commit message\n#\n",
    "RESULTS: the body may follow the scissors\n\nbody\n"
    "# ------------------------ >8 ------------------------\nnot: part of it, however long " + "y" * 80 + "\n",
    "Merge branch 'bench-results-archive'\n",
    "Revert \"bench: each run's raw outputs as one .tar.xz archive\"\n\nThis reverts commit 396e10b.\n",
    "fixup! bench: each run's raw outputs as one .tar.xz archive\n",
    "python: Unicode counts as characters, not bytes: " + "é" * 23 + "\n",  # 72 characters, more bytes
]

BAD = {
    "no area": ("make the packer one script\n", "not `area: what`"),
    "no space after the colon": ("tools:one packer\n", "not `area: what`"),
    "space before the colon": ("tools : one packer\n", "not `area: what`"),
    "nothing after the colon": ("tools: \n", "not `area: what`"),
    "73 characters": ("core: " + "x" * 67 + "\n", "73 characters, more than 72"),
    "the old long subjects": ("host_allocator: a loop's start reads the allocator's snapshot once (it walks every "
                              "segment), whether it makes expandable segments\n", "more than 72"),
    "body glued to the subject": ("tools: one packer\nbecause two scripts built twice\n", "no blank line"),
    "trailing white space": ("tools: one packer \n", "ends in white space"),
    "empty": ("\n\n# only a comment\n", "empty"),
}


class Problems(unittest.TestCase):
    def test_good(self):
        for message in GOOD:
            with self.subTest(message=message):
                self.assertEqual(check.problems(message), [])

    def test_bad(self):
        for name, (message, words) in BAD.items():
            with self.subTest(name=name):
                found = check.problems(message)
                self.assertTrue(found, "%s passed" % name)
                self.assertIn(words, " ".join(found))


class Command(unittest.TestCase):
    def run_checker(self, *args, stdin=None):
        return subprocess.run([sys.executable, CHECKER] + list(args), input=stdin, capture_output=True, text=True)

    def test_file_and_stdin(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "COMMIT_EDITMSG")
            for message, rc in ((GOOD[1], 0), (BAD["no area"][0], 1)):
                with open(path, "w") as f:
                    f.write(message)
                self.assertEqual(self.run_checker(path).returncode, rc, message)
                self.assertEqual(self.run_checker("-", stdin=message).returncode, rc, message)
        bad = self.run_checker("-", stdin=BAD["73 characters"][0])
        self.assertIn("commit-msg: the subject has 73 characters", bad.stderr)

    def test_usage(self):
        self.assertEqual(self.run_checker().returncode, 2)


class Hook(unittest.TestCase):
    def test_as_commit_msg_hook(self):
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
                       GIT_COMMITTER_EMAIL="t@example.com", HOME=tmp, GIT_CONFIG_NOSYSTEM="1")

            def git(*args):
                return subprocess.run(["git", "-C", tmp] + list(args), env=env, capture_output=True, text=True)

            self.assertEqual(git("init", "-q").returncode, 0)
            hook = os.path.join(tmp, ".git", "hooks", "commit-msg")
            os.makedirs(os.path.dirname(hook), exist_ok=True)
            with open(hook, "w") as f:  # what the symlink does, with this interpreter
                f.write("#!/bin/sh\nexec '%s' '%s' \"$1\"\n" % (sys.executable, CHECKER))
            os.chmod(hook, 0o755)
            refused = git("commit", "-q", "--allow-empty", "-m", "a subject with no area")
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn("not `area: what`", refused.stderr)
            taken = git("commit", "-q", "--allow-empty", "-m", "tests: a subject with its area", "-m", "The why.")
            self.assertEqual(taken.returncode, 0, taken.stderr)
            self.assertEqual(git("log", "--format=%s").stdout, "tests: a subject with its area\n")


if __name__ == "__main__":
    unittest.main()
