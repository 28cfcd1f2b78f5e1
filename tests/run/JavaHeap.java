/* The JVM's own heap under `attune run`: the JVM reserves it PROT_NONE and commits it in
 * place with MAP_FIXED, decommits it the same way when it shrinks, and maps its archived
 * heap over committed regions. Arrays of MIB MiB in all are filled, read back at random
 * and checked; then ROUNDS rounds of garbage with System.gc() in between (with a small
 * -XX:MaxHeapFreeRatio the heap shrinks and grows again), each round's arrays checked.
 * Usage: java JavaHeap MIB ROUNDS */
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

public class JavaHeap {
    static long expect(int i, int j) { return (long) i * 1_000_003L + j; }

    public static void main(String[] args) throws Exception {
        int mib = Integer.parseInt(args[0]), rounds = Integer.parseInt(args[1]);
        int len = 1 << 17; // 1 MiB of longs
        List<long[]> live = new ArrayList<>();
        for (int i = 0; i < mib; i++) {
            long[] a = new long[len];
            for (int j = 0; j < len; j++) a[j] = expect(i, j);
            live.add(a);
        }
        Random r = new Random(42);
        for (int k = 0; k < 200_000; k++) {
            int i = r.nextInt(mib), j = r.nextInt(len);
            if (live.get(i)[j] != expect(i, j)) {
                System.out.println("JavaHeap: BAD at " + i + "," + j);
                System.exit(1);
            }
        }
        live = null;
        for (int round = 0; round < rounds; round++) {
            List<int[]> g = new ArrayList<>();
            for (int i = 0; i < mib / 2; i++) {
                int[] a = new int[1 << 18];
                java.util.Arrays.fill(a, round * 100_000 + i);
                g.add(a);
            }
            for (int i = 0; i < g.size(); i++)
                for (int j = 0; j < (1 << 18); j += 4096)
                    if (g.get(i)[j] != round * 100_000 + i) {
                        System.out.println("JavaHeap: BAD in round " + round);
                        System.exit(1);
                    }
            g = null;
            System.gc();
        }
        System.out.println("JavaHeap: OK " + mib + " MiB, " + rounds + " rounds");
    }
}
