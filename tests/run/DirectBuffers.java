// attune run test: the JVM. Its heap is reserved with PROT_NONE and committed in place
// (MAP_FIXED), which the interposer leaves to the kernel; direct ByteBuffers come from
// malloc and are managed. Fills buffers larger than the budget and verifies them.
import java.nio.ByteBuffer;

public class DirectBuffers {
    static long mix(long x) { x ^= x >>> 31; x *= 0x9E3779B97F4A7C15L; return x ^ (x >>> 29); }

    public static void main(String[] args) {
        int mib = args.length > 0 ? Integer.parseInt(args[0]) : 96;
        int count = mib / 16;
        ByteBuffer[] bufs = new ByteBuffer[count];
        for (int b = 0; b < count; b++) {
            bufs[b] = ByteBuffer.allocateDirect(16 << 20);
            for (int i = 0; i < (16 << 20) / 8; i++) bufs[b].putLong(i * 8, mix(i + (long) b << 32));
        }
        for (int b = 0; b < count; b++)
            for (int i = 0; i < (16 << 20) / 8; i += 97)
                if (bufs[b].getLong(i * 8) != mix(i + (long) b << 32)) { System.out.println("DirectBuffers: BAD"); System.exit(1); }
        System.out.println("DirectBuffers: OK " + count);
    }
}
