"""A small reader for R's XDR serialisation, enough for data packages.

Reads what `save()` (RDX2/RDX3 .rda files), `saveRDS()` (.rds files) and
lazy-load databases (.rdx index + .rdb blobs, as in an installed package's
data/ folder) contain when they hold plain data: vectors, lists, data.frames,
factors, pairlists, symbols and attributes. Closures and environments are read
structurally but not interpreted; byte code is refused.

Reference: src/main/serialize.c (ReadItem, InFormat) and
src/main/lazyload / R_decompress{1,2,3} in the R sources.

Python standard library only.
"""

import bz2
import gzip
import lzma
import struct
import zlib

# SEXP types (Rinternals.h).
NILSXP, SYMSXP, LISTSXP, CLOSXP, ENVSXP, PROMSXP, LANGSXP = 0, 1, 2, 3, 4, 5, 6
SPECIALSXP, BUILTINSXP, CHARSXP, LGLSXP = 7, 8, 9, 10
INTSXP, REALSXP, CPLXSXP, STRSXP, DOTSXP = 13, 14, 15, 16, 17
VECSXP, EXPRSXP, BCODESXP, EXTPTRSXP, WEAKREFSXP, RAWSXP, S4SXP = 19, 20, 21, 22, 23, 24, 25

# Pseudo-types used only in the stream (serialize.c).
REFSXP, NILVALUE_SXP, GLOBALENV_SXP, UNBOUNDVALUE_SXP = 255, 254, 253, 252
MISSINGARG_SXP, BASENAMESPACE_SXP, NAMESPACESXP, PACKAGESXP = 251, 250, 249, 248
PERSISTSXP, EMPTYENV_SXP, BASEENV_SXP = 247, 242, 241
ATTRLANGSXP, ATTRLISTSXP, ALTREP_SXP = 240, 239, 238

# CHARSXP encoding bits in the `levels` field.
_LATIN1_MASK, _BYTES_MASK, _UTF8_MASK, _ASCII_MASK = 1 << 2, 1 << 1, 1 << 3, 1 << 6

NA_INTEGER = -(2 ** 31)


class RError(ValueError):
    pass


class RObject:
    """Any value that is not a plain vector: its type, payload and attributes."""

    def __init__(self, sexptype, value=None, attributes=None):
        self.sexptype = sexptype
        self.value = value
        self.attributes = attributes or {}

    def __repr__(self):
        return f"RObject(type={self.sexptype}, attrs={sorted(self.attributes)})"


class RVector(list):
    """An atomic vector or list; `.attributes` holds names, class, dim, ..."""

    def __init__(self, sexptype, items, attributes=None):
        super().__init__(items)
        self.sexptype = sexptype
        self.attributes = attributes or {}


class RSymbol(str):
    pass


class _Sentinel:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


GLOBALENV = _Sentinel("R_GlobalEnv")
EMPTYENV = _Sentinel("R_EmptyEnv")
BASEENV = _Sentinel("R_BaseEnv")
BASENAMESPACE = _Sentinel("R_BaseNamespace")
UNBOUNDVALUE = _Sentinel("R_UnboundValue")
MISSINGARG = _Sentinel("R_MissingArg")


def decompress_file(raw):
    """Undo the whole-file compression that save()/saveRDS() may apply."""
    if raw[:2] == b"\x1f\x8b":
        return gzip.decompress(raw)
    if raw[:3] == b"BZh":
        return bz2.decompress(raw)
    if raw[:6] == b"\xfd7zXZ\x00":
        return lzma.decompress(raw)
    return raw


class _Reader:
    def __init__(self, data, where):
        self.data = data
        self.pos = 0
        self.where = where
        self.refs = []
        self.native_encoding = "utf-8"

    def fail(self, msg):
        raise RError(f"[rdata] {self.where}: {msg} at byte {self.pos}")

    def take(self, n):
        if self.pos + n > len(self.data):
            self.fail(f"truncated stream (wanted {n} bytes)")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def int(self):
        return struct.unpack(">i", self.take(4))[0]

    def length(self):
        n = self.int()
        if n == -1:  # long vector: two 32-bit halves
            hi, lo = self.int(), self.int()
            n = (hi << 32) + lo
        if n < 0:
            self.fail(f"negative length {n}")
        return n

    def header(self):
        if self.take(2) != b"X\n":
            self.fail("not an XDR serialisation (only format 'X' is supported)")
        version = self.int()
        self.int()  # writer R version
        self.int()  # minimal reader R version
        if version == 3:
            name = self.take(self.int()).decode("ascii").lower()
            self.native_encoding = {"latin1": "latin-1", "iso-8859-1": "latin-1"}.get(name, "utf-8")
        elif version != 2:
            self.fail(f"unsupported serialisation version {version}")

    def string_vec(self):
        if self.int() != 0:
            self.fail("bad string vector header")
        return [self.item() for _ in range(self.length())]

    def attributes(self, flags):
        if not flags & (1 << 9):
            return {}
        return _pairlist_to_dict(self.item())

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        levels = flags >> 12
        has_attr = bool(flags & (1 << 9))
        has_tag = bool(flags & (1 << 10))

        if t == NILVALUE_SXP:
            return None
        if t == GLOBALENV_SXP:
            return GLOBALENV
        if t == EMPTYENV_SXP:
            return EMPTYENV
        if t == BASEENV_SXP:
            return BASEENV
        if t == BASENAMESPACE_SXP:
            return BASENAMESPACE
        if t == UNBOUNDVALUE_SXP:
            return UNBOUNDVALUE
        if t == MISSINGARG_SXP:
            return MISSINGARG
        if t == REFSXP:
            index = flags >> 8
            if index == 0:
                index = self.int()
            if not 1 <= index <= len(self.refs):
                self.fail(f"reference {index} out of range")
            return self.refs[index - 1]
        if t == PERSISTSXP:
            obj = RObject(PERSISTSXP, self.string_vec())
            self.refs.append(obj)
            return obj
        if t == SYMSXP:
            sym = RSymbol(self.item() or "")
            self.refs.append(sym)
            return sym
        if t in (PACKAGESXP, NAMESPACESXP):
            obj = RObject(t, self.string_vec())
            self.refs.append(obj)
            return obj
        if t == ENVSXP:
            env = RObject(ENVSXP)
            self.refs.append(env)
            self.int()  # locked
            enclos, frame, hashtab, attrib = self.item(), self.item(), self.item(), self.item()
            env.value = {"enclos": enclos, "frame": frame, "hashtab": hashtab}
            env.attributes = _pairlist_to_dict(attrib)
            return env
        if t in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP, ATTRLANGSXP, ATTRLISTSXP):
            return self.pairlist(t, flags)
        if t == EXTPTRSXP:
            obj = RObject(EXTPTRSXP)
            self.refs.append(obj)
            obj.value = (self.item(), self.item())
            obj.attributes = self.attributes(flags)
            return obj
        if t == WEAKREFSXP:
            obj = RObject(WEAKREFSXP)
            self.refs.append(obj)
            obj.attributes = self.attributes(flags)
            return obj
        if t in (SPECIALSXP, BUILTINSXP):
            n = self.int()
            return RObject(t, self.take(n).decode("ascii"))
        if t == CHARSXP:
            n = self.int()
            if n == -1:
                return None  # NA_character_
            raw = self.take(n)
            if levels & _LATIN1_MASK:
                return raw.decode("latin-1")
            if levels & _BYTES_MASK:
                return raw.decode("latin-1")
            if levels & (_UTF8_MASK | _ASCII_MASK):
                return raw.decode("utf-8")
            return raw.decode(self.native_encoding)
        if t in (LGLSXP, INTSXP):
            n = self.length()
            vals = list(struct.unpack(f">{n}i", self.take(4 * n)))
            vals = [None if v == NA_INTEGER else v for v in vals]
            if t == LGLSXP:
                vals = [None if v is None else bool(v) for v in vals]
            return RVector(t, vals, self.attributes(flags))
        if t == REALSXP:
            n = self.length()
            return RVector(t, struct.unpack(f">{n}d", self.take(8 * n)), self.attributes(flags))
        if t == CPLXSXP:
            n = self.length()
            d = struct.unpack(f">{2 * n}d", self.take(16 * n))
            return RVector(t, [complex(d[i], d[i + 1]) for i in range(0, 2 * n, 2)],
                           self.attributes(flags))
        if t in (STRSXP, VECSXP, EXPRSXP):
            n = self.length()
            return RVector(t, [self.item() for _ in range(n)], self.attributes(flags))
        if t == RAWSXP:
            n = self.length()
            return RVector(t, self.take(n), self.attributes(flags))
        if t == S4SXP:
            return RObject(S4SXP, None, self.attributes(flags))
        if t == ALTREP_SXP:
            info, state, attr = self.item(), self.item(), self.item()
            return _expand_altrep(self, info, state, _pairlist_to_dict(attr))
        if t == BCODESXP:
            self.fail("byte code is not supported")
        self.fail(f"unknown SEXP type {t}")

    def pairlist(self, t, flags):
        if t in (ATTRLISTSXP, ATTRLANGSXP):
            t = LISTSXP if t == ATTRLISTSXP else LANGSXP
            flags |= 1 << 9
        # Pairlists are written node by node: [attr] [tag] car, then the cdr
        # is the next item. Read the chain iteratively.
        cells = []
        while True:
            attr = self.item() if flags & (1 << 9) else None
            tag = self.item() if flags & (1 << 10) else None
            car = self.item()
            cells.append((tag, car, attr))
            nxt = self.int()
            nt = nxt & 0xFF
            if nt == t and t == LISTSXP:
                flags = nxt
                continue
            self.pos -= 4
            cdr = self.item()
            break
        if t == LISTSXP:
            obj = RObject(LISTSXP, cells)
        else:
            obj = RObject(t, (cells, cdr))
        if cells[0][2] is not None:
            obj.attributes = _pairlist_to_dict(cells[0][2])
        return obj


def _pairlist_to_dict(pl):
    if pl is None:
        return {}
    if not isinstance(pl, RObject) or pl.sexptype != LISTSXP:
        raise RError("[rdata] attributes are not a pairlist")
    return {str(tag): car for tag, car, _ in pl.value}


def _expand_altrep(reader, info, state, attributes):
    """Materialise the ALTREP classes that saved data commonly uses."""
    cls = info.value[0][1] if isinstance(info, RObject) and info.sexptype == LISTSXP else None
    cls = str(cls)
    if cls == "compact_intseq":
        n, start, step = (int(x) for x in state)
        return RVector(INTSXP, [start + i * step for i in range(n)], attributes)
    if cls == "compact_realseq":
        n, start, step = state
        return RVector(REALSXP, [start + i * step for i in range(int(n))], attributes)
    if cls.startswith("wrap_"):
        inner = state[0]
        inner.attributes = attributes or inner.attributes
        return inner
    if cls == "deferred_string":
        arg = state.value[0][1] if isinstance(state, RObject) else state
        return RVector(STRSXP, [None if v is None else _num_to_str(v) for v in arg], attributes)
    reader.fail(f"unsupported ALTREP class {cls!r}")


def _num_to_str(v):
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def read_rds(raw, where="<rds>"):
    """The object in a saveRDS() file (compressed or not)."""
    r = _Reader(decompress_file(raw), where)
    r.header()
    return r.item()


def read_rda(raw, where="<rda>"):
    """The named objects in a save() file, as a dict in file order."""
    data = decompress_file(raw)
    if data[:5] not in (b"RDX2\n", b"RDX3\n"):
        raise RError(f"[rdata] {where}: not an RDX2/RDX3 file (starts {data[:5]!r})")
    r = _Reader(data[5:], where)
    r.header()
    return _pairlist_to_dict(r.item())


def _decompress_blob(blob, compressed, where):
    """One value's bytes from a lazy-load .rdb (R_decompress1/2/3)."""
    if compressed in (0, False):
        return blob
    (outlen,) = struct.unpack(">I", blob[:4])
    body = blob[4:]
    if compressed in (1, True):
        out = zlib.decompress(body)
    else:
        kind, body = body[:1], body[1:]
        if kind == b"0":
            out = body
        elif kind == b"Z":
            out = zlib.decompress(body)
        elif kind == b"2":
            out = bz2.decompress(body)
        elif kind == b"X":
            try:
                out = lzma.decompress(body, format=lzma.FORMAT_XZ)
            except lzma.LZMAError:
                out = lzma.decompress(body, format=lzma.FORMAT_RAW,
                                      filters=[{"id": lzma.FILTER_LZMA2}])
        else:
            raise RError(f"[rdata] {where}: unknown blob compression {kind!r}")
    if len(out) != outlen:
        raise RError(f"[rdata] {where}: blob inflated to {len(out)} bytes, header says {outlen}")
    return out


def read_lazyload_db(rdx_bytes, rdb_bytes, where="<rdb>"):
    """The named objects of a lazy-load database (.rdx index + .rdb blobs)."""
    index = read_rds(rdx_bytes, where + ".rdx")
    fields = dict(zip(index.attributes["names"], index))
    compressed = fields.get("compressed", [True])[0]
    variables = fields["variables"]
    out = {}
    for name, (offset, length) in zip(variables.attributes["names"], variables):
        blob = rdb_bytes[int(offset):int(offset) + int(length)]
        r = _Reader(_decompress_blob(blob, compressed, f"{where}:{name}"), f"{where}:{name}")
        r.header()
        out[name] = r.item()
    return out


def as_data_frame(obj):
    """A data.frame as {column name: list of values}; factors become strings."""
    if not isinstance(obj, RVector) or obj.sexptype != VECSXP:
        raise RError("[rdata] not a list, so not a data.frame")
    cols = {}
    for name, col in zip(obj.attributes.get("names", []), obj):
        levels = col.attributes.get("levels") if isinstance(col, RVector) else None
        if levels is not None:
            col = [None if v is None else levels[v - 1] for v in col]
        cols[name] = list(col)
    return cols
