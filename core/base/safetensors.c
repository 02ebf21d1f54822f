/* core/base/safetensors.c — see safetensors.h. The JSON parser here handles exactly what a
 * header can hold (objects, arrays, strings with escapes, numbers, true/false/null) and
 * nothing else; every value read from a file is checked before use.
 *
 * The format: an 8-byte little-endian header length N, N bytes of JSON (an object: one member
 * per tensor {"dtype", "shape", "data_offsets": [begin, end)} plus an optional "__metadata__"
 * object of string values), then the data; offsets count from the first byte after the
 * header. This reader and the fuzzer (tests/fuzz/fuzz_safetensors.c) hold that a hostile file
 * costs at most its own size plus an index proportional to its header, and is refused with a
 * message naming the file and the offending entry. */
#include "safetensors.h"
#include "fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (100u * 1024u * 1024u) /* as the reference implementation */
/* Nesting bound for arrays and objects: a real header nests 3 deep (root, tensor, shape), so
 * this only stops a crafted one from recursing the parser off the stack. */
#define ST_MAX_DEPTH 64

typedef struct st_dtype {
  const char *name;
  size_t size;
} st_dtype;

/* Every dtype name the format defines, with its element size in bytes: a file may hold any of
 * them (the caller decides what it can load); shape x size must equal the data range. */
static const st_dtype st_dtypes[] = {{"F64", 8}, {"F32", 4},  {"F16", 2},     {"BF16", 2},    {"I64", 8},
                                     {"I32", 4}, {"I16", 2},  {"I8", 1},      {"U64", 8},     {"U32", 4},
                                     {"U16", 2}, {"U8", 1},   {"BOOL", 1},    {"F8_E4M3", 1}, {"F8_E5M2", 1}};

/* The table entry for a dtype name (exact, case-sensitive, as the format spells it); NULL if
 * the name is not one the format defines. */
static const st_dtype *st_find_dtype(const char *name) {
  size_t i;
  for (i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (strcmp(st_dtypes[i].name, name) == 0) return &st_dtypes[i];
  return NULL;
}

/* Element size in bytes of a dtype name; 0 for NULL or an unknown name, so a caller can test
 * "known?" and get the size in one call. */
size_t tt_st_dtype_size(const char *dtype) {
  const st_dtype *d = dtype ? st_find_dtype(dtype) : NULL;
  return d ? d->size : 0;
}

/* ---------------- writing ---------------- */

/* Checks n tensor descriptions before anything is written: each name non-empty, not reserved
 * and unique, a known dtype, at most TT_ST_MAX_DIMS non-negative dims whose product times the
 * dtype's size is bytes, and (need_data) a data pointer where there are bytes. 0, or -1 with err
 * naming the file and the tensor. */
static const char *st_first_duplicate(const char **v, int n); /* below, with the reader's checks */

static int st_check_tensors(const char *path, const tt_st_tensor *t, int n, int need_data, tt_err *err) {
  int i, j;
  if (n < 0) return tt_fail(err, "%s: negative tensor count %d", path, n);
  for (i = 0; i < n; i++) {
    const st_dtype *d = t[i].dtype ? st_find_dtype(t[i].dtype) : NULL;
    uint64_t elems = 1;
    if (!t[i].name || !t[i].name[0] || strcmp(t[i].name, "__metadata__") == 0)
      return tt_fail(err, "%s: tensor %d has an empty or reserved name; give it a unique name", path, i);
    if (!d)
      return tt_fail(err, "%s: tensor \"%s\" has unknown dtype \"%s\"; use F32, F16, BF16, I32, U8, ...", path,
                     t[i].name, t[i].dtype ? t[i].dtype : "(null)");
    if (t[i].ndim < 0 || t[i].ndim > TT_ST_MAX_DIMS)
      return tt_fail(err, "%s: tensor \"%s\" has %d dims; at most %d are supported", path, t[i].name, t[i].ndim,
                     TT_ST_MAX_DIMS);
    for (j = 0; j < t[i].ndim; j++) {
      if (t[i].shape[j] < 0) return tt_fail(err, "%s: tensor \"%s\" has a negative dim", path, t[i].name);
      elems *= (uint64_t)t[i].shape[j];
    }
    if (elems * d->size != (uint64_t)t[i].bytes)
      return tt_fail(err, "%s: tensor \"%s\": %zu bytes given but its shape and %s need %llu; fix the shape",
                     path, t[i].name, t[i].bytes, d->name, (unsigned long long)(elems * d->size));
    if (need_data && t[i].bytes && !t[i].data)
      return tt_fail(err, "%s: tensor \"%s\" has no data pointer", path, t[i].name);
  }
  { /* names unique: sorted, not compared pairwise (80,000 layers' checkpoint never finished, issue 40) */
    const char **names = (const char **)tt_calloc((size_t)n + 1, sizeof(char *), "tensor names", err);
    const char *dup;
    if (!names) return -1;
    for (i = 0; i < n; i++) names[i] = t[i].name;
    dup = st_first_duplicate(names, n);
    if (dup) {
      tt_fail(err, "%s: tensor name \"%s\" appears twice; names must be unique", path, dup);
      free((void *)names);
      return -1;
    }
    free((void *)names);
  }
  return 0;
}

/* Builds the file's first part into h (zeroed by the caller): the 8-byte little-endian length,
 * then the JSON header padded with spaces to a multiple of 8 bytes, the tensors' data_offsets
 * back to back in the order given. *data_bytes = the data's total. 0, or -1 (h freed, err set).
 * The one header both writers use, so the streamed file is the in-memory one byte for byte. */
static int st_header(const char *path, const tt_st_tensor *t, int n, const char *const *meta_kv, tt_strbuf *h,
                     uint64_t *data_bytes, tt_err *err) {
  uint64_t off = 0, hlen;
  int i, j, first = 1;
  tt_strbuf_put(h, "\0\0\0\0\0\0\0\0", 8); /* the length, filled in below */
  tt_strbuf_put(h, "{", 1);
  if (meta_kv && meta_kv[0]) {
    tt_strbuf_put(h, "\"__metadata__\":{", 16);
    for (i = 0; meta_kv[i]; i += 2) {
      if (!meta_kv[i + 1]) {
        free(h->p);
        return tt_fail(err, "%s: metadata key \"%s\" has no value (the list must be key, value, ..., NULL)", path,
                       meta_kv[i]);
      }
      if (i) tt_strbuf_put(h, ",", 1);
      tt_strbuf_json(h, meta_kv[i]);
      tt_strbuf_put(h, ":", 1);
      tt_strbuf_json(h, meta_kv[i + 1]);
    }
    tt_strbuf_put(h, "}", 1);
    first = 0;
  }
  for (i = 0; i < n; i++) {
    if (!first) tt_strbuf_put(h, ",", 1);
    first = 0;
    tt_strbuf_json(h, t[i].name);
    tt_strbuf_put(h, ":{\"dtype\":", 10);
    tt_strbuf_json(h, t[i].dtype);
    tt_strbuf_put(h, ",\"shape\":[", 10);
    for (j = 0; j < t[i].ndim; j++) tt_strbuf_printf(h, j ? ",%lld" : "%lld", (long long)t[i].shape[j]);
    tt_strbuf_printf(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                     (unsigned long long)(off + t[i].bytes));
    off += t[i].bytes;
  }
  tt_strbuf_put(h, "}", 1);
  while (!h->oom && (h->n - 8) % 8 != 0) tt_strbuf_put(h, " ", 1);
  if (h->oom) {
    free(h->p);
    return tt_fail(err, "%s: out of host memory building the header", path);
  }
  hlen = h->n - 8;
  for (i = 0; i < 8; i++) h->p[i] = (char)(unsigned char)(hlen >> (8 * i));
  *data_bytes = off;
  return 0;
}

/* Saves n tensors and the optional NULL-terminated key, value, ... list meta_kv as a
 * safetensors file at path. Returns 0, or -1 with err set naming the file and the tensor; the
 * caller keeps ownership of every buffer (they are only read).
 * Validates everything first, so a bad call writes nothing. The tensors are laid out in the
 * order given, back to back; the header is padded with spaces to a multiple of 8 bytes (as
 * the reference writer does) so that the data starts 8-byte aligned and a reader may map it
 * and use F64/I64 in place. The file is written atomically: an interrupted save leaves the
 * previous file intact, which is what keeps a good checkpoint good. */
int tt_st_write(const char *path, const tt_st_tensor *t, int n, const char *const *meta_kv, tt_err *err) {
  tt_st_writer w;
  int i;
  if (st_check_tensors(path, t, n, 1, err) || tt_st_writer_open(&w, path, t, n, meta_kv, err)) return -1;
  for (i = 0; i < n; i++)
    if (tt_st_writer_put(&w, t[i].data, t[i].bytes, err)) return -1;
  return tt_st_writer_commit(&w, err);
}

/* Validates the descriptions (data may be NULL: it comes through put), opens "<path>.tmp" and
 * writes the header; from here the writer owns the temporary file until commit or discard. */
int tt_st_writer_open(tt_st_writer *w, const char *path, const tt_st_tensor *t, int n, const char *const *meta_kv,
                      tt_err *err) {
  tt_strbuf h;
  memset(w, 0, sizeof *w);
  w->file.fd = -1;
  memset(&h, 0, sizeof h);
  if (st_check_tensors(path, t, n, 0, err) || st_header(path, t, n, meta_kv, &h, &w->expected, err)) return -1;
  int rc = tt_atomic_open(&w->file, path, err);
  if (!rc) rc = tt_atomic_write(&w->file, h.p, h.n, err); /* a failed write discards the temporary file */
  free(h.p);
  return rc;
}

/* Appends bytes of the data section; past the size the header announced is refused (and the
 * temporary file discarded), so a caller's miscount can never write a file the header misdescribes. */
int tt_st_writer_put(tt_st_writer *w, const void *data, size_t bytes, tt_err *err) {
  if (w->file.fd < 0) return tt_fail(err, "internal error: a safetensors writer used after it failed or closed");
  if (bytes > w->expected - w->written) {
    tt_fail(err, "%s: internal error: %llu data bytes given where the header announced %llu; nothing was written",
            w->file.path, (unsigned long long)(w->written + bytes), (unsigned long long)w->expected);
    tt_atomic_discard(&w->file);
    return -1;
  }
  if (bytes && tt_atomic_write(&w->file, data, bytes, err)) return -1;
  w->written += bytes;
  return 0;
}

/* Renames the file over path once every announced byte came; else discards it. */
int tt_st_writer_commit(tt_st_writer *w, tt_err *err) {
  if (w->file.fd < 0) return tt_fail(err, "internal error: a safetensors writer used after it failed or closed");
  if (w->written != w->expected) {
    tt_fail(err, "%s: internal error: %llu of the %llu data bytes the header announced were given; nothing was written",
            w->file.path, (unsigned long long)w->written, (unsigned long long)w->expected);
    tt_atomic_discard(&w->file);
    return -1;
  }
  return tt_atomic_commit(&w->file, err);
}

void tt_st_writer_discard(tt_st_writer *w) { tt_atomic_discard(&w->file); }

/* ---------------- reading: a small JSON DOM ---------------- */

enum { ST_J_NULL = 0, ST_J_BOOL, ST_J_NUM, ST_J_STR, ST_J_ARR, ST_J_OBJ };

typedef struct st_node {
  int type;
  const char *key;  /* member name when the parent is an object */
  const char *str;  /* ST_J_STR: decoded, NUL-terminated */
  int is_int;       /* ST_J_NUM: an integer that fits int64 */
  int64_t ival;
  int first, next;  /* first child, next sibling (node indices; -1 = none) */
  int count;        /* children */
} st_node;

/* The parser keeps a flat array of nodes (children linked by index, not pointer, so that
 * growing the array by realloc invalidates nothing) and decodes every string into one buffer
 * as long as the header: an escape never decodes longer than it is written, so the buffer
 * cannot overflow. */
typedef struct st_parser {
  const char *path;
  const char *s, *end, *begin;
  char *sbuf;       /* decoded strings; never longer than their encoding */
  size_t sused;
  st_node *nodes;
  int nnodes, cap;
  tt_err *err;
} st_parser;

/* Fails with a parse error at the parser's current position (a byte offset into the header,
 * not into the file: add 8 for the file offset). Always returns -1. */
static int st_perr(st_parser *p, const char *what) {
  return tt_fail(p->err, "%s: corrupt safetensors header: %s at header byte %ld; the file is damaged, re-save it",
                 p->path, what, (long)(p->s - p->begin));
}

/* Skips JSON whitespace (space, tab, LF, CR; nothing else counts) without passing p->end. */
static void st_ws(st_parser *p) {
  while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')) p->s++;
}

/* Appends a zeroed node of the given type with no children or sibling; returns its index, or
 * -1 when the array cannot grow (the caller words the out-of-memory message). Indices stay
 * valid across growth; pointers into p->nodes do not. */
static int st_new_node(st_parser *p, int type) {
  if (p->nnodes == p->cap) {
    int cap = p->cap ? p->cap * 2 : 64;
    st_node *v = (st_node *)realloc(p->nodes, sizeof(st_node) * (size_t)cap);
    if (!v) return -1;
    p->nodes = v;
    p->cap = cap;
  }
  memset(&p->nodes[p->nnodes], 0, sizeof(st_node));
  p->nodes[p->nnodes].type = type;
  p->nodes[p->nnodes].first = p->nodes[p->nnodes].next = -1;
  return p->nnodes++;
}

/* Reads exactly four hex digits (either case) at s into *v; 0, or -1 on any other character.
 * The caller has checked that four bytes are there. */
static int st_hex4(const char *s, unsigned *v) {
  int i;
  *v = 0;
  for (i = 0; i < 4; i++) {
    char c = s[i];
    *v <<= 4;
    if (c >= '0' && c <= '9') *v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') *v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') *v |= (unsigned)(c - 'A' + 10);
    else return -1;
  }
  return 0;
}

/* Parses a string at p->s (on the opening quote); returns the decoded copy or NULL.
 * The decoded copy lives in p->sbuf and is NUL-terminated; \u escapes become UTF-8 (a
 * surrogate pair one 4-byte sequence) and an escaped NUL is refused, so that every name is a
 * plain C string. On NULL the error is already set. Raw bytes >= 0x80 are copied unchecked. */
static const char *st_string(st_parser *p) {
  char *out = p->sbuf + p->sused, *o = out;
  p->s++;
  for (;;) {
    unsigned char c;
    if (p->s >= p->end) return (st_perr(p, "unterminated string"), (const char *)NULL);
    c = (unsigned char)*p->s++;
    if (c == '"') break;
    if (c < 0x20) return (st_perr(p, "control character in a string"), (const char *)NULL);
    if (c != '\\') {
      *o++ = (char)c;
      continue;
    }
    if (p->s >= p->end) return (st_perr(p, "unterminated escape"), (const char *)NULL);
    c = (unsigned char)*p->s++;
    switch (c) {
    case '"': *o++ = '"'; break;
    case '\\': *o++ = '\\'; break;
    case '/': *o++ = '/'; break;
    case 'b': *o++ = '\b'; break;
    case 'f': *o++ = '\f'; break;
    case 'n': *o++ = '\n'; break;
    case 'r': *o++ = '\r'; break;
    case 't': *o++ = '\t'; break;
    case 'u': {
      unsigned cp, lo;
      if (p->end - p->s < 4 || st_hex4(p->s, &cp) != 0)
        return (st_perr(p, "bad \\u escape"), (const char *)NULL);
      p->s += 4;
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (p->end - p->s < 6 || p->s[0] != '\\' || p->s[1] != 'u' || st_hex4(p->s + 2, &lo) != 0 ||
            lo < 0xDC00 || lo > 0xDFFF)
          return (st_perr(p, "unpaired surrogate in \\u escape"), (const char *)NULL);
        p->s += 6;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
        return (st_perr(p, "unpaired surrogate in \\u escape"), (const char *)NULL);
      }
      if (cp == 0) return (st_perr(p, "NUL character in a string"), (const char *)NULL);
      if (cp < 0x80) {
        *o++ = (char)cp;
      } else if (cp < 0x800) {
        *o++ = (char)(0xC0 | (cp >> 6));
        *o++ = (char)(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        *o++ = (char)(0xE0 | (cp >> 12));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
      } else {
        *o++ = (char)(0xF0 | (cp >> 18));
        *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
      }
      break;
    }
    default: return (st_perr(p, "unknown escape in a string"), (const char *)NULL);
    }
  }
  *o++ = 0;
  p->sused += (size_t)(o - out);
  return out;
}

static int st_value(st_parser *p, int depth);

/* Parses a JSON number at p->s into a new ST_J_NUM node; returns its index or -1. Only the
 * integer part is converted: is_int is 1 for a plain integer whose magnitude fits int64 (a
 * fraction, exponent or overflow clears it, and then ival is meaningless; -2^63 counts as an
 * overflow, as every magnitude past INT64_MAX does), because offsets
 * and shapes are the only numbers the reader uses. */
static int st_number(st_parser *p) {
  int neg = 0, is_int = 1, id, overflow = 0;
  uint64_t v = 0;
  if (p->s < p->end && *p->s == '-') neg = 1, p->s++;
  if (p->s >= p->end || *p->s < '0' || *p->s > '9') return st_perr(p, "bad number");
  if (*p->s == '0' && p->s + 1 < p->end && p->s[1] >= '0' && p->s[1] <= '9')
    return st_perr(p, "number with a leading zero");
  while (p->s < p->end && *p->s >= '0' && *p->s <= '9') { /* v stays <= INT64_MAX: its negation is defined */
    uint64_t d = (uint64_t)(*p->s++ - '0');
    if (!overflow && v > (UINT64_C(0x7FFFFFFFFFFFFFFF) - d) / 10) overflow = 1;
    if (!overflow) v = v * 10 + d;
  }
  if (p->s < p->end && *p->s == '.') {
    is_int = 0;
    p->s++;
    if (p->s >= p->end || *p->s < '0' || *p->s > '9') return st_perr(p, "bad number");
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') p->s++;
  }
  if (p->s < p->end && (*p->s == 'e' || *p->s == 'E')) {
    is_int = 0;
    p->s++;
    if (p->s < p->end && (*p->s == '+' || *p->s == '-')) p->s++;
    if (p->s >= p->end || *p->s < '0' || *p->s > '9') return st_perr(p, "bad number");
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') p->s++;
  }
  id = st_new_node(p, ST_J_NUM);
  if (id < 0) return tt_fail(p->err, "%s: out of host memory parsing the header", p->path);
  p->nodes[id].is_int = is_int && !overflow;
  p->nodes[id].ival = overflow ? 0 : neg ? -(int64_t)v : (int64_t)v;
  return id;
}

/* Matches the literal word (true, false or null) at p->s and makes a node of type for it;
 * returns its index or -1. A boolean's value is not kept: no header field needs one. */
static int st_literal(st_parser *p, const char *word, int type) {
  size_t n = strlen(word);
  int id;
  if ((size_t)(p->end - p->s) < n || memcmp(p->s, word, n) != 0) return st_perr(p, "unexpected character");
  p->s += n;
  id = st_new_node(p, type);
  if (id < 0) return tt_fail(p->err, "%s: out of host memory parsing the header", p->path);
  return id;
}

/* Parses an array or object; members are linked through first/next.
 * p->s is on the opening bracket; returns the container's node index or -1. Object member
 * names are kept as each child's key in document order; duplicate keys are allowed here and
 * refused later by the validation that knows which keys matter. */
static int st_container(st_parser *p, int depth, int is_obj) {
  int id = st_new_node(p, is_obj ? ST_J_OBJ : ST_J_ARR), last = -1;
  char close = is_obj ? '}' : ']';
  if (id < 0) return tt_fail(p->err, "%s: out of host memory parsing the header", p->path);
  p->s++;
  st_ws(p);
  if (p->s < p->end && *p->s == close) {
    p->s++;
    return id;
  }
  for (;;) {
    const char *key = NULL;
    int child;
    st_ws(p);
    if (is_obj) {
      if (p->s >= p->end || *p->s != '"') return st_perr(p, "expected a member name in quotes");
      key = st_string(p);
      if (!key) return -1;
      st_ws(p);
      if (p->s >= p->end || *p->s != ':') return st_perr(p, "expected ':' after a member name");
      p->s++;
    }
    child = st_value(p, depth + 1);
    if (child < 0) return -1;
    p->nodes[child].key = key;
    if (last < 0)
      p->nodes[id].first = child;
    else
      p->nodes[last].next = child;
    last = child;
    p->nodes[id].count++;
    st_ws(p);
    if (p->s < p->end && *p->s == ',') {
      p->s++;
      continue;
    }
    if (p->s < p->end && *p->s == close) {
      p->s++;
      return id;
    }
    return st_perr(p, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
  }
}

/* Parses one JSON value of any type at p->s (after whitespace) and returns its node index, or
 * -1 with the error set. depth counts enclosing containers and is capped at ST_MAX_DEPTH. */
static int st_value(st_parser *p, int depth) {
  st_ws(p);
  if (depth > ST_MAX_DEPTH) return st_perr(p, "nesting too deep");
  if (p->s >= p->end) return st_perr(p, "unexpected end of header");
  switch (*p->s) {
  case '{': return st_container(p, depth, 1);
  case '[': return st_container(p, depth, 0);
  case '"': {
    const char *s = st_string(p);
    int id;
    if (!s) return -1;
    id = st_new_node(p, ST_J_STR);
    if (id < 0) return tt_fail(p->err, "%s: out of host memory parsing the header", p->path);
    p->nodes[id].str = s;
    return id;
  }
  case 't': return st_literal(p, "true", ST_J_BOOL);
  case 'f': return st_literal(p, "false", ST_J_BOOL);
  case 'n': return st_literal(p, "null", ST_J_NULL);
  default: return st_number(p);
  }
}

/* ---------------- lists of names in metadata ---------------- */

/* Appends names[0..n) as a JSON array of strings ("[\"a\", \"b\"]"): the form in which lists
 * of names are stored as metadata values, read back by tt_st_names_parse. */
void tt_st_names_format(tt_strbuf *b, const char *const *names, int n) {
  int i;
  tt_strbuf_put(b, "[", 1);
  for (i = 0; i < n; i++) {
    if (i) tt_strbuf_put(b, ", ", 2);
    tt_strbuf_json(b, names[i]);
  }
  tt_strbuf_put(b, "]", 1);
}

/* Copies the n strings of array node arr into one block: n pointers, then the strings.
 * The caller owns the block and frees it with a single free(); NULL with err set on failure. */
static char **st_names_copy(const st_parser *p, int arr, int n, tt_err *err) {
  size_t bytes = sizeof(char *) * (size_t)n;
  int i, c;
  char **v, *o;
  for (c = p->nodes[arr].first; c >= 0; c = p->nodes[c].next) bytes += strlen(p->nodes[c].str) + 1;
  v = (char **)tt_malloc(bytes ? bytes : 1, "a list of names", err);
  if (!v) return NULL;
  o = (char *)(v + n);
  for (i = 0, c = p->nodes[arr].first; c >= 0; c = p->nodes[c].next, i++) {
    size_t len = strlen(p->nodes[c].str) + 1;
    memcpy(o, p->nodes[c].str, len);
    v[i] = o;
    o += len;
  }
  return v;
}

/* Parses value, which must be a JSON array of strings, into *names (one block: free() it once)
 * and *n. Returns 0, or -1 with err set (what names the value in the message), *names NULL
 * and *n 0. An empty array gives n = 0 and a non-NULL block. */
int tt_st_names_parse(const char *what, const char *value, char ***names, int *n, tt_err *err) {
  st_parser p;
  int root, c, rc = -1;
  size_t len = strlen(value);
  *names = NULL;
  *n = 0;
  memset(&p, 0, sizeof p);
  p.path = what;
  p.begin = p.s = value;
  p.end = value + len;
  p.err = err;
  p.sbuf = (char *)tt_malloc(len + 1, "a list of names", err);
  if (!p.sbuf) return -1;
  root = st_value(&p, 0);
  if (root >= 0) {
    st_ws(&p);
    if (p.s != p.end) root = st_perr(&p, "unexpected text after the list");
  }
  if (root >= 0 && p.nodes[root].type != ST_J_ARR) root = tt_fail(err, "%s: expected a JSON array of strings", what);
  for (c = root >= 0 ? p.nodes[root].first : -1; c >= 0; c = p.nodes[c].next)
    if (p.nodes[c].type != ST_J_STR) {
      root = tt_fail(err, "%s: element %d is not a string; expected a JSON array of strings", what, *n);
      break;
    } else {
      (*n)++;
    }
  if (root >= 0 && (*names = st_names_copy(&p, root, *n, err)) != NULL) rc = 0;
  if (rc != 0) *n = 0;
  free(p.nodes);
  free(p.sbuf);
  return rc;
}

/* Reads the list of names stored under metadata key in the file at path (see
 * tt_st_names_parse for ownership). A missing key is not an error: 0 with *names NULL and *n
 * 0. Opens and reads the whole file, so call it once, not per name. */
int tt_st_file_names(const char *path, const char *key, char ***names, int *n, tt_err *err) {
  tt_st_file *f = NULL;
  const char *v;
  char what[4200];
  int rc = 0;
  *names = NULL, *n = 0;
  if (tt_st_open(path, &f, err)) return -1;
  v = tt_st_meta(f, key);
  snprintf(what, sizeof what, "%s: metadata '%s'", path, key);
  if (v) rc = tt_st_names_parse(what, v, names, n, err);
  tt_st_close(f);
  return rc;
}

/* ---------------- reading: validation ---------------- */

struct tt_st_file {
  unsigned char *buf;   /* the whole file; opened lazily (tt_st_open_lazy), its first 8 + header bytes */
  size_t size;          /* the file's bytes (lazily too) */
  int fd;               /* lazily: the open file, read by tt_st_read; else -1 */
  uint64_t *off;        /* lazily: [n] each tensor's data offset in the file */
  char *path;           /* lazily: for tt_st_read's messages */
  char *strings;        /* decoded header strings (names, dtypes' copies, metadata) */
  tt_st_tensor *t;
  int n;
  const char **meta;    /* key, value, key, value, ... */
  int nmeta;
  const tt_st_tensor **by_name; /* [n]: the tensors sorted by name, for tt_st_get's binary search */
};

/* qsort order for [begin, end] pairs: by begin only (equal begins are an overlap anyway). */
static int st_cmp_begin(const void *a, const void *b) {
  const uint64_t *x = (const uint64_t *)a, *y = (const uint64_t *)b;
  return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : 0;
}

/* Checks one tensor entry and fills *t; begin/end are returned for the coverage check.
 * e must be an object with exactly dtype, shape and data_offsets; the element count is capped
 * at 2^48 so that count x element size cannot overflow uint64. t->name points into the
 * parser's strings and t->data is left NULL (st_validate fills it once all entries pass).
 * Returns 0, or -1 with err naming the tensor. */
static int st_tensor_entry(const char *path, const st_parser *p, const st_node *e, uint64_t data_size,
                           tt_st_tensor *t, uint64_t *begin, uint64_t *end, tt_err *err) {
  const st_node *dt = NULL, *sh = NULL, *of = NULL;
  const st_dtype *d;
  int c, k;
  uint64_t elems = 1;
  if (e->type != ST_J_OBJ)
    return tt_fail(err, "%s: tensor \"%s\": expected an object with dtype, shape and data_offsets; re-save the file",
                   path, e->key);
  for (c = e->first; c >= 0; c = p->nodes[c].next) {
    const st_node *m = &p->nodes[c];
    if (strcmp(m->key, "dtype") == 0 && !dt) dt = m;
    else if (strcmp(m->key, "shape") == 0 && !sh) sh = m;
    else if (strcmp(m->key, "data_offsets") == 0 && !of) of = m;
    else
      return tt_fail(err, "%s: tensor \"%s\": unexpected or repeated field \"%s\"; the header is not safetensors",
                     path, e->key, m->key);
  }
  if (!dt || !sh || !of)
    return tt_fail(err, "%s: tensor \"%s\": missing %s; the header is incomplete, re-save the file", path, e->key,
                   !dt ? "dtype" : !sh ? "shape" : "data_offsets");
  if (dt->type != ST_J_STR || !(d = st_find_dtype(dt->str)))
    return tt_fail(err, "%s: tensor \"%s\": unknown dtype %s%s%s; supported: F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL",
                   path, e->key, dt->type == ST_J_STR ? "\"" : "", dt->type == ST_J_STR ? dt->str : "(not a string)",
                   dt->type == ST_J_STR ? "\"" : "");
  if (sh->type != ST_J_ARR || sh->count > TT_ST_MAX_DIMS)
    return tt_fail(err, "%s: tensor \"%s\": shape must be an array of at most %d integers", path, e->key,
                   TT_ST_MAX_DIMS);
  memset(t, 0, sizeof *t);
  t->name = e->key;
  t->dtype = d->name;
  t->ndim = sh->count;
  for (c = sh->first, k = 0; c >= 0; c = p->nodes[c].next, k++) {
    const st_node *v = &p->nodes[c];
    if (v->type != ST_J_NUM || !v->is_int || v->ival < 0)
      return tt_fail(err, "%s: tensor \"%s\": shape[%d] is not a non-negative integer", path, e->key, k);
    t->shape[k] = v->ival;
    if (v->ival && elems > UINT64_C(0xFFFFFFFFFFFF) / (uint64_t)v->ival)
      return tt_fail(err, "%s: tensor \"%s\": shape too large", path, e->key);
    elems *= (uint64_t)v->ival;
  }
  if (of->type != ST_J_ARR || of->count != 2 || p->nodes[of->first].type != ST_J_NUM ||
      p->nodes[p->nodes[of->first].next].type != ST_J_NUM || !p->nodes[of->first].is_int ||
      !p->nodes[p->nodes[of->first].next].is_int || p->nodes[of->first].ival < 0 ||
      p->nodes[p->nodes[of->first].next].ival < 0)
    return tt_fail(err, "%s: tensor \"%s\": data_offsets must be [begin, end] with non-negative integers", path,
                   e->key);
  *begin = (uint64_t)p->nodes[of->first].ival;
  *end = (uint64_t)p->nodes[p->nodes[of->first].next].ival;
  if (*begin > *end || *end > data_size)
    return tt_fail(err,
                   "%s: tensor \"%s\": data_offsets [%llu, %llu] out of range of the %llu data bytes "
                   "(truncated or corrupt file); re-save it",
                   path, e->key, (unsigned long long)*begin, (unsigned long long)*end,
                   (unsigned long long)data_size);
  if (*end - *begin != elems * d->size)
    return tt_fail(err, "%s: tensor \"%s\": data_offsets span %llu bytes but %s shape needs %llu; corrupt file",
                   path, e->key, (unsigned long long)(*end - *begin), d->name,
                   (unsigned long long)(elems * d->size));
  t->bytes = (size_t)(*end - *begin);
  return 0;
}

/* qsort order for an array of C strings: strcmp on the strings, not the pointers. */
static int st_cmp_name(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* qsort and bsearch order for tensor pointers: by name. */
static int st_cmp_tensor_name(const void *a, const void *b) {
  return strcmp((*(const tt_st_tensor *const *)a)->name, (*(const tt_st_tensor *const *)b)->name);
}

/* The first name that appears twice among v[0..n), or NULL; sorts v. Sorting keeps a header
 * of a million names from taking a quadratic time to check. */
static const char *st_first_duplicate(const char **v, int n) {
  int i;
  if (n < 2) return NULL;
  qsort((void *)v, (size_t)n, sizeof(char *), st_cmp_name);
  for (i = 1; i < n; i++)
    if (strcmp(v[i - 1], v[i]) == 0) return v[i];
  return NULL;
}

/* Reads the __metadata__ object e into f->meta (sized for all its keys by st_validate);
 * scratch holds as many pointers. */
static int st_metadata(tt_st_file *f, const char *path, const st_parser *p, const st_node *e, const char **scratch,
                       tt_err *err) {
  int m;
  const char *dup;
  if (e->type != ST_J_OBJ) return tt_fail(err, "%s: __metadata__ must be an object of strings; corrupt file", path);
  for (m = e->first; m >= 0; m = p->nodes[m].next) {
    if (p->nodes[m].type != ST_J_STR)
      return tt_fail(err, "%s: __metadata__ value of \"%s\" is not a string; corrupt file", path, p->nodes[m].key);
    f->meta[2 * f->nmeta] = p->nodes[m].key;
    f->meta[2 * f->nmeta + 1] = p->nodes[m].str;
    f->nmeta++;
  }
  for (m = 0; m < f->nmeta; m++) scratch[m] = f->meta[2 * m];
  dup = st_first_duplicate(scratch, f->nmeta);
  if (dup) return tt_fail(err, "%s: __metadata__ key \"%s\" appears twice; corrupt file", path, dup);
  return 0;
}

/* The data must be covered exactly: no overlap, no holes, nothing left over. ranges: [n][2]. */
static int st_check_coverage(const char *path, uint64_t *ranges, int n, uint64_t data_size, tt_err *err) {
  uint64_t at = 0;
  int i;
  qsort(ranges, (size_t)n, 2 * sizeof(uint64_t), st_cmp_begin);
  for (i = 0; i < n; i++) {
    if (ranges[2 * i] != at)
      return tt_fail(err, "%s: tensor data %s at byte %llu (expected %llu); corrupt file", path,
                     ranges[2 * i] < at ? "overlaps" : "has a hole", (unsigned long long)ranges[2 * i],
                     (unsigned long long)at);
    at = ranges[2 * i + 1];
  }
  if (at != data_size)
    return tt_fail(err, "%s: the header describes %llu data bytes but the file has %llu; truncated or corrupt file",
                   path, (unsigned long long)at, (unsigned long long)data_size);
  return 0;
}

/* From the parsed DOM to f's tensor and metadata tables, checking what the JSON grammar
 * cannot: dtypes known, shapes consistent with byte ranges, names unique, ranges inside the
 * data and covering it exactly. On success every f->t[i].data points into f->buf. */
static int st_validate(tt_st_file *f, const char *path, const st_parser *p, int root, uint64_t hlen, tt_err *err) {
  const st_node *r = &p->nodes[root];
  uint64_t data_size = f->size - 8 - hlen;
  uint64_t *ranges = NULL, *begins = NULL; /* ranges: [n][2] begin, end, sorted later; begins: [n] */
  const char **names = NULL;                /* scratch for the duplicate checks */
  int c, i, nt = 0, seen_meta = 0;
  size_t nkeys = 0;
  const char *dup;
  if (r->type != ST_J_OBJ) return tt_fail(err, "%s: safetensors header is not a JSON object; corrupt file", path);
  /* The metadata table holds the keys of __metadata__, not one slot per top-level member: a
   * checkpoint of a small model has more metadata keys than tensors. */
  for (c = r->first; c >= 0; c = p->nodes[c].next)
    if (strcmp(p->nodes[c].key, "__metadata__") == 0 && p->nodes[c].type == ST_J_OBJ)
      nkeys += (size_t)p->nodes[c].count;
  /* one tensor slot per top-level member (one more than the tensors when __metadata__ is
   * among them; + 1 so that an empty header still allocates) */
  f->t = (tt_st_tensor *)tt_calloc((size_t)r->count + 1, sizeof(tt_st_tensor), "safetensors index", err);
  f->meta = (const char **)tt_calloc(nkeys * 2 + 2, sizeof(char *), "safetensors index", err);
  ranges = (uint64_t *)tt_calloc((size_t)r->count + 1, 2 * sizeof(uint64_t), "safetensors index", err);
  begins = (uint64_t *)tt_calloc((size_t)r->count + 1, sizeof(uint64_t), "safetensors index", err);
  names = (const char **)tt_calloc(nkeys + (size_t)r->count + 1, sizeof(char *), "safetensors index", err);
  if (!f->t || !f->meta || !ranges || !begins || !names) goto fail;
  for (c = r->first; c >= 0; c = p->nodes[c].next) {
    const st_node *e = &p->nodes[c];
    if (strcmp(e->key, "__metadata__") == 0) {
      if (seen_meta++) {
        tt_fail(err, "%s: __metadata__ appears twice; corrupt file", path);
        goto fail;
      }
      if (st_metadata(f, path, p, e, names, err) != 0) goto fail;
      continue;
    }
    if (st_tensor_entry(path, p, e, data_size, &f->t[nt], &ranges[2 * nt], &ranges[2 * nt + 1], err) != 0)
      goto fail;
    begins[nt] = ranges[2 * nt];
    nt++;
  }
  f->n = nt;
  for (i = 0; i < nt; i++) names[i] = f->t[i].name;
  dup = st_first_duplicate(names, nt);
  if (dup) {
    tt_fail(err, "%s: tensor \"%s\" appears twice in the header; corrupt file", path, dup);
    goto fail;
  }
  if (st_check_coverage(path, ranges, nt, data_size, err) != 0) goto fail;
  /* begins[] is in header order, while ranges[] was sorted by the coverage check */
  if (f->fd >= 0) { /* lazily: no data in memory, its offsets for tt_st_read */
    if (!(f->off = (uint64_t *)tt_calloc((size_t)nt + 1, sizeof(uint64_t), "safetensors index", err))) goto fail;
    for (i = 0; i < nt; i++) f->off[i] = 8 + hlen + begins[i];
  } else {
    for (i = 0; i < nt; i++) f->t[i].data = f->buf + 8 + hlen + begins[i];
  }
  /* the index by name: a checkpoint of 144,000 tensors looked each one up linearly (issue 40) */
  f->by_name = (const tt_st_tensor **)tt_calloc((size_t)nt + 1, sizeof(tt_st_tensor *), "safetensors index", err);
  if (!f->by_name) goto fail;
  for (i = 0; i < nt; i++) f->by_name[i] = &f->t[i];
  qsort((void *)f->by_name, (size_t)nt, sizeof(tt_st_tensor *), st_cmp_tensor_name);
  free(ranges);
  free(begins);
  free((void *)names);
  return 0;
fail:
  free(ranges);
  free(begins);
  free((void *)names);
  return -1;
}

/* Parses and validates f->buf (f->size bytes, owned by f); `path` names it in messages. */
static int st_parse(tt_st_file *f, const char *path, tt_err *err) {
  st_parser p;
  uint64_t hlen = 0;
  int i, root, rc;
  if (f->size < 8)
    return tt_fail(err, "%s: %zu bytes, too short for a safetensors file (8-byte header length missing); re-save it",
                   path, f->size);
  for (i = 0; i < 8; i++) hlen |= (uint64_t)f->buf[i] << (8 * i);
  /* the length is checked against the bytes actually present before anything is allocated from
   * it: a 16-byte file claiming an 8 EiB header is refused, not attempted */
  if (hlen > f->size - 8)
    return tt_fail(err,
                   "%s: header length %llu exceeds the %zu bytes after it; the file is truncated or not safetensors",
                   path, (unsigned long long)hlen, f->size - 8);
  if (hlen < 2 || hlen > ST_MAX_HEADER)
    return tt_fail(err, "%s: header length %llu is implausible (2 .. %u); not a safetensors file", path,
                   (unsigned long long)hlen, ST_MAX_HEADER);
  memset(&p, 0, sizeof p);
  p.path = path;
  p.begin = p.s = (const char *)f->buf + 8;
  p.end = p.s + hlen;
  p.err = err;
  /* decoded strings never outgrow their encoding, so hlen + 1 bytes hold them all; they stay
   * with f because tensor names and metadata point into them */
  f->strings = (char *)tt_malloc((size_t)hlen + 1, "safetensors header strings", err);
  if (!f->strings) return -1;
  p.sbuf = f->strings;
  root = st_value(&p, 0);
  rc = root < 0 ? -1 : 0;
  if (rc == 0) {
    st_ws(&p);
    if (p.s != p.end) rc = st_perr(&p, "unexpected text after the header object");
  }
  if (rc == 0) rc = st_validate(f, path, &p, root, hlen, err);
  free(p.nodes);
  return rc;
}

/* Takes ownership of data (a tt_malloc'ed buffer of size bytes, freed on failure too). */
static int st_open_owned(const char *path, void *data, size_t size, tt_st_file **out, tt_err *err) {
  tt_st_file *f = (tt_st_file *)tt_calloc(1, sizeof *f, "safetensors file", err);
  if (!f) {
    free(data);
    return -1;
  }
  f->buf = (unsigned char *)data;
  f->size = size;
  f->fd = -1;
  if (st_parse(f, path, err) != 0) {
    tt_st_close(f);
    return -1;
  }
  *out = f;
  return 0;
}

/* Reads the whole file at path into memory and indexes it. On success *out owns the buffer
 * and every tensor's data points into it (valid until tt_st_close); on failure *out is NULL
 * and err names the file and the first problem found. */
int tt_st_open(const char *path, tt_st_file **out, tt_err *err) {
  void *data = NULL;
  size_t size = 0;
  *out = NULL;
  if (tt_read_file(path, &data, &size, err) != 0) return -1;
  return st_open_owned(path, data, size, out, err);
}

/* Reads path's 8-byte length and header only (the data stays on disk) and indexes it with the
 * checks of tt_st_open, the data's ranges against the file's size; tt_st_read fetches a tensor. */
int tt_st_open_lazy(const char *path, tt_st_file **out, tt_err *err) {
  unsigned char len8[8];
  struct stat sb;
  uint64_t hlen = 0;
  *out = NULL;
  int fd = tt_open_regular(path, NULL, err);
  if (fd < 0) return -1;
  tt_st_file *f = (tt_st_file *)tt_calloc(1, sizeof *f, "safetensors file", err);
  if (!f) return close(fd), -1;
  f->fd = fd;
  if (fstat(fd, &sb) != 0) {
    tt_st_close(f);
    return tt_fail(err, "%s: cannot read its size (%s); check the file", path, strerror(errno));
  }
  f->size = (size_t)sb.st_size;
  size_t got = tt_read_full(fd, len8, 8);
  for (int i = 0; got == 8 && i < 8; i++) hlen |= (uint64_t)len8[i] << (8 * i);
  /* only a length st_parse can accept is read; any other is refused there, from the 8 bytes */
  size_t keep = got < 8 || hlen > f->size - 8 || hlen > ST_MAX_HEADER ? got : (size_t)(8 + hlen);
  f->buf = (unsigned char *)tt_malloc(keep + 1, "safetensors header", err);
  f->path = (char *)tt_malloc(strlen(path) + 1, "safetensors path", err);
  if (!f->buf || !f->path) return tt_st_close(f), -1;
  memcpy(f->path, path, strlen(path) + 1);
  memcpy(f->buf, len8, got);
  if (keep > 8 && tt_read_full(fd, f->buf + 8, keep - 8) != keep - 8) {
    tt_st_close(f);
    return tt_fail(err, "%s: its header could not be read whole (%s); check the file", path, strerror(errno));
  }
  if (got < 8) f->size = got; /* st_parse refuses it as too short */
  if (st_parse(f, path, err) != 0) return tt_st_close(f), -1;
  *out = f;
  return 0;
}

/* Copies tensor t's bytes to dst: from memory, or, lazily opened, read from the file at its
 * offset (a file that shrank since it was opened is an error naming it). */
int tt_st_read(tt_st_file *f, const tt_st_tensor *t, void *dst, tt_err *err) {
  if (f->fd < 0) {
    if (t->bytes) memcpy(dst, t->data, t->bytes);
    return 0;
  }
  long long i = t - f->t;
  if (i < 0 || i >= f->n) return tt_fail(err, "%s: internal error: a tensor of another file read", f->path);
  size_t done = 0;
  while (done < t->bytes) {
    ssize_t k = pread(f->fd, (unsigned char *)dst + done, t->bytes - done, (off_t)(f->off[i] + done));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return tt_fail(err, "%s: tensor \"%s\" could not be read (%s); the file changed or shrank since it was opened",
                     f->path, t->name, k < 0 ? strerror(errno) : "end of file");
    done += (size_t)k;
  }
  return 0;
}

/* As tt_st_open, for a file image already in memory: the size bytes at data are copied, so the
 * caller may free data as soon as this returns. name stands for the path in messages. */
int tt_st_open_mem(const char *name, const void *data, size_t size, tt_st_file **out, tt_err *err) {
  void *copy;
  *out = NULL;
  copy = tt_malloc(size + 1, name, err); /* + 1: a zero-byte file still gets a buffer */
  if (!copy) return -1;
  if (size) memcpy(copy, data, size);
  return st_open_owned(name, copy, size, out, err);
}

/* Number of tensors (the __metadata__ entry is not one); 0 for NULL. */
int tt_st_count(const tt_st_file *f) { return f ? f->n : 0; }

/* The i-th tensor in header order (not data order), or NULL when i is out of range. */
const tt_st_tensor *tt_st_at(const tt_st_file *f, int i) { return f && i >= 0 && i < f->n ? &f->t[i] : NULL; }

/* The tensor called name, or NULL: a binary search of the index by name (O(log n)). */
const tt_st_tensor *tt_st_get(const tt_st_file *f, const char *name) {
  tt_st_tensor key;
  const tt_st_tensor *kp = &key, *const *hit;
  if (!f || !name || !f->by_name) return NULL;
  key.name = name;
  hit = (const tt_st_tensor *const *)bsearch(&kp, f->by_name, (size_t)f->n, sizeof(tt_st_tensor *), st_cmp_tensor_name);
  return hit ? *hit : NULL;
}

/* The metadata value stored under key, or NULL; the string lives as long as f. */
const char *tt_st_meta(const tt_st_file *f, const char *key) {
  int i;
  if (!f) return NULL;
  for (i = 0; i < f->nmeta; i++)
    if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
  return NULL;
}

int tt_st_meta_count(const tt_st_file *f) { return f ? f->nmeta : 0; }

/* The i-th metadata pair in header order; 0, or -1 (outputs untouched) when out of range. */
int tt_st_meta_at(const tt_st_file *f, int i, const char **key, const char **value) {
  if (!f || i < 0 || i >= f->nmeta) return -1;
  *key = f->meta[2 * i];
  *value = f->meta[2 * i + 1];
  return 0;
}

/* Frees f and everything it owns: every tensor's data and name pointer dies with it. NULL is
 * a no-op. */
void tt_st_close(tt_st_file *f) {
  if (!f) return;
  if (f->fd >= 0) close(f->fd);
  free(f->off);
  free(f->path);
  free(f->buf);
  free(f->strings);
  free(f->t);
  free((void *)f->meta);
  free((void *)f->by_name);
  free(f);
}
