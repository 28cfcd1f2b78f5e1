/* An in-memory B-tree index build, as a database builds one on a column of random keys:
 * its pages (4 KiB nodes) come from a page pool carved out of 64 MiB slabs, as a
 * database's buffer pool does, and keys arrive in random order, so every insertion walks
 * and splits pages all over the tree. Then point lookups and a range scan, checked.
 * Scattered accesses over the whole index: the pattern where a fixed large transfer unit
 * moves mostly what is not used (issue 28).
 *
 *   btree_index N_KEYS      prints "btree_index: OK <checksum>"
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE 4096
/* Keys and values of 8 bytes, children of 4 bytes (page numbers): (PAGE - 8) / 20. */
#define MAXK 204
#define SLAB (64u << 20)

typedef struct {
    uint16_t n, leaf;
    uint32_t pad;
    uint64_t key[MAXK];
    uint64_t val[MAXK];
    uint32_t kid[MAXK + 1];
} node;

_Static_assert(sizeof(node) <= PAGE, "node fits a page");

static char **slabs;
static size_t nslabs, used;

static uint32_t new_page(int leaf) {
    size_t per = SLAB / PAGE;
    if (used % per == 0) {
        slabs = realloc(slabs, (nslabs + 1) * sizeof *slabs);
        slabs[nslabs] = malloc(SLAB);
        if (!slabs || !slabs[nslabs]) {
            perror("malloc");
            exit(2);
        }
        nslabs++;
    }
    uint32_t p = (uint32_t)used++;
    node *x = (node *)(slabs[p / per] + (size_t)(p % per) * PAGE);
    x->n = 0;
    x->leaf = (uint16_t)leaf;
    return p;
}

static node *at(uint32_t p) { return (node *)(slabs[p / (SLAB / PAGE)] + (size_t)(p % (SLAB / PAGE)) * PAGE); }

static int lower(const node *x, uint64_t k) {
    int lo = 0, hi = x->n;
    while (lo < hi) {
        int m = (lo + hi) / 2;
        if (x->key[m] < k) lo = m + 1; else hi = m;
    }
    return lo;
}

static void split(node *parent, int i) {
    uint32_t fp = parent->kid[i];
    node *full = at(fp);
    uint32_t rp = new_page(full->leaf);
    node *right = at(rp);
    full = at(fp);
    int mid = full->n / 2;
    right->n = (uint16_t)(full->n - mid - 1);
    memcpy(right->key, full->key + mid + 1, right->n * 8);
    memcpy(right->val, full->val + mid + 1, right->n * 8);
    if (!full->leaf) memcpy(right->kid, full->kid + mid + 1, (right->n + 1) * 4);
    memmove(parent->key + i + 1, parent->key + i, (parent->n - i) * 8);
    memmove(parent->val + i + 1, parent->val + i, (parent->n - i) * 8);
    memmove(parent->kid + i + 2, parent->kid + i + 1, (parent->n - i) * 4);
    parent->key[i] = full->key[mid];
    parent->val[i] = full->val[mid];
    parent->kid[i + 1] = rp;
    parent->n++;
    full->n = (uint16_t)mid;
}

static uint32_t root;

static void insert(uint64_t k, uint64_t v) {
    if (at(root)->n == MAXK) {
        uint32_t t = new_page(0);
        at(t)->kid[0] = root;
        split(at(t), 0);
        root = t;
    }
    node *x = at(root);
    for (;;) {
        int i = lower(x, k);
        if (i < x->n && x->key[i] == k) {
            x->val[i] = v;
            return;
        }
        if (x->leaf) {
            memmove(x->key + i + 1, x->key + i, (x->n - i) * 8);
            memmove(x->val + i + 1, x->val + i, (x->n - i) * 8);
            x->key[i] = k;
            x->val[i] = v;
            x->n++;
            return;
        }
        if (at(x->kid[i])->n == MAXK) {
            split(x, i);
            if (k == x->key[i]) {
                x->val[i] = v;
                return;
            }
            if (k > x->key[i]) i++;
        }
        x = at(x->kid[i]);
    }
}

static int find(uint64_t k, uint64_t *v) {
    node *x = at(root);
    for (;;) {
        int i = lower(x, k);
        if (i < x->n && x->key[i] == k) {
            *v = x->val[i];
            return 1;
        }
        if (x->leaf) return 0;
        x = at(x->kid[i]);
    }
}

/* In-order from the first key >= lo, up to count keys: their sum and how many. */
static void scan(uint32_t p, uint64_t lo, long *left, uint64_t *sum, uint64_t *last, int *ordered) {
    node *x = at(p);
    for (int i = lower(x, lo); i <= x->n && *left > 0; i++) {
        if (!x->leaf) scan(x->kid[i], lo, left, sum, last, ordered);
        if (i == x->n || *left <= 0) break;
        if (x->key[i] < *last) *ordered = 0;
        *last = x->key[i];
        *sum += x->val[i];
        (*left)--;
    }
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static uint64_t value_of(uint64_t k) { return k * 0xD6E8FEB86659FD93ull ^ 0x5bd1e995; }

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: btree_index N_KEYS\n");
        return 2;
    }
    long n = atol(argv[1]);
    root = new_page(1);
    uint64_t seed = rng;
    for (long i = 0; i < n; i++) {
        uint64_t k = next() >> 1;
        insert(k, value_of(k));
    }
    /* Lookups of keys that are in (the same sequence again) and of keys that are not. */
    rng = seed;
    uint64_t check = 0, v;
    for (long i = 0; i < n; i++) {
        uint64_t k = next() >> 1;
        if (i % 5 != 0) continue;
        if (!find(k, &v) || v != value_of(k)) {
            printf("btree_index: lookup of %llu failed\n", (unsigned long long)k);
            return 1;
        }
        check = check * 31 + v;
        if (find(k | (1ull << 63), &v)) {
            printf("btree_index: found a key never inserted\n");
            return 1;
        }
    }
    long left = n / 10;
    uint64_t sum = 0, last = 0;
    int ordered = 1;
    scan(root, 1ull << 61, &left, &sum, &last, &ordered);
    if (!ordered) {
        printf("btree_index: range scan out of order\n");
        return 1;
    }
    printf("btree_index: OK %llu %llu pages %zu\n", (unsigned long long)check, (unsigned long long)sum, used);
    return 0;
}
