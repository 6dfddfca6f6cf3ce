"""Writes dormant/models/vocabulary.txt: English words by rank, for SimulatedModel.

    python bench/make_vocabulary.py [--words 4000]

Counted over the licence texts and package documentation of a Debian machine
(/usr/share/common-licenses, /usr/share/doc): plain technical English, the register of an
agent's replies. Words are ranked by how many documents use them (so one huge manual
cannot skew the list); SimulatedModel draws them with Zipf weights by rank. Run once: the
package ships the result and never reads these files.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "dormant" / "models" / "vocabulary.txt"
SOURCES = [Path("/usr/share/common-licenses"), Path("/usr/share/doc")]
WORD = re.compile(r"\b[A-Za-z][a-z]{0,15}\b")
NAMES = re.compile(r"(readme|\.md|\.txt|\.rst|copyright)", re.IGNORECASE)


def _texts() -> list[str]:
    texts = []
    for source in SOURCES:
        for path in sorted(source.rglob("*")):
            licence = source.name == "common-licenses"
            if not path.is_file() or path.is_symlink():
                continue
            if not (licence or NAMES.search(path.name)):
                continue
            try:
                raw = path.read_bytes()
                raw = gzip.decompress(raw) if path.suffix == ".gz" else raw
            except (OSError, gzip.BadGzipFile):
                continue
            texts.append(raw.decode("utf-8", errors="ignore"))
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=4000)
    args = parser.parse_args()
    counts: collections.Counter[str] = collections.Counter()
    for text in _texts():
        counts.update({w.lower() for w in WORD.findall(text)})
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    common = [w for w in ranked if len(w) > 1 or w in ("a", "i")]
    lines = common[: args.words]
    header = "# by rank: the words found in most of Debian's licence texts and package docs\n"
    OUT.write_text(header + "\n".join(lines) + "\n")
    print(f"{len(lines)} words from {len(counts):,} distinct words -> {OUT}")


if __name__ == "__main__":
    main()
