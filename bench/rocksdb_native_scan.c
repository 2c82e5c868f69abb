/* rocksdb_native_scan: how fast RocksDB itself scans a directory into Arrow-ready buffers (the floor under any binding).
 *
 * Opens DIR read-only with every column family it lists (clink's backend adds "clink.metadata"), iterates the default
 * family from its first key and copies every key and value into contiguous growing buffers plus int32 offsets: exactly
 * the buffers of two Arrow binary arrays. Prints one JSON line per variant: rows, bytes, the seconds of the scan alone
 * (CLOCK_MONOTONIC from read options and iterator creation to the iterator's end; the open, and freeing the buffers,
 * excluded), best of REPEATS runs, each on a freshly opened DB (an empty block cache, as a one-shot export meets it).
 * Written for bench/bench_rocksdb.py, which compiles it into a temp dir when a compiler and librocksdb-dev exist.
 *
 * Build: gcc -O2 -pthread -o rocksdb_native_scan rocksdb_native_scan.c -lrocksdb
 * Usage: rocksdb_native_scan DIR [REPEATS [VARIANT...]] ; VARIANT one of: default no_fill_cache readahead_2m
 *        no_verify_checksums perf_off split_op_id fast (all of them + split_op_id) iterate_only
 *        (no copy: the iteration alone) threads_2 (no_fill_cache, the operators' key ranges over 2 threads, wall
 *        time: threads sharing the block cache contend on its locks); default: all.
 *        rocksdb_native_scan --dump DIR OUT_PREFIX writes OUT_PREFIX.{keys,key_offsets,values,value_offsets} (one scan).
 * split_op_id: the canonical layout's split done in the same pass (8-byte big-endian op_id prefix -> a uint64 column,
 * the rest -> key_bytes), i.e. the three columns of the canonical table. Exit status 1 with a one-line error on failure.
 */
#define _POSIX_C_SOURCE 199309L
#include <pthread.h>
#include <rocksdb/c.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OP_ID_BYTES 8
#define MAX_FAMILIES 64

typedef struct {
    char *data;
    size_t len, cap;
} buf_t;

typedef struct {
    buf_t keys, key_offsets, values, value_offsets, op_ids;
    size_t rows;
} scan_t;

typedef struct {
    const char *name;
    int fill_cache, verify_checksums, split, copy, perf_off;
    size_t readahead;
    int threads;
} variant_t; /* fields in the order of the table below */

static const variant_t VARIANTS[] = {
    /* name                fill verify split copy perf_off readahead threads */
    {"default",             1,   1,     0,    1,   0,       0,        1},
    {"no_fill_cache",       0,   1,     0,    1,   0,       0,        1},
    {"readahead_2m",        1,   1,     0,    1,   0,       2u << 20, 1},
    {"no_verify_checksums", 1,   0,     0,    1,   0,       0,        1},
    {"perf_off",            1,   1,     0,    1,   1,       0,        1}, /* perf level kDisable: no per-key counters */
    {"split_op_id",         1,   1,     1,    1,   0,       0,        1},
    {"fast",                0,   0,     1,    1,   1,       0,        1}, /* every switch that can save time, split too */
    {"iterate_only",        1,   1,     0,    0,   0,       0,        1}, /* no copy: RocksDB's iteration alone */
    {"threads_2",           0,   1,     0,    1,   0,       0,        2}, /* operators' ranges over 2 threads */
};
#define N_VARIANTS (sizeof VARIANTS / sizeof VARIANTS[0])

static void die(const char *what, const char *detail) {
    fprintf(stderr, "rocksdb_native_scan: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(1);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void buf_reserve(buf_t *b, size_t more) {
    if (b->len + more <= b->cap) return;
    size_t cap = b->cap ? b->cap : 1u << 16;
    while (cap < b->len + more) cap *= 2; /* doubling: amortised O(1) per byte, as an Arrow builder grows */
    char *grown = realloc(b->data, cap);
    if (!grown) die("out of memory", NULL);
    b->data = grown;
    b->cap = cap;
}

static inline void buf_put(buf_t *b, const void *src, size_t n) {
    buf_reserve(b, n);
    memcpy(b->data + b->len, src, n);
    b->len += n;
}

static inline void offset_put(buf_t *b, size_t end) {
    if (end > INT32_MAX) die("more than 2 GiB in one binary column (int32 offsets overflow)", NULL);
    int32_t o = (int32_t)end;
    buf_put(b, &o, sizeof o);
}

static void scan_free(scan_t *s) {
    free(s->keys.data), free(s->key_offsets.data), free(s->values.data), free(s->value_offsets.data), free(s->op_ids.data);
    memset(s, 0, sizeof *s);
}

typedef struct {
    rocksdb_t *db;
    rocksdb_options_t *options;
    rocksdb_column_family_handle_t *handles[MAX_FAMILIES];
    size_t n_families, default_index;
} opened_t;

static opened_t open_all(const char *dir) {
    opened_t o;
    memset(&o, 0, sizeof o);
    char *err = NULL;
    o.options = rocksdb_options_create();
    size_t n = 0;
    char **names = rocksdb_list_column_families(o.options, dir, &n, &err);
    if (err) die("cannot list column families", err);
    if (n == 0 || n > MAX_FAMILIES) die("unexpected column family count", NULL);
    const rocksdb_options_t *cf_options[MAX_FAMILIES];
    for (size_t i = 0; i < n; i++) {
        cf_options[i] = o.options;
        if (strcmp(names[i], "default") == 0) o.default_index = i;
    }
    o.db = rocksdb_open_for_read_only_column_families(o.options, dir, (int)n, (const char *const *)names, cf_options,
                                                      o.handles, 0, &err);
    rocksdb_list_column_families_destroy(names, n);
    if (err) die("cannot open read-only", err);
    o.n_families = n;
    return o;
}

static void close_all(opened_t *o) {
    for (size_t i = 0; i < o->n_families; i++) rocksdb_column_family_handle_destroy(o->handles[i]);
    rocksdb_close(o->db);
    rocksdb_options_destroy(o->options);
}

typedef struct {
    opened_t *o;
    const variant_t *v;
    unsigned char lower[OP_ID_BYTES], upper[OP_ID_BYTES];
    int has_lower, has_upper;
    scan_t out;
    char *err;
} range_t;

/* Scan [lower, upper) of the default family into r->out (the key range of some operators, or everything). */
static void *scan_range(void *arg) {
    range_t *r = arg;
    const variant_t *v = r->v;
    scan_t *s = &r->out;
    rocksdb_set_perf_level(v->perf_off ? 1 : 2); /* thread-local; 2 = kEnableCount, RocksDB's default */
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_fill_cache(ro, (unsigned char)v->fill_cache);
    rocksdb_readoptions_set_verify_checksums(ro, (unsigned char)v->verify_checksums);
    if (v->readahead) rocksdb_readoptions_set_readahead_size(ro, v->readahead);
    if (r->has_upper) rocksdb_readoptions_set_iterate_upper_bound(ro, (const char *)r->upper, OP_ID_BYTES);
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(r->o->db, ro, r->o->handles[r->o->default_index]);
    offset_put(&s->key_offsets, 0);
    offset_put(&s->value_offsets, 0);
    if (r->has_lower)
        rocksdb_iter_seek(it, (const char *)r->lower, OP_ID_BYTES);
    else
        rocksdb_iter_seek_to_first(it);
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const char *k = rocksdb_iter_key(it, &klen);
        const char *val = rocksdb_iter_value(it, &vlen);
        if (!v->copy) {
            s->keys.len += klen, s->values.len += vlen, s->rows++; /* keys.data stays NULL: nothing is copied */
            continue;
        }
        if (v->split) {
            if (klen <= OP_ID_BYTES) die("a key is not an 8-byte op_id followed by a state key", NULL);
            uint64_t op = 0;
            for (int i = 0; i < OP_ID_BYTES; i++) op = (op << 8) | (unsigned char)k[i];
            buf_put(&s->op_ids, &op, sizeof op);
            k += OP_ID_BYTES, klen -= OP_ID_BYTES;
        }
        buf_put(&s->keys, k, klen);
        offset_put(&s->key_offsets, s->keys.len);
        buf_put(&s->values, val, vlen);
        offset_put(&s->value_offsets, s->values.len);
        s->rows++;
    }
    rocksdb_iter_get_error(it, &r->err);
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return NULL;
}

static void be64(unsigned char *out, uint64_t x) {
    for (int i = OP_ID_BYTES - 1; i >= 0; i--, x >>= 8) out[i] = (unsigned char)x;
}

/* The op_ids present, ascending, found by seeking past each operator's keys (a few seeks, not a scan). */
static size_t operators_present(opened_t *o, uint64_t *ops, size_t max) {
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->db, ro, o->handles[o->default_index]);
    size_t n = 0;
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it) && n < max;) {
        size_t klen;
        const unsigned char *k = (const unsigned char *)rocksdb_iter_key(it, &klen);
        if (klen < OP_ID_BYTES) die("a key is not an 8-byte op_id followed by a state key", NULL);
        uint64_t op = 0;
        for (int i = 0; i < OP_ID_BYTES; i++) op = (op << 8) | k[i];
        ops[n++] = op;
        if (op == UINT64_MAX) break;
        unsigned char next[OP_ID_BYTES];
        be64(next, op + 1);
        rocksdb_iter_seek(it, (const char *)next, OP_ID_BYTES);
    }
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return n;
}

/* One scan of the default family; s gets the totals (and, single-threaded, the buffers). Returns the scan's seconds. */
static double scan_once(opened_t *o, const variant_t *v, scan_t *s) {
    double started = now_s();
    if (v->threads <= 1) {
        range_t r = {.o = o, .v = v};
        scan_range(&r);
        double elapsed = now_s() - started;
        if (r.err) die("scan failed", r.err);
        *s = r.out;
        return elapsed;
    }
    /* threads: each takes a contiguous run of operators (the canonical layout's natural split), its own buffers */
    uint64_t ops[256];
    size_t n_ops = operators_present(o, ops, 256);
    size_t n = (size_t)v->threads < n_ops ? (size_t)v->threads : (n_ops ? n_ops : 1);
    range_t ranges[16];
    pthread_t tids[16];
    memset(ranges, 0, sizeof ranges);
    for (size_t t = 0; t < n; t++) {
        size_t first = t * n_ops / n, last = (t + 1) * n_ops / n; /* operators [first, last) */
        ranges[t].o = o, ranges[t].v = v;
        if (t > 0) ranges[t].has_lower = 1, be64(ranges[t].lower, ops[first]);
        if (t + 1 < n) ranges[t].has_upper = 1, be64(ranges[t].upper, ops[last]);
        if (pthread_create(&tids[t], NULL, scan_range, &ranges[t]) != 0) die("cannot start a thread", NULL);
    }
    for (size_t t = 0; t < n; t++) pthread_join(tids[t], NULL);
    double elapsed = now_s() - started;
    for (size_t t = 0; t < n; t++) {
        if (ranges[t].err) die("scan failed", ranges[t].err);
        s->rows += ranges[t].out.rows;
        s->keys.len += ranges[t].out.keys.len, s->values.len += ranges[t].out.values.len;
        s->op_ids.len += ranges[t].out.op_ids.len;
        scan_free(&ranges[t].out);
    }
    return elapsed;
}

static void write_file(const char *prefix, const char *suffix, const buf_t *b) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%s", prefix, suffix);
    FILE *f = fopen(path, "wb");
    if (!f || (b->len && fwrite(b->data, 1, b->len, f) != b->len) || fclose(f) != 0) die("cannot write", path);
}

static const variant_t *find_variant(const char *name) {
    for (size_t i = 0; i < N_VARIANTS; i++)
        if (strcmp(VARIANTS[i].name, name) == 0) return &VARIANTS[i];
    die("unknown variant (default no_fill_cache readahead_2m no_verify_checksums perf_off split_op_id fast iterate_only threads_2)", name);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--dump") == 0) {
        opened_t o = open_all(argv[2]);
        scan_t s;
        memset(&s, 0, sizeof s);
        scan_once(&o, &VARIANTS[0], &s);
        write_file(argv[3], "keys", &s.keys);
        write_file(argv[3], "key_offsets", &s.key_offsets);
        write_file(argv[3], "values", &s.values);
        write_file(argv[3], "value_offsets", &s.value_offsets);
        printf("{\"rows\": %zu}\n", s.rows);
        scan_free(&s);
        close_all(&o);
        return 0;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [REPEATS [VARIANT...]] | --dump DIR OUT_PREFIX\n", argv[0]);
        return 2;
    }
    int repeats = argc > 2 ? atoi(argv[2]) : 3;
    if (repeats < 1) die("REPEATS must be at least 1", argv[2]);
    const variant_t *chosen[N_VARIANTS * 4];
    size_t n_chosen = 0;
    for (int i = 3; i < argc && n_chosen < N_VARIANTS * 4; i++) chosen[n_chosen++] = find_variant(argv[i]);
    if (n_chosen == 0)
        for (size_t i = 0; i < N_VARIANTS; i++) chosen[n_chosen++] = &VARIANTS[i];
    for (size_t c = 0; c < n_chosen; c++) {
        double best = 1e300, best_open = 1e300;
        size_t rows = 0, bytes = 0;
        for (int r = 0; r < repeats; r++) {
            double opening = now_s();
            opened_t o = open_all(argv[1]); /* fresh per run: an empty block cache, as a one-shot export meets it */
            opening = now_s() - opening;
            scan_t s;
            memset(&s, 0, sizeof s);
            double t = scan_once(&o, chosen[c], &s);
            rows = s.rows;
            bytes = s.keys.len + s.values.len + s.op_ids.len;
            scan_free(&s);
            close_all(&o);
            if (t < best) best = t;
            if (opening < best_open) best_open = opening;
        }
        printf("{\"variant\": \"%s\", \"rows\": %zu, \"bytes\": %zu, \"scan_s\": %.6f, \"open_s\": %.6f, \"repeats\": %d}\n",
               chosen[c]->name, rows, bytes, best, best_open, repeats);
        fflush(stdout);
    }
    return 0;
}
