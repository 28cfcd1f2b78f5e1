"""getrandom(3) into managed memory under `attune run`: fresh pages (os.urandom's new
buffer) and pages the budget has moved to a far tier (a written bytearray, refilled in
place through ctypes). Each filled buffer must hold random bytes, read the same twice."""
import ctypes
import hashlib
import os
import sys

MIB = 1 << 20
size = int(sys.argv[1]) * MIB if len(sys.argv) > 1 else 64 * MIB

fresh = os.urandom(size)
assert len(fresh) == size
assert fresh.count(0) < size // 128, "os.urandom left zeros"

buf = bytearray(b"\x01" * size)  # written whole: most of it goes far under the budget
libc = ctypes.CDLL(None, use_errno=True)
libc.getrandom.restype = ctypes.c_ssize_t
libc.getrandom.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
base = ctypes.addressof((ctypes.c_char * size).from_buffer(buf))
done = 0
while done < size:
    n = libc.getrandom(base + done, size - done, 0)
    if n < 0:
        sys.exit(f"getrandom: {os.strerror(ctypes.get_errno())} at byte {done}")
    done += n
assert buf.count(1) < size // 128, "getrandom left the old bytes"
assert hashlib.sha256(buf).digest() == hashlib.sha256(bytes(buf)).digest()
print("getrandom: OK", size // MIB, "MiB fresh and far")
