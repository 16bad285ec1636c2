package io.echomq.client.testing;

import java.io.IOException;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

/**
 * A redis-server and an echomq-sidecar on free loopback ports, each in its own temporary
 * directory. {@link #close()} stops both and removes the directory; a JVM shutdown hook does the
 * same if a test run is cut short.
 */
public final class SidecarFixture implements AutoCloseable {
  private static final Duration READY_TIMEOUT = Duration.ofSeconds(30);

  private final Path dir;
  private final List<String> sidecarArgs;
  private final String consumerName;
  private final String listen;
  public final int redisPort;
  public final int adminPort;
  private Process redis;
  private Process sidecar;
  private final Thread cleanup = new Thread(this::stopAll, "sidecar-fixture-cleanup");

  /** Starts both processes; the sidecar listens on a free loopback TCP port. */
  public static SidecarFixture start(String consumerName, List<String> sidecarArgs) throws Exception {
    return new SidecarFixture(consumerName, sidecarArgs, null);
  }

  /** Starts both processes; the sidecar listens on a unix socket in the fixture's directory. */
  public static SidecarFixture startOnUnixSocket(String consumerName, List<String> sidecarArgs) throws Exception {
    return new SidecarFixture(consumerName, sidecarArgs, "unix");
  }

  private SidecarFixture(String consumerName, List<String> sidecarArgs, String mode) throws Exception {
    this.dir = Files.createTempDirectory("echomq-java-");
    this.consumerName = consumerName;
    this.sidecarArgs = List.copyOf(sidecarArgs);
    Runtime.getRuntime().addShutdownHook(cleanup);
    try {
      redisPort = freePort();
      adminPort = freePort();
      listen = "unix".equals(mode) ? "unix:" + dir.resolve("sidecar.sock") : "127.0.0.1:" + freePort();
      startRedis();
      startSidecar();
    } catch (Exception e) {
      stopAll();
      throw e;
    }
  }

  /** The address a client connects to: {@code 127.0.0.1:port} or {@code unix:/path}. */
  public String target() {
    return listen;
  }

  public Resp redis() throws IOException {
    return new Resp(redisPort);
  }

  /** SIGKILL: no shutdown sequence, whatever the sidecar held stays pending in Redis. */
  public void killSidecar() throws InterruptedException {
    sidecar.destroyForcibly();
    sidecar.waitFor(10, TimeUnit.SECONDS);
  }

  /** Starts the sidecar again on the same ports, consumer name and arguments; waits until ready. */
  public void restartSidecar() throws Exception {
    if (sidecar != null && sidecar.isAlive()) {
      killSidecar();
    }
    startSidecar();
  }

  /** The sidecar's log so far (for failure messages). */
  public String sidecarLog() {
    try {
      String log = Files.readString(dir.resolve("sidecar.log"));
      return log.length() > 8000 ? "…" + log.substring(log.length() - 8000) : log;
    } catch (IOException e) {
      return "(no sidecar log: " + e + ")";
    }
  }

  private void startRedis() throws Exception {
    redis =
        new ProcessBuilder(
                "redis-server", "--port", String.valueOf(redisPort), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", dir.toString())
            .redirectErrorStream(true)
            .redirectOutput(dir.resolve("redis.log").toFile())
            .start();
    long until = System.nanoTime() + READY_TIMEOUT.toNanos();
    while (true) {
      try (Resp r = new Resp(redisPort)) {
        if ("PONG".equals(r.call("PING"))) {
          return;
        }
      } catch (IOException e) {
        if (System.nanoTime() > until || !redis.isAlive()) {
          throw new IllegalStateException("redis-server did not start: " + Files.readString(dir.resolve("redis.log")), e);
        }
        Thread.sleep(50);
      }
    }
  }

  private void startSidecar() throws Exception {
    List<String> command = new ArrayList<>();
    command.add(sidecarBinary().toString());
    command.addAll(List.of(
        "--redis-url", "redis://127.0.0.1:" + redisPort,
        "--listen", listen,
        "--admin-listen", "127.0.0.1:" + adminPort,
        "--consumer-name", consumerName));
    command.addAll(sidecarArgs);
    sidecar =
        new ProcessBuilder(command)
            .redirectErrorStream(true)
            .redirectOutput(ProcessBuilder.Redirect.appendTo(dir.resolve("sidecar.log").toFile()))
            .start();
    HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(1)).build();
    HttpRequest ready =
        HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + adminPort + "/readyz")).timeout(Duration.ofSeconds(2)).build();
    long until = System.nanoTime() + READY_TIMEOUT.toNanos();
    while (true) {
      if (!sidecar.isAlive()) {
        throw new IllegalStateException("the sidecar exited (" + sidecar.exitValue() + "): " + sidecarLog());
      }
      try {
        if (http.send(ready, HttpResponse.BodyHandlers.discarding()).statusCode() == 200) {
          return;
        }
      } catch (IOException e) {
        // Not listening yet.
      }
      if (System.nanoTime() > until) {
        throw new IllegalStateException("the sidecar was not ready within " + READY_TIMEOUT + ": " + sidecarLog());
      }
      Thread.sleep(50);
    }
  }

  /** {@code $ECHOMQ_SIDECAR_BIN}, else {@code target/debug/echomq-sidecar} at the repository root. */
  public static Path sidecarBinary() {
    String env = System.getenv("ECHOMQ_SIDECAR_BIN");
    Path bin = env != null && !env.isEmpty() ? Paths.get(env) : repoRoot().resolve("target/debug/echomq-sidecar");
    if (!Files.isExecutable(bin)) {
      throw new IllegalStateException("no sidecar binary at " + bin + " (build it: cargo build --bin echomq-sidecar)");
    }
    return bin;
  }

  /** The repository root: the {@code echomq.repo.root} property (set by Surefire), else two levels up. */
  public static Path repoRoot() {
    String prop = System.getProperty("echomq.repo.root");
    return (prop != null ? Paths.get(prop) : Paths.get("../..")).toAbsolutePath().normalize();
  }

  /**
   * A loopback port that was free a moment ago, from 10000-31999: below the kernel's ephemeral
   * range (32768 up), where a port the kernel hands out as free may be some outgoing connection's
   * before the sidecar binds it.
   */
  public static int freePort() {
    while (true) {
      int port = 10000 + java.util.concurrent.ThreadLocalRandom.current().nextInt(22000);
      try (ServerSocket socket = new ServerSocket(port, 1, java.net.InetAddress.getLoopbackAddress())) {
        return port;
      } catch (IOException e) {
        // taken: try another
      }
    }
  }

  private synchronized void stopAll() {
    for (Process p : new Process[] {sidecar, redis}) {
      if (p != null && p.isAlive()) {
        p.destroy();
        try {
          if (!p.waitFor(5, TimeUnit.SECONDS)) {
            p.destroyForcibly().waitFor(5, TimeUnit.SECONDS);
          }
        } catch (InterruptedException e) {
          p.destroyForcibly();
          Thread.currentThread().interrupt();
        }
      }
    }
    try (Stream<Path> files = Files.walk(dir)) {
      files.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    } catch (IOException e) {
      // Best effort.
    }
  }

  @Override
  public void close() {
    stopAll();
    try {
      Runtime.getRuntime().removeShutdownHook(cleanup);
    } catch (IllegalStateException e) {
      // Already shutting down.
    }
  }
}
