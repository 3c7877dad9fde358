#!/usr/bin/python3
"""The project's commit-message form, as git's commit-msg hook (docs/TESTING.md, "Commit
messages"): a subject `area: what`, where area is a word or a path-ish token (`bench`,
`tools/pack.sh`, `host_allocator`; several joined by ", "), then a colon, a space and the
text, in at most 72 characters; then, when there is a body (the why, the figures), a blank
line before it. Git's own subjects (Merge, Revert, fixup!, squash!, amend!) pass.

    python3 tools/commit_msg_check.py MESSAGE_FILE     (what git passes the hook)
    python3 tools/commit_msg_check.py - < MESSAGE      (the message on stdin)
    ln -s ../../tools/commit_msg_check.py .git/hooks/commit-msg

Exits 0 when the message has the form, 1 naming each rule it breaks, 2 on bad usage.
"""
import re
import sys

MAX_SUBJECT = 72
AREA = r"[A-Za-z0-9_.*{}+/-]+"
SUBJECT = re.compile(r"^(%s)(, %s)*: \S" % (AREA, AREA))
GIT_SUBJECTS = ("Merge ", "Revert \"", "fixup! ", "squash! ", "amend! ")
SCISSORS = "# ------------------------ >8 ------------------------"


def message_lines(text):
    """The message as git keeps it with its default cleanup: comment lines and everything
    from the scissors line on (git commit -v) dropped, leading blank lines skipped."""
    lines = []
    for line in text.splitlines():
        if line.startswith(SCISSORS):
            break
        if line.startswith("#"):
            continue
        lines.append(line.rstrip("\n"))
    while lines and not lines[0].strip():
        lines.pop(0)
    return lines


def problems(text):
    """Each rule the message breaks, in words; empty when it has the form."""
    lines = message_lines(text)
    if not lines:
        return ["the message is empty"]
    subject = lines[0]
    found = []
    if not subject.startswith(GIT_SUBJECTS):
        if not SUBJECT.match(subject):
            found.append("the subject is not `area: what` (an area word or path, a colon, a space, the text): %r"
                         % subject)
        if len(subject) > MAX_SUBJECT:
            found.append("the subject has %d characters, more than %d: put the why and the figures in the body"
                         % (len(subject), MAX_SUBJECT))
        if subject != subject.rstrip():
            found.append("the subject ends in white space")
    if len(lines) > 1 and lines[1].strip():
        found.append("no blank line between the subject and the body")
    return found


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    if argv[1] == "-":
        text = sys.stdin.read()
    else:
        with open(argv[1], encoding="utf-8", errors="replace") as f:
            text = f.read()
    found = problems(text)
    for p in found:
        sys.stderr.write("commit-msg: %s\n" % p)
    if found:
        sys.stderr.write("commit-msg: the form is `area: what` in at most %d characters, a blank line, then the body "
                         "(tools/commit_msg_check.py)\n" % MAX_SUBJECT)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
