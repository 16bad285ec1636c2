package io.echomq.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import org.junit.jupiter.api.Test;

class TargetsTest {
  @Test
  void host_port_and_unix_paths_become_grpc_targets() {
    assertEquals("dns:///127.0.0.1:50051", Targets.grpcTarget("127.0.0.1:50051"));
    assertEquals("dns:///localhost:50051", Targets.grpcTarget("localhost:50051"));
    assertEquals("unix:///run/echomq.sock", Targets.grpcTarget("unix:/run/echomq.sock"));
    assertEquals("unix:///run/echomq.sock", Targets.grpcTarget("unix:///run/echomq.sock"));
  }

  @Test
  void bad_addresses_are_refused_with_a_reason() {
    for (String bad : new String[] {"", "nonsense", "host:", "host:99999", "unix:", "unix:relative.sock"}) {
      assertThrows(IllegalArgumentException.class, () -> Targets.grpcTarget(bad), bad);
    }
  }
}
