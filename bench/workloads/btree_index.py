"""An in-memory B-tree index build, as a database builds one on a column of random keys:
insertions in random order into a B-tree of order 64 (plain Python lists, so its nodes
live in the interpreter's 1 MiB arenas, which `attune run` manages), then point lookups
and a range scan. Scattered accesses over the whole tree: the pattern where a fixed large
transfer unit moves mostly what is not used (issue 28).

Usage: python3 btree_index.py N_KEYS   (prints "btree_index: OK <checksum>")
"""
import bisect
import random
import sys

ORDER = 64


class Node:
    __slots__ = ("keys", "vals", "kids")

    def __init__(self, leaf):
        self.keys = []
        self.vals = []
        self.kids = None if leaf else []


def split(parent, i):
    full = parent.kids[i]
    mid = len(full.keys) // 2
    right = Node(full.kids is None)
    right.keys, full.keys, k = full.keys[mid + 1:], full.keys[:mid], full.keys[mid]
    right.vals, full.vals, v = full.vals[mid + 1:], full.vals[:mid], full.vals[mid]
    if full.kids is not None:
        right.kids, full.kids = full.kids[mid + 1:], full.kids[:mid + 1]
    parent.keys.insert(i, k)
    parent.vals.insert(i, v)
    parent.kids.insert(i + 1, right)


def insert(root, k, v):
    if len(root.keys) == 2 * ORDER - 1:
        top = Node(False)
        top.kids.append(root)
        split(top, 0)
        root = top
    n = root
    while True:
        i = bisect.bisect_left(n.keys, k)
        if i < len(n.keys) and n.keys[i] == k:
            n.vals[i] = v
            return root
        if n.kids is None:
            n.keys.insert(i, k)
            n.vals.insert(i, v)
            return root
        if len(n.kids[i].keys) == 2 * ORDER - 1:
            split(n, i)
            if k > n.keys[i]:
                i += 1
            elif k == n.keys[i]:
                n.vals[i] = v
                return root
        n = n.kids[i]


def find(root, k):
    n = root
    while n is not None:
        i = bisect.bisect_left(n.keys, k)
        if i < len(n.keys) and n.keys[i] == k:
            return n.vals[i]
        n = None if n.kids is None else n.kids[i]
    return None


def scan(n, lo, hi, out):
    i = bisect.bisect_left(n.keys, lo)
    while True:
        if n.kids is not None and i < len(n.kids):
            scan(n.kids[i], lo, hi, out)
        if i >= len(n.keys) or n.keys[i] > hi:
            return
        out.append(n.vals[i])
        i += 1


def main():
    count = int(sys.argv[1])
    rnd = random.Random(42)
    keys = rnd.sample(range(count * 8), count)
    root = Node(True)
    for k in keys:
        # Rows: the key's record as a database row would carry it (a tuple and a string).
        root = insert(root, k, (k, f"row-{k:012d}"))
    check = 0
    for k in rnd.sample(keys, min(count, 200_000)):
        row = find(root, k)
        if row is None or row[0] != k:
            sys.exit(f"btree_index: lookup of {k} failed")
        check = (check * 31 + row[0]) % (1 << 61)
    ordered = sorted(keys)
    lo, hi = ordered[count // 3], ordered[count // 3 + 50_000]
    rows = []
    scan(root, lo, hi, rows)
    if [r[0] for r in rows] != ordered[count // 3: count // 3 + 50_001]:
        sys.exit("btree_index: range scan wrong")
    print(f"btree_index: OK {check}")


if __name__ == "__main__":
    main()
