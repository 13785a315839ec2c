"""Training text from Debian packages (no network).

- King James Bible (1611, public domain): package `bible-kjv-text` holds it compressed in /usr/lib/bible.data; the
  `bible` program from package `bible-kjv` decompresses it (`bible -f gen1:1-rev22:21`: one verse per line,
  prefixed with its reference, e.g. "Ge1:1 In the beginning ...").
- Tang and Song poems from package `fortunes-zh` (/usr/share/games/fortunes/{tang300,song100}): classical poems
  (7th-13th century) in the Debian package's GPL-3.0+ compilation. The modern `chinese` fortune file is not used.

A document is a KJV chapter (verses joined by newlines) or one poem. Chat documents (ChatML) are derived from a
deterministic subset of verses and poems so that the model learns the chat format and to stop with <|im_end|>.
"""

import os
import random
import re
import shutil
import subprocess

FORTUNE_DIRS = ["/usr/share/games/fortunes", "/usr/share/fortunes"]
POEM_FILES = ["tang300", "song100"]
VERSE_LINE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def load_kjv_chapters():
    """Returns a list of (reference like 'Ge1', [verse texts])."""
    bible = shutil.which("bible")
    if bible is None:
        raise SystemExit("error: the `bible` program was not found; install it with `apt-get install bible-kjv` "
                         "(it pulls in bible-kjv-text, the KJV text)")
    out = subprocess.run([bible, "-f", "-m", "8000", "gen1:1-rev22:21"], check=True, capture_output=True,
                         cwd="/", text=True, encoding="utf-8").stdout
    chapters = []
    for line in out.splitlines():
        m = VERSE_LINE.match(line)
        if m is None:
            continue
        key = m.group(1) + m.group(2)
        if not chapters or chapters[-1][0] != key:
            chapters.append((key, []))
        chapters[-1][1].append(m.group(4).strip())
    if len(chapters) != 1189:
        raise SystemExit(f"error: expected 1189 KJV chapters from `bible`, got {len(chapters)}")
    return chapters


def load_poems():
    """Returns a list of poems, each 'title\\nauthor\\nbody' with ANSI colours and indentation removed."""
    poems = []
    for name in POEM_FILES:
        path = next((os.path.join(d, name) for d in FORTUNE_DIRS if os.path.exists(os.path.join(d, name))), None)
        if path is None:
            raise SystemExit(f"error: fortune file {name} not found; install it with `apt-get install fortunes-zh`")
        with open(path, encoding="utf-8") as f:
            text = ANSI_ESCAPE.sub("", f.read())
        for entry in text.split("\n%\n"):
            lines = [ln.strip() for ln in entry.strip("%\n").splitlines()]
            lines = [ln for ln in lines if ln]
            if len(lines) >= 3:
                poems.append("\n".join(lines))
    return poems


def chatml(user, assistant):
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant}<|im_end|>\n"


def build_documents(seed, chat_fraction=0.1):
    """Returns (train_docs, valid_docs, stats). Every 50th chapter / poem is held out for validation."""
    rng = random.Random(seed)
    chapters = load_kjv_chapters()
    poems = load_poems()
    train, valid = [], []
    for i, (_, verses) in enumerate(chapters):
        (valid if i % 50 == 25 else train).append("\n".join(verses) + "\n")
    for i, poem in enumerate(poems):
        (valid if i % 50 == 25 else train).append(poem + "\n")
    n_plain = len(train)
    # Chat documents: continue a verse from its first half / recite a poem from its title and author.
    for i, (_, verses) in enumerate(chapters):
        if i % 50 == 25:
            continue
        for verse in verses:
            if rng.random() >= chat_fraction:
                continue
            words = verse.split(" ")
            if len(words) < 6:
                continue
            cut = len(words) // 2
            train.append(chatml("Continue: " + " ".join(words[:cut]), " ".join(words[cut:])))
    for i, poem in enumerate(poems):
        if i % 50 == 25:
            continue
        title, author, body = poem.split("\n", 2)
        train.append(chatml(title + "\n" + author, body))
    stats = {"kjv_chapters": len(chapters), "poems": len(poems), "plain_train_docs": n_plain,
             "chat_train_docs": len(train) - n_plain, "valid_docs": len(valid),
             "kjv_chars": sum(len(v) + 1 for _, vs in chapters for v in vs),
             "poem_chars": sum(len(p) for p in poems)}
    return train, valid, stats
