"""Real English text for the trained model of issue 40: the plain-text sources of Debian's
python3.11-doc (the reStructuredText of Python's documentation, about 11 MB in 497 files),
split by file into a training text and a held-out one. A file is held out when the first
byte of the sha1 of its path under the root is below --heldout-share of 256, so the split
is the same on every machine and no held-out line is ever trained on.

    python3 bench/hosts/corpus.py OUT_DIR [--root /usr/share/doc/python3.11/html/_sources]
        [--heldout-share 0.1]

writes OUT_DIR/train.txt, OUT_DIR/heldout.txt and OUT_DIR/files.json (which file went where)."""
import argparse
import hashlib
import json
import os

ROOT = "/usr/share/doc/python3.11/html/_sources"


def sources(root):
    """Every .rst.txt under root, as paths relative to it, sorted."""
    out = []
    for folder, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(folder, n), root) for n in names if n.endswith(".rst.txt")]
    return sorted(out)


def held_out(path, share):
    return hashlib.sha1(path.encode()).digest()[0] < round(share * 256)


def split(root, share):
    """{"train": [paths], "heldout": [paths]}."""
    files = sources(root)
    if not files:
        raise FileNotFoundError("no .rst.txt under %s (apt-get install python3.11-doc)" % root)
    heldout = [f for f in files if held_out(f, share)]
    return {"train": [f for f in files if not held_out(f, share)], "heldout": heldout}


def text(root, paths):
    """The files' text, each ending in one newline, blank-line runs kept as they are."""
    parts = []
    for path in paths:
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            parts.append(f.read().rstrip("\n") + "\n")
    return "".join(parts)


def main():
    a = argparse.ArgumentParser()
    a.add_argument("out")
    a.add_argument("--root", default=ROOT)
    a.add_argument("--heldout-share", type=float, default=0.1)
    args = a.parse_args()
    if not 0 < args.heldout_share < 1:
        a.error("--heldout-share must be in (0, 1), got %r" % args.heldout_share)
    parts = split(args.root, args.heldout_share)
    os.makedirs(args.out, exist_ok=True)
    for name, paths in parts.items():
        with open(os.path.join(args.out, name + ".txt"), "w", encoding="utf-8") as f:
            f.write(text(args.root, paths))
    with open(os.path.join(args.out, "files.json"), "w") as f:
        json.dump(parts, f, indent=1)
    print("corpus: %d training files, %d held out, in %s" % (len(parts["train"]), len(parts["heldout"]), args.out))


if __name__ == "__main__":
    main()
