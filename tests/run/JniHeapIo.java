/* The JVM's heap handed to the kernel by a JNI library (an `attune run` test): arrays in
 * the collected heap, which `attune run` tiers with signal delivery under `auto`, are
 * written to a file and read back through GetPrimitiveArrayCritical pointers with
 * pwrite/pread and write/read, after the program went on to fill more than the budget
 * (so most of them are in a far tier when the kernel touches them). Every call must
 * move every byte (no EFAULT, no short count left), and every array read back must have
 * the checksum of the one written. Usage: java -Djni.lib=PATH JniHeapIo MIB */
import java.util.zip.CRC32;

public class JniHeapIo {
    static { System.load(System.getProperty("jni.lib")); }

    /** A file opened read-write and unlinked at once: its descriptor, or -errno. */
    static native int openScratch(String path);
    /** pwrite (positional) or write after lseek (`positional` false) of the whole array at
     *  `off` through a critical pointer: the bytes moved, or -errno. */
    static native long put(int fd, byte[] a, long off, boolean positional);
    /** The same with pread or read. */
    static native long get(int fd, byte[] a, long off, boolean positional);

    static final int LEN = 1 << 20;

    static long mix(long x) { x ^= x >>> 31; x *= 0x9E3779B97F4A7C15L; return x ^ (x >>> 29); }

    static long crc(byte[] a) { CRC32 c = new CRC32(); c.update(a); return c.getValue(); }

    public static void main(String[] args) {
        int n = Integer.parseInt(args[0]);
        String dir = System.getProperty("java.io.tmpdir");
        int fd = openScratch(dir + "/jni_heap_io." + ProcessHandle.current().pid());
        if (fd < 0) { System.out.println("JniHeapIo: cannot open a scratch file: errno " + -fd); System.exit(1); }
        byte[][] a = new byte[n][];
        long[] sums = new long[n];
        for (int i = 0; i < n; i++) {
            a[i] = new byte[LEN];
            for (int j = 0; j < LEN; j += 8) {
                long v = mix(((long) i << 32) + j);
                for (int k = 0; k < 8; k++) a[i][j + k] = (byte) (v >>> (8 * k));
            }
            sums[i] = crc(a[i]);
        }
        // The first arrays were filled longest ago: the kernel reads them from far pages.
        for (int i = 0; i < n; i++) {
            long w = put(fd, a[i], (long) i * LEN, i % 2 == 0);
            if (w != LEN) { System.out.println("JniHeapIo: write of array " + i + " gave " + w); System.exit(1); }
        }
        a = null;
        byte[][] b = new byte[n][];
        for (int i = 0; i < n; i++) b[i] = new byte[LEN];
        // Fresh arrays, the first ones far again once the last are allocated: the kernel
        // writes into pages that are not resident.
        for (int i = 0; i < n; i++) {
            long r = get(fd, b[i], (long) i * LEN, i % 2 == 1);
            if (r != LEN) { System.out.println("JniHeapIo: read of array " + i + " gave " + r); System.exit(1); }
        }
        for (int i = 0; i < n; i++)
            if (crc(b[i]) != sums[i]) { System.out.println("JniHeapIo: BAD array " + i); System.exit(1); }
        System.out.println("JniHeapIo: OK " + n + " MiB written and read back through JNI critical pointers");
    }
}
