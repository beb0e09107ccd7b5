package blobsnap;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.concurrent.CompletableFuture;

/**
 * The JNI entry points of blobsnap's engine (the Rust library {@code samza/native}). Handles are
 * ids in the library's table, never pointers: a closed or unknown handle makes a call throw
 * {@link BlobsnapException}, never crash the JVM. Every failure is a {@link BlobsnapException}
 * (thrown, or completing a future exceptionally).
 *
 * <p>The library is loaded from the system property {@code blobsnap.native.lib} (an absolute
 * path) when it is set, else from this jar ({@code blobsnap/native/linux-x86_64/}), copied to
 * {@code <java.io.tmpdir>/blobsnap-native-<sha256>/} first (once per content, shared by every JVM).
 */
final class Native {
  static final String LIB_PROPERTY = "blobsnap.native.lib";
  static final String RESOURCE = "/blobsnap/native/linux-x86_64/libblobsnap_samza_jni.so";

  private Native() {}

  static {
    load();
    init();
  }

  private static void load() {
    String path = System.getProperty(LIB_PROPERTY);
    if (path != null && !path.isEmpty()) {
      File f = new File(path);
      if (!f.isAbsolute() || !f.isFile()) {
        throw new UnsatisfiedLinkError("blobsnap: " + LIB_PROPERTY + "=" + path + " is not an absolute path to a file");
      }
      System.load(f.getAbsolutePath());
      return;
    }
    String os = System.getProperty("os.name", "") + "/" + System.getProperty("os.arch", "");
    if (!os.equals("Linux/amd64")) {
      throw new UnsatisfiedLinkError("blobsnap: the jar carries its native library for Linux x86-64 only, this JVM runs on "
          + os + ": build samza/native for it and set -D" + LIB_PROPERTY + "=/path/to/libblobsnap_samza_jni.so");
    }
    byte[] lib;
    try (InputStream in = Native.class.getResourceAsStream(RESOURCE)) {
      if (in == null) {
        throw new UnsatisfiedLinkError("blobsnap: " + RESOURCE + " is not in the jar and " + LIB_PROPERTY
            + " is not set (build the jar with scripts/samza-jar.sh, or point " + LIB_PROPERTY + " at the library)");
      }
      java.io.ByteArrayOutputStream b = new java.io.ByteArrayOutputStream(1 << 24);
      byte[] buf = new byte[1 << 16];
      for (int n; (n = in.read(buf)) > 0;) {
        b.write(buf, 0, n);
      }
      lib = b.toByteArray();
    } catch (IOException e) {
      throw new UnsatisfiedLinkError("blobsnap: cannot read the native library out of the jar: " + e);
    }
    Path file = extracted(lib);
    try {
      System.load(file.toAbsolutePath().toString());
    } catch (UnsatisfiedLinkError e) {
      UnsatisfiedLinkError out = new UnsatisfiedLinkError("blobsnap: cannot load the native library from the jar"
          + " (it needs " + floor() + " or later on Linux x86-64; elsewhere build samza/native and set -D"
          + LIB_PROPERTY + "): " + e.getMessage());
      out.initCause(e);
      throw out;
    }
  }

  /**
   * The library's bytes at {@code <java.io.tmpdir>/blobsnap-native-<sha256>/}, one file per
   * content: written once (a temp file renamed into place, so JVMs starting together never see
   * half a file), then reused by every JVM — a killed JVM leaves no copy of its own behind.
   */
  static Path extracted(byte[] lib) {
    String hex;
    try {
      byte[] d = java.security.MessageDigest.getInstance("SHA-256").digest(lib);
      StringBuilder sb = new StringBuilder();
      for (int i = 0; i < 12; i++) {
        sb.append(String.format("%02x", d[i]));
      }
      hex = sb.toString();
    } catch (java.security.NoSuchAlgorithmException e) {
      throw new UnsatisfiedLinkError("blobsnap: no SHA-256 in this JVM: " + e);
    }
    Path dir = java.nio.file.Paths.get(System.getProperty("java.io.tmpdir"), "blobsnap-native-" + hex);
    Path file = dir.resolve("libblobsnap_samza_jni.so");
    try {
      if (!privateDir(dir)) {
        // Not ours alone (another user made it, or may write in it): a copy of this JVM's own.
        Path own = Files.createTempFile("libblobsnap_samza_jni", ".so");
        own.toFile().deleteOnExit();
        Files.write(own, lib);
        return own;
      }
      if (Files.isRegularFile(file, java.nio.file.LinkOption.NOFOLLOW_LINKS) && Files.size(file) == lib.length
          && java.util.Arrays.equals(Files.readAllBytes(file), lib)) {
        return file;
      }
      Path tmp = Files.createTempFile(dir, "lib", ".so.tmp");
      try {
        Files.write(tmp, lib);
        Files.move(tmp, file, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
      } finally {
        Files.deleteIfExists(tmp);
      }
      return file;
    } catch (IOException e) {
      throw new UnsatisfiedLinkError("blobsnap: cannot copy the native library out of the jar to " + dir + ": " + e);
    }
  }

  /**
   * Makes {@code dir} (mode 700) if it is missing; whether it is a directory of this JVM's user
   * that no one else can write in (a shared temp dir must not let another user plant a library
   * this JVM then loads).
   */
  static boolean privateDir(Path dir) throws IOException {
    java.util.Set<java.nio.file.attribute.PosixFilePermission> mine =
        java.nio.file.attribute.PosixFilePermissions.fromString("rwx------");
    try {
      Files.createDirectory(dir, java.nio.file.attribute.PosixFilePermissions.asFileAttribute(mine));
    } catch (java.nio.file.FileAlreadyExistsException e) {
      // checked below
    } catch (UnsupportedOperationException e) {
      return false;
    }
    java.nio.file.attribute.PosixFileAttributes a = Files.readAttributes(dir,
        java.nio.file.attribute.PosixFileAttributes.class, java.nio.file.LinkOption.NOFOLLOW_LINKS);
    java.nio.file.attribute.UserPrincipal me = dir.getFileSystem().getUserPrincipalLookupService()
        .lookupPrincipalByName(System.getProperty("user.name"));
    return a.isDirectory() && a.owner().equals(me) && a.permissions().equals(mine);
  }

  /** The oldest glibc the jar's library runs on, as scripts/samza-jar.sh recorded it. */
  static String floor() {
    try (InputStream in = Native.class.getResourceAsStream("/blobsnap/native/linux-x86_64/glibc-floor.txt")) {
      if (in == null) {
        return "the glibc it was built against";
      }
      java.io.ByteArrayOutputStream b = new java.io.ByteArrayOutputStream();
      byte[] buf = new byte[64];
      for (int n; (n = in.read(buf)) > 0;) {
        b.write(buf, 0, n);
      }
      return new String(b.toByteArray(), java.nio.charset.StandardCharsets.UTF_8).trim();
    } catch (IOException e) {
      return "the glibc it was built against";
    }
  }

  /** Makes the JVM's one runtime; resolves {@link BlobsnapException} with this class's loader. */
  private static native void init();

  /** Settings as {@code [key, value, ...]} (the settings file's keys, without {@code blobsnap.}). */
  static native long engineOpen(String[] config);

  static native void adminResources(long engine, String job, String jobId, boolean create);

  /** {@code stores}: {@code [name, dir, ...]}. */
  static native long backupNew(long engine, String job, String jobId, String task, String[] stores,
      boolean prepared);

  static native void backupInit(long handle, byte[] checkpointJson);

  static native String[] backupSnapshot(long handle, String checkpointId);

  static native void backupUpload(long handle, String checkpointId, String[] snapshotMarkers, String[] dirs,
      CompletableFuture<String[]> future);

  static native void backupCleanup(long handle, String checkpointId, String[] markers, CompletableFuture<Void> future);

  static native long restoreNew(long engine, String job, String jobId, String task, String[] stores);

  static native void restoreInit(long handle, byte[] checkpointJson);

  static native void restoreRun(long handle, CompletableFuture<Void> future);

  static native long taskClaim(long engine, String job, String jobId, String task);

  static native byte[] taskLast(long handle);

  static native void taskWrite(long handle, byte[] checkpointJson);

  static native void cancel(long handle);

  static native void close(long handle);
}
