package blobsnap;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * The jar's embedding, with a copy of the suite's own (debug) library at the jar's resource path
 * ({@code blobsnap/native/linux-x86_64/}): a JVM without {@code blobsnap.native.lib} loads it
 * from the classpath, copies it out and runs it (the release jar of scripts/samza-jar.sh is the
 * same code path with a stripped release build inside).
 */
class EmbeddedLibraryTest {
  @Test
  void aJvmWithoutThePropertyLoadsTheLibraryFromTheClasspath() throws Exception {
    String lib = System.getProperty("blobsnap.native.lib");
    if (lib == null || !new File(lib).isFile()) {
      fail("blobsnap.native.lib must name the built library, got " + lib);
    }
    Path root = Paths.get(System.getProperty("blobsnap.spike.work"), "embedded").toAbsolutePath();
    NativeTest.delete(root);
    Path res = root.resolve("cp").resolve(Native.RESOURCE.substring(1));
    Files.createDirectories(res.getParent());
    Files.copy(Paths.get(lib), res, StandardCopyOption.REPLACE_EXISTING);
    String cp = root.resolve("cp") + File.pathSeparator + System.getProperty("blobsnap.spike.classpath")
        + File.pathSeparator + new String(Files.readAllBytes(Paths.get(System.getProperty("blobsnap.spike.classpath.file"))),
            StandardCharsets.UTF_8).trim();
    // The library goes to <java.io.tmpdir>/blobsnap-native-<sha256>/: here the test's own dir.
    Path tmpdir = root.resolve("tmp");
    Files.createDirectories(tmpdir);
    List<String> cmd = new ArrayList<>(Arrays.asList(Paths.get(System.getProperty("java.home"), "bin", "java").toString(),
        "-Djava.io.tmpdir=" + tmpdir, "-cp", cp, EmbeddedProbe.class.getName(), root.resolve("store").toString()));
    for (int run = 1; run <= 2; run++) {
      Path out = root.resolve("probe-" + run + ".out");
      Process p = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(out.toFile()).start();
      if (!p.waitFor(60, TimeUnit.SECONDS)) {
        p.destroyForcibly();
        fail("the probe did not finish within 60 s");
      }
      String text = new String(Files.readAllBytes(out), StandardCharsets.UTF_8);
      assertEquals(0, p.exitValue(), text);
      assertTrue(text.contains("embedded library loaded; a typo: invalid-input") && text.contains("lokal-dir"), text);
    }
    // One copy, shared by both JVMs (a killed JVM leaves none of its own), in a dir only its
    // user can write in.
    List<Path> copies;
    try (java.util.stream.Stream<Path> s = Files.walk(tmpdir)) {
      copies = s.filter(Files::isRegularFile).collect(java.util.stream.Collectors.toList());
    }
    assertEquals(1, copies.size(), copies.toString());
    assertTrue(copies.get(0).getParent().getFileName().toString().startsWith("blobsnap-native-"), copies.toString());
    assertEquals("rwx------", java.nio.file.attribute.PosixFilePermissions.toString(
        Files.getPosixFilePermissions(copies.get(0).getParent())));
    NativeTest.delete(root); // two copies of a debug library: over 1 GB
  }
}
