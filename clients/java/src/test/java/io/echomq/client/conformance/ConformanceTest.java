package io.echomq.client.conformance;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import io.echomq.client.EchoMqStreams;
import io.echomq.client.testing.SidecarFixture;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;
import org.junit.jupiter.api.TestInstance;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;

/**
 * Runs every scenario of {@code tests/conformance/scenarios.json} (one dynamic test each) against a
 * real redis-server and echomq-sidecar. A scenario key this runner does not know fails its test:
 * nothing is skipped.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class ConformanceTest {
  static final String LANGUAGE = "java";

  private JsonObject suite;
  private SidecarFixture fixture;
  private EchoMqStreams producer;

  @BeforeAll
  void startSidecar() throws Exception {
    Path file = SidecarFixture.repoRoot().resolve("tests/conformance/scenarios.json");
    suite = JsonParser.parseString(Files.readString(file)).getAsJsonObject();
    List<String> args = new ArrayList<>();
    suite.getAsJsonArray("sidecar_args").forEach(a -> args.add(a.getAsString()));
    fixture = SidecarFixture.start("conformance-" + LANGUAGE, args);
    producer = EchoMqStreams.connect(fixture.target());
  }

  @AfterAll
  void stopSidecar() {
    if (producer != null) {
      producer.close();
    }
    if (fixture != null) {
      fixture.close();
    }
  }

  @TestFactory
  Stream<DynamicTest> scenarios() {
    List<DynamicTest> tests = new ArrayList<>();
    for (JsonElement element : suite.getAsJsonArray("scenarios")) {
      JsonObject scenario = element.getAsJsonObject();
      String name = scenario.get("name").getAsString();
      String only = System.getProperty("conformance.only", "");
      if (!only.isEmpty() && !List.of(only.split(",")).contains(name)) {
        continue; // A developer's focused run (-Dconformance.only=a,b); never set by run-tests.
      }
      tests.add(DynamicTest.dynamicTest(name, () -> new ScenarioRun(scenario, fixture, producer, LANGUAGE).run()));
    }
    return tests.stream();
  }

  @Test
  void the_suite_is_version_1_with_uniquely_named_scenarios() {
    assertEquals(1, suite.get("version").getAsInt(), "this runner understands version 1 of scenarios.json");
    JsonArray scenarios = suite.getAsJsonArray("scenarios");
    assertFalse(scenarios.isEmpty(), "no scenarios");
    Set<String> names = new HashSet<>();
    scenarios.forEach(s -> assertEquals(true, names.add(s.getAsJsonObject().get("name").getAsString()), "duplicate name"));
  }
}
