/* The reader's per-entry loop over ReadRange answers, compiled (docs/design.md, "Reading";
 * docs/operations.md, "The compiled walker").
 *
 * `walk_range` reads the serialized ReadRangeResponse a bookie sent and applies, entry by
 * entry, the rule of `stream.client.entry.verified_columns` (the Python definition, which
 * stays the reference; tests/unit/client/test_native_walk.py holds this file to it): ids
 * `first`, `first + 1`... each with the crc32c of its header and payload, counted up to the
 * first that is not; no-ops counted but left out. The accepted entries go into four
 * bytearrays laid out as Arrow lays out columns (ids and timestamps as native int64, payloads
 * as int32 offsets into one data blob), so no Python object is made per entry.
 *
 * It decides only what it can decide exactly as protobuf (upb) and the Python definition do.
 * Everything else is handed back: an entry with flag ATTRIBUTES, or with any field besides
 * the five plain ones, is returned as DEFER (the caller parses that one entry with protobuf,
 * applies the Python definition to it and resumes after it); an answer whose framing is
 * broken, or that carries something the walker does not check (the `message` string, group
 * fields, a known field with another wire type), is returned as FALLBACK (the caller parses
 * the whole answer with protobuf, which raises on a malformed one). It never reads outside
 * the answer: every length is checked against the bytes left before it is used. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_SSE42 1
#endif

enum { DONE = 0, DEFER = 1, FALLBACK = 2 };

/* EntryFlag (stream/protocol/codes.py): part of the wire format; exported, and a test checks
 * them against the Python values. */
#define FLAG_NOOP 1u
#define FLAG_ATTRIBUTES 4u

/* ------------------------------------------------------------------ crc32c (Castagnoli) */

static uint32_t crc_table[8][256];
static int use_hardware = 0;

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        }
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[t][i] = c;
        }
    }
}

/* Both variants continue a raw (not inverted) crc over `n` bytes at `p`. */
static uint32_t
crc_software(uint32_t crc, const uint8_t *p, size_t n)
{
#if PY_LITTLE_ENDIAN
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^
              crc_table[5][(w >> 16) & 0xff] ^ crc_table[4][(w >> 24) & 0xff] ^
              crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff] ^
              crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
#endif
    while (n--) {
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    }
    return crc;
}

#ifdef HAVE_SSE42
/* The crc instruction has a latency of three cycles and a throughput of one per cycle: three
 * independent crcs over three blocks run about three times as fast as one over the whole, and
 * are then combined by shifting the earlier ones over the later blocks' lengths (appending
 * zeros to a raw crc is linear: four table lookups per shift). Mark Adler's crc32c.c does the
 * same with the same block sizes. */
#define CRC_LONG 8192
#define CRC_SHORT 256
static uint32_t crc_long_shift[4][256];
static uint32_t crc_short_shift[4][256];

/* The operator (a 32x32 matrix over GF(2), one row per bit) times `vec`. */
static uint32_t
gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1) {
            sum ^= *mat;
        }
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void
gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++) {
        square[n] = gf2_times(mat, mat[n]);
    }
}

/* Fills `table` to append `len` zero bytes (a power of two) to a raw crc, a byte at a time. */
static void
crc_shift_table(uint32_t table[4][256], size_t len)
{
    uint32_t odd[32], even[32], *op = even;
    odd[0] = 0x82F63B78u; /* one zero bit */
    for (int n = 1; n < 32; n++) {
        odd[n] = 1u << (n - 1);
    }
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four */
    for (;;) {
        gf2_square(even, odd); /* a byte, then doubled as len halves */
        op = even;
        len >>= 1;
        if (len == 0) {
            break;
        }
        gf2_square(odd, even);
        op = odd;
        len >>= 1;
        if (len == 0) {
            break;
        }
    }
    for (uint32_t n = 0; n < 256; n++) {
        table[0][n] = gf2_times(op, n);
        table[1][n] = gf2_times(op, n << 8);
        table[2][n] = gf2_times(op, n << 16);
        table[3][n] = gf2_times(op, n << 24);
    }
}

static inline uint32_t
crc_shift(uint32_t table[4][256], uint32_t crc)
{
    return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^
           table[3][crc >> 24];
}

__attribute__((target("sse4.2"))) static inline uint64_t
crc_words(uint64_t c, const uint8_t *p, size_t words)
{
    while (words--) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
    }
    return c;
}

/* Three crcs at once over three blocks of `block` bytes each, combined; returns the crc after
 * the 3 * block bytes at `p`. */
__attribute__((target("sse4.2"))) static inline uint64_t
crc_three(uint64_t c0, const uint8_t *p, size_t block, uint32_t shift[4][256])
{
    uint64_t c1 = 0, c2 = 0;
    const uint8_t *end = p + block;
    while (p < end) {
        uint64_t w0, w1, w2;
        memcpy(&w0, p, 8);
        memcpy(&w1, p + block, 8);
        memcpy(&w2, p + 2 * block, 8);
        c0 = _mm_crc32_u64(c0, w0);
        c1 = _mm_crc32_u64(c1, w1);
        c2 = _mm_crc32_u64(c2, w2);
        p += 8;
    }
    c0 = crc_shift(shift, (uint32_t)c0) ^ (uint32_t)c1;
    return crc_shift(shift, (uint32_t)c0) ^ (uint32_t)c2;
}

__attribute__((target("sse4.2"))) static uint32_t
crc_hardware(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 3 * CRC_LONG) {
        c = crc_three(c, p, CRC_LONG, crc_long_shift);
        p += 3 * CRC_LONG;
        n -= 3 * CRC_LONG;
    }
    while (n >= 3 * CRC_SHORT) {
        c = crc_three(c, p, CRC_SHORT, crc_short_shift);
        p += 3 * CRC_SHORT;
        n -= 3 * CRC_SHORT;
    }
    c = crc_words(c, p, n / 8);
    p += n - n % 8;
    n %= 8;
    uint32_t c32 = (uint32_t)c;
    while (n--) {
        c32 = _mm_crc32_u8(c32, *p++);
    }
    return c32;
}
#endif

static inline uint32_t
crc_update(uint32_t crc, const uint8_t *p, size_t n)
{
#ifdef HAVE_SSE42
    if (use_hardware) {
        return crc_hardware(crc, p, n);
    }
#endif
    return crc_software(crc, p, n);
}

/* The entry checksum of stream/protocol/checksum.py without attributes: crc32c over the
 * big-endian header (stream id u64, entry id i64, flags u32, timestamp i64), then the
 * payload. */
static uint32_t
entry_checksum(uint64_t stream_id, int64_t entry_id, uint32_t flags, int64_t timestamp_ms,
               const uint8_t *payload, size_t payload_len)
{
    uint8_t header[28];
    uint64_t id = (uint64_t)entry_id, stamp = (uint64_t)timestamp_ms;
    for (int i = 0; i < 8; i++) {
        header[i] = (uint8_t)(stream_id >> (56 - 8 * i));
        header[8 + i] = (uint8_t)(id >> (56 - 8 * i));
        header[20 + i] = (uint8_t)(stamp >> (56 - 8 * i));
    }
    for (int i = 0; i < 4; i++) {
        header[16 + i] = (uint8_t)(flags >> (24 - 8 * i));
    }
    uint32_t crc = crc_update(0xFFFFFFFFu, header, sizeof header);
    return ~crc_update(crc, payload, payload_len);
}

/* ------------------------------------------------------------------ protobuf wire format */

/* Reads a varint as upb does: at most 10 bytes, bits past the 64th dropped. Returns 0 when
 * the bytes end first or the 10th byte still continues. */
static inline int
read_varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    const uint8_t *q = *p;
    uint64_t value = 0;
    for (int i = 0; i < 10; i++) {
        if (q >= end) {
            return 0;
        }
        uint8_t byte = *q++;
        value |= (uint64_t)(byte & 0x7f) << (7 * i);
        if (!(byte & 0x80)) {
            *p = q;
            *out = value;
            return 1;
        }
    }
    return 0;
}

/* Reads a field tag; returns 0 on anything protobuf might read otherwise (a tag past 32 bits,
 * field number 0): the caller hands such bytes to protobuf. */
static inline int
read_tag(const uint8_t **p, const uint8_t *end, uint32_t *field, uint32_t *wire_type)
{
    uint64_t tag;
    const uint8_t *start = *p;
    if (!read_varint(p, end, &tag) || *p - start > 5 || tag > 0xFFFFFFFFu || (tag >> 3) == 0) {
        return 0;
    }
    *field = (uint32_t)(tag >> 3);
    *wire_type = (uint32_t)(tag & 7);
    return 1;
}

/* Skips an unknown field's value of `wire_type`; returns 0 when it is not one the walker skips
 * (groups, invalid types) or runs past the end. */
static inline int
skip_value(const uint8_t **p, const uint8_t *end, uint32_t wire_type)
{
    uint64_t value;
    switch (wire_type) {
    case 0:
        return read_varint(p, end, &value);
    case 1:
        if (end - *p < 8) {
            return 0;
        }
        *p += 8;
        return 1;
    case 2:
        if (!read_varint(p, end, &value) || value > (uint64_t)(end - *p)) {
            return 0;
        }
        *p += value;
        return 1;
    case 5:
        if (end - *p < 4) {
            return 0;
        }
        *p += 4;
        return 1;
    default:
        return 0;
    }
}

typedef struct {
    int64_t entry_id;
    uint32_t flags;
    int64_t timestamp_ms;
    const uint8_t *payload;
    size_t payload_len;
    uint32_t crc32c;
} Entry;

/* Reads an `Entry` message of only the plain fields (entry_id 1, flags 2, timestamp_ms 3,
 * payload 4, crc32c 5, each with its own wire type; the last of a repeated one wins, as in
 * protobuf). Returns 0 for anything else, broken bytes included: protobuf decides those. */
static int
read_plain_entry(const uint8_t *p, const uint8_t *end, Entry *entry)
{
    static const uint8_t empty[1] = {0};
    entry->entry_id = 0;
    entry->flags = 0;
    entry->timestamp_ms = 0;
    entry->payload = empty;
    entry->payload_len = 0;
    entry->crc32c = 0;
    while (p < end) {
        uint32_t field, wire_type;
        uint64_t value;
        if (!read_tag(&p, end, &field, &wire_type)) {
            return 0;
        }
        if (field == 4 && wire_type == 2) {
            if (!read_varint(&p, end, &value) || value > (uint64_t)(end - p)) {
                return 0;
            }
            entry->payload = p;
            entry->payload_len = (size_t)value;
            p += value;
            continue;
        }
        if (wire_type != 0 || field > 5 || field == 4 || !read_varint(&p, end, &value)) {
            return 0;
        }
        switch (field) {
        case 1:
            entry->entry_id = (int64_t)value;
            break;
        case 2:
            entry->flags = (uint32_t)value;
            break;
        case 3:
            entry->timestamp_ms = (int64_t)value;
            break;
        default:
            entry->crc32c = (uint32_t)value;
            break;
        }
    }
    return 1;
}

/* ------------------------------------------------------------------ the output columns */

/* A bytearray written from `used`; its size is the capacity while the walk runs and is cut
 * back to `used` when it returns. */
typedef struct {
    PyObject *array;
    Py_ssize_t used;
} Column;

static int
column_reserve(Column *column, Py_ssize_t extra)
{
    Py_ssize_t size = PyByteArray_GET_SIZE(column->array);
    if (extra > PY_SSIZE_T_MAX - column->used) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t needed = column->used + extra;
    if (needed <= size) {
        return 0;
    }
    Py_ssize_t grown = size < PY_SSIZE_T_MAX / 2 ? size * 2 + 256 : PY_SSIZE_T_MAX;
    return PyByteArray_Resize(column->array, grown > needed ? grown : needed);
}

static inline void
column_put(Column *column, const void *bytes, size_t count)
{
    memcpy(PyByteArray_AS_STRING(column->array) + column->used, bytes, count);
    column->used += (Py_ssize_t)count;
}

static int
columns_trim(Column *columns, int count)
{
    int failed = 0;
    for (int i = 0; i < count; i++) {
        if (PyByteArray_GET_SIZE(columns[i].array) != columns[i].used &&
            PyByteArray_Resize(columns[i].array, columns[i].used) < 0) {
            failed = 1;
        }
    }
    return failed ? -1 : 0;
}

/* ------------------------------------------------------------------ walk_range */

PyDoc_STRVAR(walk_range_doc,
"walk_range(answer, stream_id, first, accepted, stopped, position, code, entries,\n"
"           ids, timestamps, offsets, data)\n"
"--\n\n"
"Walks a serialized ReadRangeResponse from byte `position` (stream_id: u64, first: the id\n"
"asked for, accepted: entries of the run accepted so far, stopped: whether the run ended,\n"
"code: the answer's code so far, entries: entries walked so far). Appends the accepted\n"
"entries that are not no-ops to the bytearrays `ids` and `timestamps` (native int64),\n"
"`offsets` (int32, one per entry after the first 0 already there) and `data`. Returns\n"
"(status, position, accepted, stopped, code, entries, body_start, body_end): status 0 DONE,\n"
"1 DEFER (the entry at answer[body_start:body_end] is left to the caller; resume at\n"
"`position`), 2 FALLBACK (parse the whole answer with protobuf instead).");

static PyObject *
walk_range(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "walk_range takes 12 arguments");
        return NULL;
    }
    unsigned long long stream_id = PyLong_AsUnsignedLongLong(args[1]);
    if (stream_id == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    long long first = PyLong_AsLongLong(args[2]);
    if (first == -1 && PyErr_Occurred()) {
        return NULL;
    }
    unsigned long long accepted = PyLong_AsUnsignedLongLong(args[3]);
    if (accepted == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    int stopped = PyObject_IsTrue(args[4]);
    if (stopped < 0) {
        return NULL;
    }
    Py_ssize_t position = PyLong_AsSsize_t(args[5]);
    if (position == -1 && PyErr_Occurred()) {
        return NULL;
    }
    long code = PyLong_AsLong(args[6]);
    if (code == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t entries = PyLong_AsSsize_t(args[7]);
    if (entries == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Column columns[4];
    for (int i = 0; i < 4; i++) {
        if (!PyByteArray_Check(args[8 + i])) {
            PyErr_SetString(PyExc_TypeError, "the columns must be bytearrays");
            return NULL;
        }
        columns[i].array = args[8 + i];
        columns[i].used = PyByteArray_GET_SIZE(args[8 + i]);
    }
    Column *ids = &columns[0], *stamps = &columns[1], *offsets = &columns[2], *data = &columns[3];
    if (ids->used % 8 || stamps->used != ids->used || offsets->used != ids->used / 2 + 4 ||
        data->used > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "the columns do not line up");
        return NULL;
    }

    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (position < 0 || position > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "position outside the answer");
        return NULL;
    }
    const uint8_t *base = (const uint8_t *)view.buf;
    const uint8_t *end = base + view.len;
    const uint8_t *p = base + position;
    int status = DONE;
    Py_ssize_t body_start = 0, body_end = 0;
    int failed = 0;
    /* Room up front, so the columns are not copied as they grow: the payloads take at most
     * the bytes left; for the entry columns, a guess (an entry of 256 bytes) that doubling
     * corrects. */
    Py_ssize_t left = view.len - position, guess = left / 256 + 16;
    if (column_reserve(data, left) < 0 || column_reserve(ids, 8 * guess) < 0 ||
        column_reserve(stamps, 8 * guess) < 0 || column_reserve(offsets, 4 * guess) < 0) {
        PyBuffer_Release(&view);
        columns_trim(columns, 4);
        return NULL;
    }

    while (p < end) {
        uint32_t field, wire_type;
        uint64_t value;
        if (!read_tag(&p, end, &field, &wire_type)) {
            status = FALLBACK;
            break;
        }
        if (field == 2 && wire_type == 2) {
            if (!read_varint(&p, end, &value) || value > (uint64_t)(end - p)) {
                status = FALLBACK;
                break;
            }
            const uint8_t *body = p;
            p += value;
            entries++;
            Entry entry;
            int plain = read_plain_entry(body, p, &entry);
            if (!plain || (!stopped && (entry.flags & FLAG_ATTRIBUTES))) {
                status = DEFER;
                body_start = body - base;
                body_end = p - base;
                break;
            }
            if (stopped) {
                continue; /* past the run: only counted (and its framing checked) */
            }
            if (entry.entry_id < first ||
                (uint64_t)entry.entry_id - (uint64_t)first != accepted ||
                entry_checksum(stream_id, entry.entry_id, entry.flags, entry.timestamp_ms,
                               entry.payload, entry.payload_len) != entry.crc32c) {
                stopped = 1;
                continue;
            }
            accepted++;
            if (entry.flags & FLAG_NOOP) {
                continue;
            }
            if (entry.payload_len > (size_t)(INT32_MAX - data->used)) {
                PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of payloads");
                failed = 1;
                break;
            }
            if (column_reserve(ids, 8) < 0 || column_reserve(stamps, 8) < 0 ||
                column_reserve(offsets, 4) < 0 ||
                column_reserve(data, (Py_ssize_t)entry.payload_len) < 0) {
                failed = 1;
                break;
            }
            column_put(ids, &entry.entry_id, 8);
            column_put(stamps, &entry.timestamp_ms, 8);
            column_put(data, entry.payload, entry.payload_len);
            int32_t offset = (int32_t)data->used;
            column_put(offsets, &offset, 4);
        }
        else if (field == 1 && wire_type == 0) {
            if (!read_varint(&p, end, &value)) {
                status = FALLBACK;
                break;
            }
            code = (long)(int32_t)(uint32_t)value; /* an open enum: int32, as protobuf keeps it */
        }
        else if ((field == 3 || field == 4) && wire_type == 0) {
            if (!read_varint(&p, end, &value)) {
                status = FALLBACK;
                break;
            }
        }
        else if (field <= 5 || !skip_value(&p, end, wire_type)) {
            /* The message string (protobuf checks its UTF-8), a known field with another wire
             * type, a group, broken bytes. */
            status = FALLBACK;
            break;
        }
    }
    Py_ssize_t resume = p - base;
    PyBuffer_Release(&view);
    if (columns_trim(columns, 4) < 0 || failed) {
        return NULL;
    }
    return Py_BuildValue("(inKOlnnn)", status, resume, accepted, stopped ? Py_True : Py_False,
                         code, entries, body_start, body_end);
}

/* ------------------------------------------------------------------ helpers */

PyDoc_STRVAR(split_payloads_doc,
"split_payloads(offsets, data)\n"
"--\n\n"
"Returns the payloads of packed columns as a list of bytes: data[offsets[i]:offsets[i+1]]\n"
"for each entry (offsets: int32, native order, starting at 0).");

static PyObject *
split_payloads(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "split_payloads takes 2 arguments");
        return NULL;
    }
    Py_buffer offsets, data;
    if (PyObject_GetBuffer(args[0], &offsets, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &data, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&offsets);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t count = offsets.len / 4 - 1;
    if (offsets.len % 4 || count < 0) {
        PyErr_SetString(PyExc_ValueError, "offsets must hold int32s, the first 0");
        goto done;
    }
    const char *at = (const char *)offsets.buf;
    int32_t previous;
    memcpy(&previous, at, 4);
    if (previous != 0) {
        PyErr_SetString(PyExc_ValueError, "offsets must start at 0");
        goto done;
    }
    result = PyList_New(count);
    if (result == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t next;
        memcpy(&next, at + 4 * (i + 1), 4);
        if (next < previous || next > data.len) {
            Py_CLEAR(result);
            PyErr_SetString(PyExc_ValueError, "offsets out of order or past the data");
            goto done;
        }
        PyObject *payload =
            PyBytes_FromStringAndSize((const char *)data.buf + previous, next - previous);
        if (payload == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, payload);
        previous = next;
    }
done:
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&data);
    return result;
}

PyDoc_STRVAR(crc32c_doc,
"crc32c(data, value=0)\n"
"--\n\n"
"Returns the crc32c of `data` continued from `value` (a previous result), as the crc32c\n"
"package's function does.");

static PyObject *
crc32c(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32c takes 1 or 2 arguments");
        return NULL;
    }
    unsigned long value = 0;
    if (nargs == 2) {
        value = PyLong_AsUnsignedLong(args[1]);
        if (value == (unsigned long)-1 && PyErr_Occurred()) {
            return NULL;
        }
        if (value > 0xFFFFFFFFul) {
            PyErr_SetString(PyExc_OverflowError, "value must fit in 32 bits");
            return NULL;
        }
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    uint32_t crc = ~crc_update(~(uint32_t)value, (const uint8_t *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(set_hardware_crc_doc,
"set_hardware_crc(on)\n"
"--\n\n"
"Uses the processor's crc32c instruction (when it has one) or the table; returns whether\n"
"the instruction is now used. For tests, which check both ways.");

static PyObject *
set_hardware_crc(PyObject *module, PyObject *on)
{
    (void)module;
    int wanted = PyObject_IsTrue(on);
    if (wanted < 0) {
        return NULL;
    }
#ifdef HAVE_SSE42
    use_hardware = wanted && __builtin_cpu_supports("sse4.2");
#else
    (void)wanted;
    use_hardware = 0;
#endif
    return PyBool_FromLong(use_hardware);
}

/* ------------------------------------------------------------------ scan_add */

/* The bookie's Add path (stream/bookie/storage/scanned.py; the Python definition it is held
 * to is protobuf's parse, `_scan_entries` and `Entry.SerializeToString`:
 * tests/unit/bookie/test_native_scan_add.py). It vouches only for an AddRequest in the form
 * protobuf writes (each field once, in field-number order, minimal varints, entries last),
 * where it can give each entry's bytes as `Entry.SerializeToString` of the parsed entry gives
 * them, so that the bookie stores them as they came; with one allowance: a field holding its
 * default value (0, an empty payload), which writers that frame entries by hand write
 * (stream/framing/prepare.py: entry 0, a no-op's empty payload), is left out of the entry's
 * bytes, as protobuf leaves it out. Anything else (an entry's headers, whose names protobuf
 * checks as UTF-8, included) is left to protobuf: the caller parses the request as before. */

#define FLAG_TRUNCATE 2u

/* Reads a varint in its minimal form (at most 10 bytes, no trailing zero group, a 10th byte
 * of 1: what protobuf writes for any 64-bit value); returns 0 for anything else. */
static inline int
read_minimal_varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    const uint8_t *q = *p;
    uint64_t value = 0;
    for (int i = 0; i < 10; i++) {
        if (q >= end) {
            return 0;
        }
        uint8_t byte = *q++;
        value |= (uint64_t)(byte & 0x7f) << (7 * i);
        if (!(byte & 0x80)) {
            if ((i > 0 && byte == 0) || (i == 9 && byte != 1)) {
                return 0;
            }
            *p = q;
            *out = value;
            return 1;
        }
    }
    return 0;
}

/* The fields of an entry that protobuf writes: at most one each of 1-6 and 8. */
typedef struct {
    const uint8_t *start[7];
    size_t length[7];
    int count;
    int dropped; /* a default-valued field was left out */
} Kept;

/* Reads one `Entry` in protobuf's form (fields 1-6 and 8; headers, field 7, are not vouched
 * for), noting in `kept` the fields protobuf would write. Returns 0 when it is not in that
 * form. */
static int
read_canonical_entry(const uint8_t *p, const uint8_t *end, Entry *entry, Kept *kept)
{
    static const uint8_t empty[1] = {0};
    entry->entry_id = 0;
    entry->flags = 0;
    entry->timestamp_ms = 0;
    entry->payload = empty;
    entry->payload_len = 0;
    entry->crc32c = 0;
    kept->count = 0;
    kept->dropped = 0;
    uint32_t last = 0;
    while (p < end) {
        const uint8_t *start = p;
        uint8_t tag = *p++;
        uint32_t field = tag >> 3, wire_type = tag & 7;
        uint64_t value;
        if (tag & 0x80 || field <= last) {
            return 0;
        }
        last = field;
        if (field == 4 || field == 6) {
            if (wire_type != 2 || !read_minimal_varint(&p, end, &value) ||
                value > (uint64_t)(end - p)) {
                return 0;
            }
            if (field == 4) {
                entry->payload = p;
                entry->payload_len = (size_t)value;
            }
            p += value;
        }
        else {
            if (wire_type != 0 || field > 8 || field == 7 || !read_minimal_varint(&p, end, &value)) {
                return 0;
            }
            switch (field) {
            case 1:
                entry->entry_id = (int64_t)value;
                break;
            case 2:
                if (value > 0xFFFFFFFFu) {
                    return 0;
                }
                entry->flags = (uint32_t)value;
                break;
            case 3:
                entry->timestamp_ms = (int64_t)value;
                break;
            case 5:
                if (value > 0xFFFFFFFFu) {
                    return 0;
                }
                entry->crc32c = (uint32_t)value;
                break;
            default: /* 8, the sequence: only under flag ATTRIBUTES, which the caller looks at */
                break;
            }
        }
        /* An empty key is written (it has presence); any other default value is not. */
        if (value == 0 && field != 6) {
            kept->dropped = 1;
            continue;
        }
        kept->start[kept->count] = start;
        kept->length[kept->count] = (size_t)(p - start);
        kept->count++;
    }
    return 1;
}

/* Returns the entry's bytes as protobuf writes them: `body` itself, or its kept fields. */
static PyObject *
entry_bytes(const uint8_t *body, size_t length, const Kept *kept)
{
    if (!kept->dropped) {
        return PyBytes_FromStringAndSize((const char *)body, (Py_ssize_t)length);
    }
    size_t total = 0;
    for (int i = 0; i < kept->count; i++) {
        total += kept->length[i];
    }
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (bytes == NULL) {
        return NULL;
    }
    char *out = PyBytes_AS_STRING(bytes);
    for (int i = 0; i < kept->count; i++) {
        memcpy(out, kept->start[i], kept->length[i]);
        out += kept->length[i];
    }
    return bytes;
}

PyDoc_STRVAR(scan_add_doc,
"scan_add(request, max_entry_bytes)\n"
"--\n\n"
"Scans a serialized AddRequest in the form protobuf writes (default values may be written\n"
"out). Returns None when it is in any other form (or broken), else (stream_id, term, lac,\n"
"lafr, recovery, request_id, ids, payload_bytes, special, entries): `ids` the entry ids,\n"
"`payload_bytes` their payloads' total size, `special` the positions of the entries that are\n"
"oversized, have a negative id, flag TRUNCATE or ATTRIBUTES or a bad checksum, `entries`\n"
"each entry's bytes as protobuf serializes the parsed entry.");

static PyObject *
scan_add(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "scan_add takes 2 arguments");
        return NULL;
    }
    long long max_entry_bytes = PyLong_AsLongLong(args[1]);
    if (max_entry_bytes == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const uint8_t *p = (const uint8_t *)view.buf;
    const uint8_t *end = p + view.len;
    uint64_t header[7] = {0}; /* by field number: stream_id 1 ... request_id 6 */
    uint32_t last = 0;
    unsigned long long payload_bytes = 0;
    int canonical = 1;
    PyObject *result = NULL;
    PyObject *ids = PyList_New(0), *special = PyList_New(0), *datas = PyList_New(0);
    if (ids == NULL || special == NULL || datas == NULL) {
        goto done;
    }
    while (p < end) {
        uint8_t tag = *p++;
        uint32_t field = tag >> 3, wire_type = tag & 7;
        uint64_t value;
        /* Entries (7) last, possibly many; the header fields once each, in order. */
        if (tag & 0x80 || field == 0 || field > 7 || (field < 7 && field <= last) ||
            wire_type != (field == 7 ? 2u : 0u) || !read_minimal_varint(&p, end, &value)) {
            canonical = 0;
            break;
        }
        last = field;
        if (field < 7) {
            if (field == 5 && value > 1) {
                canonical = 0; /* a bool not written as protobuf writes it */
                break;
            }
            header[field] = value;
            continue;
        }
        Entry entry;
        Kept kept;
        if (value > (uint64_t)(end - p) || !read_canonical_entry(p, p + value, &entry, &kept)) {
            canonical = 0;
            break;
        }
        const uint8_t *body = p;
        p += value;
        Py_ssize_t position = PyList_GET_SIZE(ids);
        PyObject *id = PyLong_FromLongLong(entry.entry_id);
        if (id == NULL) {
            goto done;
        }
        int appended = PyList_Append(ids, id);
        Py_DECREF(id);
        if (appended < 0) {
            goto done;
        }
        PyObject *data = entry_bytes(body, (size_t)value, &kept);
        if (data == NULL) {
            goto done;
        }
        appended = PyList_Append(datas, data);
        Py_DECREF(data);
        if (appended < 0) {
            goto done;
        }
        payload_bytes += entry.payload_len;
        /* `or` in this order, as the Python definition: the checksum of an entry with flag
         * ATTRIBUTES continues over its attributes, which only the caller computes. */
        if ((long long)entry.payload_len > max_entry_bytes || entry.entry_id < 0 ||
            (entry.flags & (FLAG_TRUNCATE | FLAG_ATTRIBUTES)) ||
            entry_checksum(header[1], entry.entry_id, entry.flags, entry.timestamp_ms,
                           entry.payload, entry.payload_len) != entry.crc32c) {
            PyObject *at = PyLong_FromSsize_t(position);
            if (at == NULL) {
                goto done;
            }
            appended = PyList_Append(special, at);
            Py_DECREF(at);
            if (appended < 0) {
                goto done;
            }
        }
    }
    if (!canonical) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = Py_BuildValue("(KKLLOKOKOO)", (unsigned long long)header[1],
                           (unsigned long long)header[2], (long long)(int64_t)header[3],
                           (long long)(int64_t)header[4], header[5] ? Py_True : Py_False,
                           (unsigned long long)header[6], ids, payload_bytes, special, datas);
done:
    Py_XDECREF(ids);
    Py_XDECREF(special);
    Py_XDECREF(datas);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------ prepare_entries */

/* The writer's per-entry framing (stream/framing/prepare.py, `prepare_entries_python`, the
 * definition; tests/unit/client/test_native_prepare.py holds this to it): each payload as an
 * `Entry` message (entry_id 1, timestamp_ms 3, payload 4, crc32c 5; flags 0 left out, as
 * protobuf leaves a default out) framed as field 7 of an AddRequest, in one bytes object per
 * entry, and the PreparedEntry tuple (entry_id, framed, payload_bytes, timestamp_ms) around
 * it: no Python bytecode per entry. */

static inline size_t
varint_size(uint64_t value)
{
    size_t n = 1;
    while (value >= 0x80) {
        value >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *
put_varint(uint8_t *p, uint64_t value)
{
    while (value >= 0x80) {
        *p++ = (uint8_t)(value | 0x80);
        value >>= 7;
    }
    *p++ = (uint8_t)value;
    return p;
}

PyDoc_STRVAR(prepare_entries_doc,
"prepare_entries(stream_id, first_entry_id, timestamp_ms, payloads, cls)\n"
"--\n\n"
"Returns `payloads` (a list of bytes-like objects) prepared as entries first_entry_id,\n"
"first_entry_id + 1, ... with flags 0 and one timestamp: a list of `cls` (a tuple subclass:\n"
"PreparedEntry) of (entry_id, framed, payload_bytes, timestamp_ms), as\n"
"`prepare_entries_python` returns them. Ids and the timestamp must be in 0 .. 2**63 - 1.");

static PyObject *
prepare_entries(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "prepare_entries takes 5 arguments");
        return NULL;
    }
    unsigned long long stream_id = PyLong_AsUnsignedLongLong(args[0]);
    if (stream_id == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    long long first = PyLong_AsLongLong(args[1]);
    if (first == -1 && PyErr_Occurred()) {
        return NULL;
    }
    long long stamp = PyLong_AsLongLong(args[2]);
    if (stamp == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *payloads = args[3];
    PyTypeObject *cls = (PyTypeObject *)args[4];
    if (!PyList_Check(payloads)) {
        PyErr_SetString(PyExc_TypeError, "payloads must be a list");
        return NULL;
    }
    if (!PyType_Check(args[4]) || !PyType_IsSubtype(cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "cls must be a tuple subclass");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(payloads);
    if (first < 0 || stamp < 0 || (count > 0 && first > INT64_MAX - (count - 1))) {
        PyErr_SetString(PyExc_OverflowError, "entry ids and the timestamp must be in 0..2**63-1");
        return NULL;
    }
    PyObject *stamp_object = PyLong_FromLongLong(stamp);
    if (stamp_object == NULL) {
        return NULL;
    }
    PyObject *result = PyList_New(count);
    if (result == NULL) {
        Py_DECREF(stamp_object);
        return NULL;
    }
    size_t stamp_size = varint_size((uint64_t)stamp);
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t entry_id = first + i;
        Py_buffer view;
        /* The list is ours to read only: a payload is held by it while we copy. */
        if (PyObject_GetBuffer(PyList_GET_ITEM(payloads, i), &view, PyBUF_SIMPLE) < 0) {
            goto failed;
        }
        size_t size = (size_t)view.len;
        uint32_t crc = entry_checksum(stream_id, entry_id, 0, stamp, view.buf, size);
        size_t body = 1 + varint_size((uint64_t)entry_id) + 1 + stamp_size + 1 +
                      varint_size(size) + size + 1 + varint_size(crc);
        PyObject *framed =
            PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(1 + varint_size(body) + body));
        if (framed == NULL) {
            PyBuffer_Release(&view);
            goto failed;
        }
        uint8_t *p = (uint8_t *)PyBytes_AS_STRING(framed);
        *p++ = 0x3a; /* ENTRIES_TAG: field 7, length-delimited */
        p = put_varint(p, body);
        *p++ = 0x08;
        p = put_varint(p, (uint64_t)entry_id);
        *p++ = 0x18;
        p = put_varint(p, (uint64_t)stamp);
        *p++ = 0x22;
        p = put_varint(p, size);
        memcpy(p, view.buf, size);
        p += size;
        *p++ = 0x28;
        put_varint(p, crc);
        PyBuffer_Release(&view);
        PyObject *id_object = PyLong_FromLongLong(entry_id);
        PyObject *size_object = PyLong_FromSize_t(size);
        PyObject *entry = cls->tp_alloc(cls, 4);
        if (id_object == NULL || size_object == NULL || entry == NULL) {
            Py_XDECREF(id_object);
            Py_XDECREF(size_object);
            Py_XDECREF(entry);
            Py_DECREF(framed);
            goto failed;
        }
        Py_INCREF(stamp_object);
        PyTuple_SET_ITEM(entry, 0, id_object);
        PyTuple_SET_ITEM(entry, 1, framed);
        PyTuple_SET_ITEM(entry, 2, size_object);
        PyTuple_SET_ITEM(entry, 3, stamp_object);
        PyList_SET_ITEM(result, i, entry);
    }
    Py_DECREF(stamp_object);
    return result;
failed:
    Py_DECREF(stamp_object);
    Py_DECREF(result); /* the unset items are NULL: list_dealloc skips them */
    return NULL;
}

/* ------------------------------------------------------------- the bookie's range answer */
/* frame_spans: the bookie's range answer, in C (its Python definition is
 * `stream.framing.range_answer.frame_spans_python`; tests/unit/bookie/test_range_answer.py
 * holds this to it). An answer's entries come as spans read from entry logs with one pread
 * each (records at known offsets) and as single records from the write caches (a span of one
 * record); each record becomes one `entries` field (tag, length varint, the serialized entry)
 * of a ReadRangeResponse, after the answer's head, all in one bytes object. The total size is
 * known before anything is written, so however many spans an answer holds there is one
 * allocation and each record is copied once: framing each span apart and joining them was a
 * second copy of the whole answer (8 MiB), and no bytes object is made per entry. */

PyDoc_STRVAR(frame_spans_doc,
"frame_spans(spans, tag, head)\n"
"--\n\n"
"Returns, as one bytes object, `head`, then for each (span, base, offsets, lengths) of\n"
"`spans` in turn each record span[offsets[i] - base : offsets[i] - base + lengths[i]]\n"
"preceded by the byte `tag` and its length as a varint (a length-delimited protobuf field).\n"
"Each of `spans` is a tuple; `offsets` and `lengths` are sequences of ints of one length; a\n"
"record outside its span raises ValueError.");

/* A record to copy: where it is (in a span whose buffer is held) and its size. */
typedef struct {
    const uint8_t *start;
    Py_ssize_t size;
} span_record;

static PyObject *
frame_spans(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "frame_spans takes 3 arguments");
        return NULL;
    }
    long tag = PyLong_AsLong(args[1]);
    if (tag == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (tag < 0 || tag > 0x7f) {
        PyErr_SetString(PyExc_ValueError, "tag must be one byte below 0x80");
        return NULL;
    }
    Py_buffer head;
    if (PyObject_GetBuffer(args[2], &head, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *result = NULL, *spans = NULL, *offsets = NULL, *lengths = NULL;
    Py_buffer *views = NULL;    /* each span's, held until its records are copied */
    Py_ssize_t held = 0;        /* how many of `views` are held */
    span_record *records = NULL;
    Py_ssize_t count = 0, capacity = 0;
    /* A tuple of the spans (a list is copied, a pointer a span), and each span a tuple: the
     * Python code an argument's conversion may run (an `__index__`, an iterator) cannot
     * change what is being read. Offsets and lengths must be ints for the same reason: their
     * items are read without running any. */
    spans = PySequence_Tuple(args[0]);
    if (spans == NULL) {
        goto done;
    }
    Py_ssize_t n_spans = PyTuple_GET_SIZE(spans);
    views = PyMem_Malloc(sizeof(Py_buffer) * (size_t)(n_spans ? n_spans : 1));
    if (views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* First the checks, the records' places and the total size; then one allocation. */
    size_t total = (size_t)head.len;
    for (Py_ssize_t k = 0; k < n_spans; k++) {
        PyObject *part = PyTuple_GET_ITEM(spans, k);
        if (!PyTuple_Check(part) || PyTuple_GET_SIZE(part) != 4) {
            PyErr_Format(PyExc_TypeError,
                         "span %zd is not a tuple (span, base, offsets, lengths)", k);
            goto done;
        }
        long long base = PyLong_AsLongLong(PyTuple_GET_ITEM(part, 1));
        if (base == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (base < 0) {
            PyErr_SetString(PyExc_ValueError, "base must not be negative");
            goto done;
        }
        offsets = PySequence_Fast(PyTuple_GET_ITEM(part, 2), "offsets must be a sequence");
        if (offsets == NULL) {
            goto done;
        }
        lengths = PySequence_Fast(PyTuple_GET_ITEM(part, 3), "lengths must be a sequence");
        if (lengths == NULL) {
            goto done;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(offsets);
        if (PySequence_Fast_GET_SIZE(lengths) != n) {
            PyErr_SetString(PyExc_ValueError, "offsets and lengths differ in length");
            goto done;
        }
        Py_buffer *view = &views[k];
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(part, 0), view, PyBUF_SIMPLE) < 0) {
            goto done;
        }
        held = k + 1;
        if (n > capacity - count) { /* room for this span's records, doubled at least */
            Py_ssize_t most = PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(span_record);
            if (n > most - count) { /* count <= capacity <= most */
                PyErr_NoMemory();
                goto done;
            }
            Py_ssize_t wanted = capacity < most / 2 ? 2 * capacity : most;
            if (wanted < count + n) {
                wanted = count + n;
            }
            span_record *grown = PyMem_Realloc(records, sizeof(span_record) * (size_t)wanted);
            if (grown == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            records = grown;
            capacity = wanted;
        }
        PyObject **offset_items = PySequence_Fast_ITEMS(offsets);
        PyObject **length_items = PySequence_Fast_ITEMS(lengths);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!PyLong_Check(offset_items[i]) || !PyLong_Check(length_items[i])) {
                PyErr_SetString(PyExc_TypeError, "offsets and lengths must be ints");
                goto done;
            }
            long long offset = PyLong_AsLongLong(offset_items[i]);
            if (offset == -1 && PyErr_Occurred()) {
                goto done;
            }
            long long length = PyLong_AsLongLong(length_items[i]);
            if (length == -1 && PyErr_Occurred()) {
                goto done;
            }
            /* Each check before the next sum, so nothing overflows: view->len < 2**63. */
            if (offset < base || length < 0 || offset - base > (long long)view->len ||
                length > (long long)view->len - (offset - base)) {
                PyErr_Format(PyExc_ValueError, "record %zd of span %zd (offset %lld, length "
                             "%lld) is outside the span (base %lld, %zd bytes)", i, k, offset,
                             length, base, view->len);
                goto done;
            }
            size_t framed = 1 + varint_size((uint64_t)length) + (size_t)length;
            if (framed > (size_t)PY_SSIZE_T_MAX - total) { /* total stays a Py_ssize_t */
                PyErr_NoMemory();
                goto done;
            }
            total += framed;
            records[count].start = (const uint8_t *)view->buf + (offset - base);
            records[count].size = (Py_ssize_t)length;
            count++;
        }
        Py_CLEAR(offsets);
        Py_CLEAR(lengths);
    }
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result == NULL) {
        goto done;
    }
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(result);
    if (head.len) {
        memcpy(p, head.buf, (size_t)head.len);
        p += head.len;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        *p++ = (uint8_t)tag;
        p = put_varint(p, (uint64_t)records[i].size);
        memcpy(p, records[i].start, (size_t)records[i].size);
        p += records[i].size;
    }
done:
    for (Py_ssize_t k = 0; k < held; k++) {
        PyBuffer_Release(&views[k]);
    }
    PyMem_Free(views);
    PyMem_Free(records);
    Py_XDECREF(offsets);
    Py_XDECREF(lengths);
    Py_XDECREF(spans);
    PyBuffer_Release(&head);
    return result;
}

/* log_records: the bookie's flush into an entry log, in C (its Python definition is
 * `stream.bookie.storage.entry_log.log_records_python`; tests/unit/bookie/test_log_records.py
 * holds this to it). Each entry becomes a record (its length and stream id, then its bytes) in
 * one bytes object written with one write, and its index key and location are packed here: no
 * Python step and no iovec per entry. */

PyDoc_STRVAR(log_records_doc,
"log_records(stream_id, entry_ids, datas, log_id, offset)\n"
"--\n\n"
"Returns (keys, locations, records) for appending `datas` (a list of bytes: the serialized\n"
"entries `entry_ids` of stream `stream_id`) to entry log `log_id` from byte `offset`:\n"
"`records` is each entry's record header (`<IQ`: length, stream id) and bytes, end to end;\n"
"`keys` each entry's index key (`>QQ`: stream id, entry id) and `locations` its location\n"
"(`<IQI`: log id, offset of its bytes, length), as `log_records_python` returns them.\n"
"Ids, the stream id and offsets must fit in 0 .. 2**64 - 1, the log id and lengths in 32 bits.");

static inline void
put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static inline void
put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static inline void
put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (56 - 8 * i));
    }
}

/* An entry log record's header: `<IQ`, its length and stream id. */
#define RECORD_HEADER_BYTES 12

static PyObject *
log_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "log_records takes 5 arguments");
        return NULL;
    }
    unsigned long long stream_id = PyLong_AsUnsignedLongLong(args[0]);
    if (stream_id == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    unsigned long long log_id = PyLong_AsUnsignedLongLong(args[3]);
    if (log_id == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (log_id > 0xffffffffULL) {
        PyErr_SetString(PyExc_OverflowError, "log_id must fit in 32 bits");
        return NULL;
    }
    unsigned long long offset = PyLong_AsUnsignedLongLong(args[4]);
    if (offset == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *ids = NULL, *datas = NULL, *keys = NULL, *locations = NULL, *records = NULL;
    PyObject *result = NULL;
    ids = PySequence_Fast(args[1], "entry_ids must be a sequence");
    if (ids == NULL) {
        goto done;
    }
    datas = PySequence_Fast(args[2], "datas must be a sequence");
    if (datas == NULL) {
        goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ids);
    if (PySequence_Fast_GET_SIZE(datas) != n) {
        PyErr_SetString(PyExc_ValueError, "entry_ids and datas differ in length");
        goto done;
    }
    PyObject **id_items = PySequence_Fast_ITEMS(ids);
    PyObject **data_items = PySequence_Fast_ITEMS(datas);
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t length;
        if (PyBytes_Check(data_items[i])) {
            length = PyBytes_GET_SIZE(data_items[i]);
        } else { /* another bytes-like object (rare): its buffer */
            Py_buffer view;
            if (PyObject_GetBuffer(data_items[i], &view, PyBUF_SIMPLE) < 0) {
                goto done;
            }
            length = view.len;
            PyBuffer_Release(&view);
        }
        if ((unsigned long long)length > 0xffffffffULL) {
            PyErr_Format(PyExc_OverflowError, "datas[%zd] is over 32 bits long", i);
            goto done;
        }
        total += RECORD_HEADER_BYTES + (size_t)length;
        if (total > (size_t)PY_SSIZE_T_MAX) {
            PyErr_NoMemory();
            goto done;
        }
    }
    keys = PyList_New(n);
    locations = PyList_New(n);
    records = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (keys == NULL || locations == NULL || records == NULL) {
        goto done;
    }
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(records);
    const uint8_t *end = p + total;
    unsigned long long position = offset;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long entry_id = PyLong_AsUnsignedLongLong(id_items[i]);
        if (entry_id == (unsigned long long)-1 && PyErr_Occurred()) {
            goto done;
        }
        Py_buffer view = {0};
        const char *data;
        Py_ssize_t length;
        if (PyBytes_Check(data_items[i])) {
            data = PyBytes_AS_STRING(data_items[i]);
            length = PyBytes_GET_SIZE(data_items[i]);
        } else {
            if (PyObject_GetBuffer(data_items[i], &view, PyBUF_SIMPLE) < 0) {
                goto done;
            }
            data = (const char *)view.buf;
            length = view.len;
        }
        /* One that grew since the first pass. */
        if ((size_t)(end - p) < RECORD_HEADER_BYTES + (size_t)length) {
            PyBuffer_Release(&view);
            PyErr_Format(PyExc_ValueError, "datas[%zd] changed size", i);
            goto done;
        }
        if (position > ULLONG_MAX - RECORD_HEADER_BYTES - (unsigned long long)length) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_OverflowError, "an offset over 64 bits");
            goto done;
        }
        PyObject *key = PyBytes_FromStringAndSize(NULL, 16);
        if (key == NULL) {
            PyBuffer_Release(&view);
            goto done;
        }
        uint8_t *k = (uint8_t *)PyBytes_AS_STRING(key);
        put_be64(k, stream_id);
        put_be64(k + 8, entry_id);
        PyList_SET_ITEM(keys, i, key);
        PyObject *location = PyBytes_FromStringAndSize(NULL, 16);
        if (location == NULL) {
            PyBuffer_Release(&view);
            goto done;
        }
        uint8_t *l = (uint8_t *)PyBytes_AS_STRING(location);
        put_le32(l, (uint32_t)log_id);
        put_le64(l + 4, position + RECORD_HEADER_BYTES);
        put_le32(l + 12, (uint32_t)length);
        PyList_SET_ITEM(locations, i, location);
        put_le32(p, (uint32_t)length);
        put_le64(p + 4, stream_id);
        memcpy(p + RECORD_HEADER_BYTES, data, (size_t)length);
        PyBuffer_Release(&view);
        p += RECORD_HEADER_BYTES + (size_t)length;
        position += RECORD_HEADER_BYTES + (unsigned long long)length;
    }
    result = PyTuple_Pack(3, keys, locations, records);
done:
    Py_XDECREF(ids);
    Py_XDECREF(datas);
    Py_XDECREF(keys);
    Py_XDECREF(locations);
    Py_XDECREF(records);
    return result;
}

/* index_runs: a bookie's range read locating its records, in C (its Python definition is
 * `stream.bookie.storage.locations.index_runs_python`; tests/unit/bookie/test_locations.py
 * holds this to it). The index gives the locations of consecutive entries; the answer takes
 * them up to its byte budget, and each run of adjacent records (one entry log, each record right
 * after the one before) is read with one pread and framed as one span. Parsing the locations,
 * cutting them at the budget and telling the runs took Python about 100 ns per entry (three
 * ints, slices and maps per entry); here it is one pass, and only the runs' columns are made. */

PyDoc_STRVAR(index_runs_doc,
"index_runs(located, budget, header)\n"
"--\n\n"
"Returns (count, runs) for `located`, a list of the index locations (`<IQI`: log id, offset\n"
"of the entry's bytes, length) of consecutive entries: the first `count` are taken, up to and\n"
"with the one whose length brings their sum to `budget` (at least one, unless `located` is\n"
"empty); `runs` cuts those into runs of adjacent records, each (log id, offset of its first\n"
"record, offsets, lengths), the offsets and lengths tuples of ints: one log, each record's\n"
"offset `header` bytes past the end of the one before. A location that is not 16 bytes\n"
"raises ValueError.");

#define LOCATION_BYTES 16

static inline uint32_t
get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t
get_le64(const uint8_t *p)
{
    return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

/* A new tuple of the `count` fields at byte `at` of the locations from `first` (32 or 64 bits
 * wide), as ints. */
static PyObject *
location_column(PyObject *located, Py_ssize_t first, Py_ssize_t count, int at, int wide)
{
    PyObject *column = PyTuple_New(count);
    if (column == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        const uint8_t *p =
            (const uint8_t *)PyBytes_AS_STRING(PyList_GET_ITEM(located, first + i)) + at;
        PyObject *value = wide ? PyLong_FromUnsignedLongLong(get_le64(p))
                               : PyLong_FromUnsignedLong(get_le32(p));
        if (value == NULL) {
            Py_DECREF(column);
            return NULL;
        }
        PyTuple_SET_ITEM(column, i, value);
    }
    return column;
}

static PyObject *
index_runs(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "index_runs takes 3 arguments");
        return NULL;
    }
    PyObject *located = args[0];
    if (!PyList_Check(located)) {
        PyErr_SetString(PyExc_TypeError, "located must be a list");
        return NULL;
    }
    long long budget = PyLong_AsLongLong(args[1]);
    if (budget == -1 && PyErr_Occurred()) {
        return NULL;
    }
    long long header = PyLong_AsLongLong(args[2]);
    if (header == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (header < 0) {
        PyErr_SetString(PyExc_ValueError, "header must not be negative");
        return NULL;
    }
    /* Nothing below runs Python code, so the list cannot change while it is read. */
    Py_ssize_t n = PyList_GET_SIZE(located);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(located, i);
        if (!PyBytes_Check(item) || PyBytes_GET_SIZE(item) != LOCATION_BYTES) {
            PyErr_Format(PyExc_ValueError, "location %zd is not %d bytes", i, LOCATION_BYTES);
            return NULL;
        }
    }
    Py_ssize_t count = 0;
    long long total = 0; /* a sum of at most n 32-bit lengths: no overflow */
    while (count < n) {
        const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(PyList_GET_ITEM(located, count));
        total += get_le32(p + 12);
        count++;
        if (total >= budget) {
            break;
        }
    }
    PyObject *runs = PyList_New(0);
    if (runs == NULL) {
        return NULL;
    }
    Py_ssize_t i = 0;
    while (i < count) {
        const uint8_t *first = (const uint8_t *)PyBytes_AS_STRING(PyList_GET_ITEM(located, i));
        uint32_t log = get_le32(first);
        uint64_t base = get_le64(first + 4);
        /* 128 bits: a run's end and the next record's expected offset never wrap. */
        unsigned __int128 end = (unsigned __int128)base + get_le32(first + 12);
        Py_ssize_t j = i + 1;
        while (j < count) {
            const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(PyList_GET_ITEM(located, j));
            uint64_t offset = get_le64(p + 4);
            if (get_le32(p) != log || (unsigned __int128)offset != end + (uint64_t)header) {
                break;
            }
            end = (unsigned __int128)offset + get_le32(p + 12);
            j++;
        }
        PyObject *offsets = location_column(located, i, j - i, 4, 1);
        PyObject *lengths = offsets == NULL ? NULL : location_column(located, i, j - i, 12, 0);
        PyObject *run = lengths == NULL ? NULL : Py_BuildValue("(kKOO)", (unsigned long)log,
                                                               (unsigned long long)base, offsets,
                                                               lengths);
        Py_XDECREF(offsets);
        Py_XDECREF(lengths);
        if (run == NULL || PyList_Append(runs, run) < 0) {
            Py_XDECREF(run);
            Py_DECREF(runs);
            return NULL;
        }
        Py_DECREF(run);
        i = j;
    }
    return Py_BuildValue("(nN)", count, runs);
}

/* ------------------------------------------------------------------ sized_buffer */

PyDoc_STRVAR(sized_buffer_doc,
"sized_buffer(buffer, size)\n"
"--\n\n"
"Returns `buffer` (a bytearray) resized to `size` bytes in place, its first bytes kept and\n"
"any added ones left as they are in memory; with `buffer` None, a new bytearray of `size`\n"
"bytes left as they are (not zeroed). For buffers about to be filled whole (a received\n"
"frame): bytearray(size) zeroes every byte first. Within the bytearray's allocation nothing\n"
"is reallocated, whatever the size. A buffer exported (a memoryview of it) raises\n"
"BufferError and is left as it was. Defined in Python by\n"
"stream.client.answer_buffers.sized_buffer_python.");

static PyObject *
sized_buffer(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "sized_buffer takes a buffer and a size");
        return NULL;
    }
    Py_ssize_t size = PyLong_AsSsize_t(args[1]);
    if (size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "the size must not be negative");
        return NULL;
    }
    PyObject *buffer = args[0];
    if (buffer == Py_None) {
        return PyByteArray_FromStringAndSize(NULL, size);
    }
    if (!PyByteArray_CheckExact(buffer)) {
        PyErr_SetString(PyExc_TypeError, "the buffer must be a bytearray or None");
        return NULL;
    }
    PyByteArrayObject *array = (PyByteArrayObject *)buffer;
    if (array->ob_exports > 0) {
        PyErr_SetString(PyExc_BufferError, "the buffer is exported: it cannot be resized");
        return NULL;
    }
    if (array->ob_bytes != NULL && array->ob_start == array->ob_bytes &&
        size < array->ob_alloc) {
        /* Within the allocation: the size alone changes, as PyByteArray_Resize does for
         * sizes above half the allocation (below, it would reallocate it smaller). */
        Py_SET_SIZE(array, size);
        array->ob_bytes[size] = '\0';
    }
    else if (PyByteArray_Resize(buffer, size) < 0) {
        return NULL;
    }
    Py_INCREF(buffer);
    return buffer;
}

static PyMethodDef methods[] = {
    {"walk_range", (PyCFunction)(void (*)(void))walk_range, METH_FASTCALL, walk_range_doc},
    {"split_payloads", (PyCFunction)(void (*)(void))split_payloads, METH_FASTCALL,
     split_payloads_doc},
    {"crc32c", (PyCFunction)(void (*)(void))crc32c, METH_FASTCALL, crc32c_doc},
    {"set_hardware_crc", set_hardware_crc, METH_O, set_hardware_crc_doc},
    {"scan_add", (PyCFunction)(void (*)(void))scan_add, METH_FASTCALL, scan_add_doc},
    {"prepare_entries", (PyCFunction)(void (*)(void))prepare_entries, METH_FASTCALL,
     prepare_entries_doc},
    {"log_records", (PyCFunction)(void (*)(void))log_records, METH_FASTCALL, log_records_doc},
    {"frame_spans", (PyCFunction)(void (*)(void))frame_spans, METH_FASTCALL, frame_spans_doc},
    {"index_runs", (PyCFunction)(void (*)(void))index_runs, METH_FASTCALL, index_runs_doc},
    {"sized_buffer", (PyCFunction)(void (*)(void))sized_buffer, METH_FASTCALL,
     sized_buffer_doc},
    {NULL, NULL, 0, NULL},
};

static int
module_exec(PyObject *module)
{
    crc_init();
#ifdef HAVE_SSE42
    crc_shift_table(crc_long_shift, CRC_LONG);
    crc_shift_table(crc_short_shift, CRC_SHORT);
    __builtin_cpu_init();
    use_hardware = __builtin_cpu_supports("sse4.2");
#endif
    if (PyModule_AddIntConstant(module, "DONE", DONE) < 0 ||
        PyModule_AddIntConstant(module, "DEFER", DEFER) < 0 ||
        PyModule_AddIntConstant(module, "FALLBACK", FALLBACK) < 0 ||
        PyModule_AddIntConstant(module, "FLAG_NOOP", FLAG_NOOP) < 0 ||
        PyModule_AddIntConstant(module, "FLAG_ATTRIBUTES", FLAG_ATTRIBUTES) < 0) {
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "stream.framing._native",
    .m_doc = "The reader's per-entry loop over ReadRange answers, compiled (see _native.c).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModuleDef_Init(&module_def);
}
