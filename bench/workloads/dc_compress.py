"""DC: compression of generated files with zstd and a long window (compute- and data-
intensive; the window and the data are large: CAP). Files are built in memory from
repeated records with noise (so the long window finds matches far apart), compressed,
decompressed and compared by hash.

Usage: python3 dc_compress.py MiB
"""
import hashlib
import sys
import time

import numpy as np
import zstandard as zstd

mib = int(sys.argv[1]) if len(sys.argv) > 1 else 128
rng = np.random.default_rng(3)
block = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
files = []
for f in range(4):
    parts = []
    for i in range(mib // 4):
        b = bytearray(block)
        noise = rng.integers(0, len(b), 4096)
        for p in noise[:64]:
            b[p] = (b[p] + f + i) % 256
        parts.append(bytes(b))
    files.append(b"".join(parts))
t0 = time.perf_counter()
params = zstd.ZstdCompressionParameters.from_level(3, window_log=27, enable_ldm=True)
comp = [zstd.ZstdCompressor(compression_params=params).compress(x) for x in files]
dctx = zstd.ZstdDecompressor(max_window_size=1 << 27)
back = [dctx.decompress(c, max_output_size=len(x)) for c, x in zip(comp, files)]
secs = time.perf_counter() - t0
ok = all(hashlib.sha256(a).digest() == hashlib.sha256(b).digest() for a, b in zip(files, back))
ratio = sum(map(len, files)) / sum(map(len, comp))
print(f"RESULT dc {'OK' if ok else 'BAD'} seconds={secs:.4f} ratio={ratio:.1f}")
sys.exit(0 if ok else 1)
