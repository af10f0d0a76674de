// Benchmark peer for `zkguard bench`: Apache Curator's InterProcessMutex, measured the same way.
//
// Usage: java CuratorBench --zk HOST:PORT[,...] [--iterations N] [--contenders N] [--monitors N]
//                          [--warmup N] [--server-pid PID] [--json]
// Prints one JSON object:
//   {"backend":"curator", "iterations":N, "contenders":C, "monitors":M,
//    "uncontended":{"p50_ms":..,"p99_ms":..,"requests_per_cycle":..,"cpu_ms_per_cycle":..,
//                   "server_cpu_ms_per_cycle":..},
//    "contended":{"handoffs_per_sec":..,"requests_per_handoff":..,"cpu_ms_per_handoff":..,
//                 "server_cpu_ms_per_handoff":..},
//    "throughput":{"ops_per_sec":..,"requests_per_op":..,"cpu_ms_per_op":..,"server_cpu_ms_per_op":..}}
// (the server_cpu figures are null without --server-pid)
//
// - uncontended: one client acquires and releases one reused lock path, N cycles after a warm-up;
//   latency of a whole cycle (acquire + release). requests_per_cycle is the growth of the server's
//   zk_packets_received (four-letter word `mntr`) during those N cycles, divided by N.
//   cpu_ms_per_cycle (and cpu_ms_per_handoff below) is the user + system CPU time of this JVM
//   process (OperatingSystemMXBean.getProcessCpuTime) over those cycles, divided by N.
// - contended: C clients (one session each, one thread each) acquire and release ONE lock path
//   until N hand-offs happened in total; hand-offs per second. requests_per_handoff is the growth
//   of zk_packets_received during those N hand-offs (all clients' requests), divided by N.
// - throughput: C clients over M lock paths (each operation picks a path at random) until N
//   acquire/release operations happened in total; operations per second, with its requests and
//   this JVM's CPU time per operation counted as above.
// - server_cpu_ms_*: with --server-pid, the user + system CPU time of that process (the
//   ZooKeeper server; /proc/PID/stat, Linux) over the same cycles, divided by their number.

import java.io.ByteArrayOutputStream;
import java.lang.management.ManagementFactory;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.ExponentialBackoffRetry;

public final class CuratorBench {
    private static final int SESSION_TIMEOUT_MS = 30_000;
    private static final int CONNECT_TIMEOUT_MS = 15_000;
    private static final long LOCK_TIMEOUT_S = 60;

    public static void main(String[] args) throws Exception {
        String zk = null;
        int iterations = 1000;
        int contenders = 4;
        int monitors = 8;
        int warmup = -1;
        long serverPid = -1;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--zk": zk = args[++i]; break;
                case "--iterations": iterations = Integer.parseInt(args[++i]); break;
                case "--contenders": contenders = Integer.parseInt(args[++i]); break;
                case "--monitors": monitors = Integer.parseInt(args[++i]); break;
                case "--warmup": warmup = Integer.parseInt(args[++i]); break;
                case "--server-pid": serverPid = Long.parseLong(args[++i]); break;
                case "--json": break;
                default:
                    System.err.println("CuratorBench: unknown argument " + args[i]
                        + "; use --zk HOST:PORT --iterations N --contenders N --monitors N [--warmup N]");
                    System.exit(64);
            }
        }
        if (zk == null || iterations < 1 || contenders < 1 || monitors < 1) {
            System.err.println("CuratorBench: --zk is required; counts must be at least 1");
            System.exit(64);
        }
        if (warmup < 0) {
            warmup = Math.max(50, iterations / 5);
        }
        String base = "/zkguard-bench/curator-" + System.currentTimeMillis();

        // --- uncontended ---
        double p50;
        double p99;
        double requestsPerCycle;
        double cpuMsPerCycle;
        Double serverCpuMsPerCycle;
        CuratorFramework solo = client(zk);
        try {
            InterProcessMutex lock = new InterProcessMutex(solo, base + "/uncontended");
            for (int i = 0; i < warmup; i++) {
                cycle(lock);
            }
            long[] nanos = new long[iterations];
            long before = packetsReceived(zk);
            long cpuBefore = cpuNanos();
            long serverBefore = serverCpuNanos(serverPid);
            for (int i = 0; i < iterations; i++) {
                long t0 = System.nanoTime();
                cycle(lock);
                nanos[i] = System.nanoTime() - t0;
            }
            cpuMsPerCycle = (cpuNanos() - cpuBefore) / 1e6 / iterations;
            serverCpuMsPerCycle = perCycleMs(serverBefore, serverCpuNanos(serverPid), iterations);
            long after = packetsReceived(zk);
            Arrays.sort(nanos);
            p50 = percentile(nanos, 0.50) / 1e6;
            p99 = percentile(nanos, 0.99) / 1e6;
            requestsPerCycle = (double) (after - before) / iterations;
        } finally {
            solo.close();
        }

        // --- contended and throughput ---
        List<CuratorFramework> clients = new ArrayList<>();
        try {
            for (int i = 0; i < contenders; i++) {
                clients.add(client(zk));
            }
            // Warm up every client on the paths it will use.
            run(clients, 1, base + "/contended", Math.min(warmup, 20 * contenders));
            long handoffBefore = packetsReceived(zk);
            long cpuBefore = cpuNanos();
            long serverBefore = serverCpuNanos(serverPid);
            double handoffs = run(clients, 1, base + "/contended", iterations);
            double cpuMsPerHandoff = (cpuNanos() - cpuBefore) / 1e6 / iterations;
            Double serverCpuMsPerHandoff = perCycleMs(serverBefore, serverCpuNanos(serverPid), iterations);
            double requestsPerHandoff = (double) (packetsReceived(zk) - handoffBefore) / iterations;
            run(clients, monitors, base + "/throughput", Math.min(warmup, 20 * contenders));
            long opsBefore = packetsReceived(zk);
            cpuBefore = cpuNanos();
            serverBefore = serverCpuNanos(serverPid);
            double ops = run(clients, monitors, base + "/throughput", iterations);
            double cpuMsPerOp = (cpuNanos() - cpuBefore) / 1e6 / iterations;
            Double serverCpuMsPerOp = perCycleMs(serverBefore, serverCpuNanos(serverPid), iterations);
            double requestsPerOp = (double) (packetsReceived(zk) - opsBefore) / iterations;

            System.out.println(String.format(Locale.ROOT,
                "{\"backend\":\"curator\",\"iterations\":%d,\"contenders\":%d,\"monitors\":%d,"
                    + "\"uncontended\":{\"p50_ms\":%.4f,\"p99_ms\":%.4f,\"requests_per_cycle\":%.2f,"
                    + "\"cpu_ms_per_cycle\":%.4f,\"server_cpu_ms_per_cycle\":%s},"
                    + "\"contended\":{\"handoffs_per_sec\":%.1f,\"requests_per_handoff\":%.2f,"
                    + "\"cpu_ms_per_handoff\":%.4f,\"server_cpu_ms_per_handoff\":%s},"
                    + "\"throughput\":{\"ops_per_sec\":%.1f,\"requests_per_op\":%.2f,"
                    + "\"cpu_ms_per_op\":%.4f,\"server_cpu_ms_per_op\":%s}}",
                iterations, contenders, monitors, p50, p99, requestsPerCycle, cpuMsPerCycle,
                json(serverCpuMsPerCycle), handoffs, requestsPerHandoff, cpuMsPerHandoff,
                json(serverCpuMsPerHandoff), ops, requestsPerOp, cpuMsPerOp, json(serverCpuMsPerOp)));
        } finally {
            for (CuratorFramework c : clients) {
                c.close();
            }
        }
    }

    private static CuratorFramework client(String zk) throws InterruptedException {
        CuratorFramework c = CuratorFrameworkFactory.newClient(
            zk, SESSION_TIMEOUT_MS, CONNECT_TIMEOUT_MS, new ExponentialBackoffRetry(100, 3));
        c.start();
        if (!c.blockUntilConnected(CONNECT_TIMEOUT_MS, TimeUnit.MILLISECONDS)) {
            throw new IllegalStateException("could not connect to ZooKeeper at " + zk);
        }
        return c;
    }

    private static void cycle(InterProcessMutex lock) throws Exception {
        if (!lock.acquire(LOCK_TIMEOUT_S, TimeUnit.SECONDS)) {
            throw new IllegalStateException("lock not acquired within " + LOCK_TIMEOUT_S + " s");
        }
        lock.release();
    }

    /**
     * Every client runs in its own thread, acquiring and releasing one of `paths` lock paths
     * (picked at random per operation when there are several) until `total` operations have
     * completed in all. Returns operations per second.
     */
    private static double run(List<CuratorFramework> clients, int paths, String prefix, int total)
            throws Exception {
        AtomicLong remaining = new AtomicLong(total);
        AtomicReference<Throwable> failure = new AtomicReference<>();
        CountDownLatch ready = new CountDownLatch(clients.size());
        CountDownLatch go = new CountDownLatch(1);
        List<Thread> threads = new ArrayList<>();
        for (CuratorFramework c : clients) {
            InterProcessMutex[] locks = new InterProcessMutex[paths];
            for (int p = 0; p < paths; p++) {
                locks[p] = new InterProcessMutex(c, paths == 1 ? prefix : prefix + "/m" + p);
            }
            Thread t = new Thread(() -> {
                try {
                    ready.countDown();
                    go.await();
                    while (remaining.getAndDecrement() > 0) {
                        InterProcessMutex lock = paths == 1
                            ? locks[0] : locks[ThreadLocalRandom.current().nextInt(paths)];
                        cycle(lock);
                    }
                } catch (Throwable e) {
                    failure.compareAndSet(null, e);
                    remaining.set(0);
                }
            });
            threads.add(t);
            t.start();
        }
        ready.await();
        long t0 = System.nanoTime();
        go.countDown();
        for (Thread t : threads) {
            t.join();
        }
        long elapsed = System.nanoTime() - t0;
        if (failure.get() != null) {
            throw new IllegalStateException("a contender failed", failure.get());
        }
        return total / (elapsed / 1e9);
    }

    /** User + system CPU time of this JVM process (all threads, JIT and GC included), in ns. */
    private static long cpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean)
            ManagementFactory.getOperatingSystemMXBean()).getProcessCpuTime();
    }

    /**
     * User + system CPU time of process `pid` (the ZooKeeper server) from /proc/PID/stat, in ns;
     * -1 without a pid or when it cannot be read.
     */
    private static long serverCpuNanos(long pid) {
        if (pid < 0) {
            return -1;
        }
        try {
            String stat = new String(java.nio.file.Files.readAllBytes(
                java.nio.file.Paths.get("/proc/" + pid + "/stat")), StandardCharsets.US_ASCII);
            // The command name (field 2) may hold spaces: count from the parenthesis closing it.
            String[] f = stat.substring(stat.lastIndexOf(')') + 2).trim().split("\\s+");
            long ticks = Long.parseLong(f[11]) + Long.parseLong(f[12]);
            return ticks * 1_000_000_000L / clockTicks();
        } catch (java.io.IOException | RuntimeException e) {
            return -1;
        }
    }

    private static long clockTicksPerSec = -1;

    /** The kernel's clock ticks per second (`getconf CLK_TCK`; 100 when it cannot be asked). */
    private static long clockTicks() {
        if (clockTicksPerSec < 0) {
            clockTicksPerSec = 100;
            try {
                Process p = new ProcessBuilder("getconf", "CLK_TCK").redirectErrorStream(true).start();
                String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.US_ASCII).trim();
                if (p.waitFor() == 0 && Long.parseLong(out) > 0) {
                    clockTicksPerSec = Long.parseLong(out);
                }
            } catch (java.io.IOException | InterruptedException | NumberFormatException e) {
                // keep 100, Linux's USER_HZ
            }
        }
        return clockTicksPerSec;
    }

    /** Milliseconds per cycle between two serverCpuNanos readings, or null. */
    private static Double perCycleMs(long before, long after, int cycles) {
        return before < 0 || after < 0 ? null : (after - before) / 1e6 / cycles;
    }

    private static String json(Double v) {
        return v == null ? "null" : String.format(Locale.ROOT, "%.4f", v);
    }

    private static long percentile(long[] sorted, double q) {
        int rank = (int) Math.ceil(q * sorted.length);
        return sorted[Math.max(0, Math.min(sorted.length - 1, rank - 1))];
    }

    /** zk_packets_received of the first server of the connect string (four-letter word mntr). */
    private static long packetsReceived(String connect) throws Exception {
        String first = connect.split(",")[0];
        int slash = first.indexOf('/');
        if (slash >= 0) {
            first = first.substring(0, slash);
        }
        int colon = first.lastIndexOf(':');
        String host = colon >= 0 ? first.substring(0, colon) : first;
        int port = colon >= 0 ? Integer.parseInt(first.substring(colon + 1)) : 2181;
        try (Socket s = new Socket()) {
            s.connect(new InetSocketAddress(host, port), 3000);
            s.setSoTimeout(3000);
            OutputStream out = s.getOutputStream();
            out.write("mntr".getBytes(StandardCharsets.US_ASCII));
            out.flush();
            s.shutdownOutput();
            InputStream in = s.getInputStream();
            ByteArrayOutputStream buf = new ByteArrayOutputStream();
            in.transferTo(buf);
            for (String line : buf.toString(StandardCharsets.UTF_8).split("\n")) {
                String[] kv = line.split("\t");
                if (kv.length == 2 && kv[0].trim().equals("zk_packets_received")) {
                    return Long.parseLong(kv[1].trim());
                }
            }
        }
        throw new IllegalStateException("mntr of " + host + ":" + port + " has no zk_packets_received");
    }
}
