package io.echomq.client.testing;

import java.io.BufferedInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * A minimal Redis client (RESP2) for checking what the sidecar did: the tests read Redis directly
 * (XPENDING, XLEN, XRANGE) rather than trusting the client under test.
 */
public final class Resp implements AutoCloseable {
  private final Socket socket;
  private final InputStream in;
  private final OutputStream out;

  public Resp(int port) throws IOException {
    socket = new Socket("127.0.0.1", port);
    socket.setSoTimeout(10_000);
    in = new BufferedInputStream(socket.getInputStream());
    out = socket.getOutputStream();
  }

  /** Runs a command; the reply is a Long, byte[] (bulk), String (status), List, or null. */
  public synchronized Object call(Object... args) throws IOException {
    ByteArrayOutputStream buf = new ByteArrayOutputStream();
    buf.writeBytes(("*" + args.length + "\r\n").getBytes(StandardCharsets.US_ASCII));
    for (Object arg : args) {
      byte[] bytes = arg instanceof byte[] b ? b : String.valueOf(arg).getBytes(StandardCharsets.UTF_8);
      buf.writeBytes(("$" + bytes.length + "\r\n").getBytes(StandardCharsets.US_ASCII));
      buf.writeBytes(bytes);
      buf.writeBytes("\r\n".getBytes(StandardCharsets.US_ASCII));
    }
    out.write(buf.toByteArray());
    out.flush();
    return read();
  }

  public long callLong(Object... args) throws IOException {
    return (Long) call(args);
  }

  private Object read() throws IOException {
    int type = in.read();
    String line = line();
    switch (type) {
      case '+':
        return line;
      case '-':
        throw new IOException("redis error: " + line);
      case ':':
        return Long.parseLong(line);
      case '$': {
        int n = Integer.parseInt(line);
        if (n < 0) {
          return null;
        }
        byte[] data = in.readNBytes(n);
        in.readNBytes(2);
        return data;
      }
      case '*': {
        int n = Integer.parseInt(line);
        if (n < 0) {
          return null;
        }
        List<Object> items = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
          items.add(read());
        }
        return items;
      }
      default:
        throw new IOException("unexpected RESP type " + type);
    }
  }

  private String line() throws IOException {
    StringBuilder sb = new StringBuilder();
    int c;
    while ((c = in.read()) != '\r') {
      if (c < 0) {
        throw new IOException("redis closed the connection");
      }
      sb.append((char) c);
    }
    in.read();
    return sb.toString();
  }

  @Override
  public void close() throws IOException {
    socket.close();
  }
}
