"""Byte-level BPE tokenizer: training, encoding and the Hugging Face tokenizer.json writer.

The pre-tokenizer is the Qwen2 split regex. The EXACT standard string (QWEN2_PRETOKENIZE_REGEX) is what goes
into tokenizer.json, so any engine using PCRE2 / Oniguruma / the Rust regex crate splits text the same way.
Python's `re` has no \\p{L} / \\p{N}, so `python_pretokenize_regex()` expands them into explicit code-point classes
built from `unicodedata`; `check_tokenizer.mjs` verifies the resulting ids against an independent implementation.
"""

import collections
import heapq
import json
import re
import sys
import unicodedata

# The standard Qwen2 / Qwen3 pre-tokenizer pattern (tokenizer.json "Split" pre-tokenizer, behavior "Isolated").
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable-character map (the byte-level alphabet)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    byte_values = printable[:]
    code_points = printable[:]
    extra = 0
    for b in range(256):
        if b not in byte_values:
            byte_values.append(b)
            code_points.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(byte_values, code_points)}


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def _category_class(prefixes):
    """Regex character-class body (no brackets) matching every code point whose general category starts with
    one of `prefixes`, e.g. ("L",) for \\p{L}."""
    ranges = []
    start = None
    for cp in range(sys.maxunicode + 1):
        hit = unicodedata.category(chr(cp)).startswith(prefixes)
        if hit and start is None:
            start = cp
        elif not hit and start is not None:
            ranges.append((start, cp - 1))
            start = None
    if start is not None:
        ranges.append((start, sys.maxunicode))

    def esc(cp):
        return "\\U%08x" % cp

    return "".join(esc(a) if a == b else esc(a) + "-" + esc(b) for a, b in ranges)


def python_pretokenize_regex():
    """QWEN2_PRETOKENIZE_REGEX rewritten for Python's `re` (\\p{L}, \\p{N} expanded to explicit classes)."""
    letters = _category_class(("L",))
    numbers = _category_class(("N",))
    pattern = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
        + r"|[^\r\n" + letters + numbers + r"]?[" + letters + r"]+"
        + r"|[" + numbers + r"]"
        + r"| ?[^\s" + letters + numbers + r"]+[\r\n]*"
        + r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    return re.compile(pattern)


def to_byte_chars(text):
    return "".join(BYTE_TO_CHAR[b] for b in text.encode("utf-8"))


class ByteLevelBPE:
    """vocab: token string (byte-level alphabet) -> id; merges: list of (left, right) in rank order;
    special_tokens: list of (content, id, is_special)."""

    def __init__(self, vocab, merges, special_tokens):
        self.vocab = vocab
        self.merges = merges
        self.special_tokens = special_tokens
        self.merge_rank = {pair: rank for rank, pair in enumerate(merges)}
        self.id_to_token = {i: t for t, i in vocab.items()}
        for content, token_id, _ in special_tokens:
            self.id_to_token[token_id] = content
        self.special_to_id = {content: token_id for content, token_id, _ in special_tokens}
        self.splitter = python_pretokenize_regex()
        self.cache = {}
        # Longest first so that a special token that prefixes another one never wins wrongly.
        alternatives = sorted(self.special_to_id, key=len, reverse=True)
        self.special_regex = re.compile("(" + "|".join(re.escape(s) for s in alternatives) + ")")

    @property
    def size(self):
        return len(self.vocab) + len(self.special_tokens)

    def _bpe(self, word):
        """Apply merges to one pre-token (byte-level string) and return its ids."""
        cached = self.cache.get(word)
        if cached is not None:
            return cached
        symbols = list(word)
        while len(symbols) > 1:
            best_rank, best_index = None, -1
            for i in range(len(symbols) - 1):
                rank = self.merge_rank.get((symbols[i], symbols[i + 1]))
                if rank is not None and (best_rank is None or rank < best_rank):
                    best_rank, best_index = rank, i
            if best_rank is None:
                break
            left, right = self.merges[best_rank]
            merged, i = [], 0
            while i < len(symbols):
                if i < len(symbols) - 1 and symbols[i] == left and symbols[i + 1] == right:
                    merged.append(left + right)
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        ids = [self.vocab[s] for s in symbols]
        self.cache[word] = ids
        return ids

    def encode_ordinary(self, text):
        """Encode text that contains no special tokens."""
        ids = []
        for piece in self.splitter.findall(text):
            ids.extend(self._bpe(to_byte_chars(piece)))
        return ids

    def encode(self, text):
        """Encode text, turning the literal special-token strings into their ids (HF added-token behaviour)."""
        ids = []
        for i, part in enumerate(self.special_regex.split(text)):
            if i % 2 == 1:
                ids.append(self.special_to_id[part])
            elif part:
                ids.extend(self.encode_ordinary(part))
        return ids

    def decode(self, ids):
        out = bytearray()
        for token_id in ids:
            token = self.id_to_token[token_id]
            if token in self.special_to_id:
                out.extend(token.encode("utf-8"))
            else:
                out.extend(CHAR_TO_BYTE[c] for c in token)
        return out.decode("utf-8", errors="replace")

    def to_hf_json(self):
        added = [{"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": is_special}
                 for content, token_id, is_special in self.special_tokens]
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_PRETOKENIZE_REGEX}, "behavior": "Isolated",
                 "invert": False},
                byte_level,
            ]},
            "post_processor": dict(byte_level),
            "decoder": dict(byte_level),
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": self.vocab, "merges": [a + " " + b for a, b in self.merges]},
        }


def train_bpe(texts, vocab_size, special_tokens, log=print):
    """Train merges over `texts` until the vocabulary (256 bytes + merges + specials) reaches `vocab_size`.

    Ties between equally frequent pairs are broken by the smaller (left, right) string pair, so training is
    deterministic. special_tokens: list of (content, is_special); they get the last ids.
    """
    splitter = python_pretokenize_regex()
    word_counts = collections.Counter()
    for text in texts:
        for piece in splitter.findall(text):
            word_counts[to_byte_chars(piece)] += 1
    words = [list(w) for w in sorted(word_counts)]
    freqs = [word_counts[w] for w in sorted(word_counts)]
    log(f"bpe: {sum(freqs)} pre-tokens, {len(words)} distinct")

    pair_counts = collections.Counter()
    pair_words = collections.defaultdict(set)  # pair -> indices of words containing it
    for wi, symbols in enumerate(words):
        for pair in zip(symbols, symbols[1:]):
            pair_counts[pair] += freqs[wi]
            pair_words[pair].add(wi)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    n_merges = vocab_size - 256 - len(special_tokens)
    merges = []
    while len(merges) < n_merges and heap:
        neg_count, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -neg_count:
            continue  # stale heap entry; the current count was pushed separately
        if -neg_count < 2:
            break
        merges.append(pair)
        left, right = pair
        merged_symbol = left + right
        changed = collections.Counter()
        for wi in pair_words.pop(pair):
            symbols = words[wi]
            freq = freqs[wi]
            for p in zip(symbols, symbols[1:]):
                changed[p] -= freq
            new_symbols, i = [], 0
            while i < len(symbols):
                if i < len(symbols) - 1 and symbols[i] == left and symbols[i + 1] == right:
                    new_symbols.append(merged_symbol)
                    i += 2
                else:
                    new_symbols.append(symbols[i])
                    i += 1
            words[wi] = new_symbols
            for p in zip(new_symbols, new_symbols[1:]):
                changed[p] += freq
                pair_words[p].add(wi)
        for p, delta in changed.items():
            if delta == 0:
                continue
            pair_counts[p] += delta
            if pair_counts[p] <= 0:
                del pair_counts[p]
            else:
                heapq.heappush(heap, (-pair_counts[p], p))
        pair_counts.pop(pair, None)

    vocab = {BYTE_TO_CHAR[b]: b for b in range(256)}
    for left, right in merges:
        vocab[left + right] = len(vocab)
    specials = [(content, len(vocab) + i, is_special) for i, (content, is_special) in enumerate(special_tokens)]
    log(f"bpe: {len(merges)} merges, vocab {len(vocab) + len(specials)}")
    return ByteLevelBPE(vocab, merges, specials)


def load_hf_json(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    model = data["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    specials = [(t["content"], t["id"], t["special"]) for t in data["added_tokens"]]
    return ByteLevelBPE(model["vocab"], merges, specials)
