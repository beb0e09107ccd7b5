package blobsnap.samza;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.samza.SamzaException;

/**
 * blobsnap's bucket layout (DESIGN §5; the Rust side is {@code src/layout.rs},
 * {@code src/blobstore/key.rs}, {@code src/index.rs}), as far as a store's blobs and indexes and
 * the job's owner record go:
 *
 * <pre>
 * &lt;prefix&gt;&lt;job&gt;/&lt;job-id&gt;/tasks/&lt;task&gt;/stores/&lt;store&gt;/blobs/&lt;checkpoint-id&gt;/&lt;sha256&gt;
 * &lt;prefix&gt;&lt;job&gt;/&lt;job-id&gt;/tasks/&lt;task&gt;/stores/&lt;store&gt;/index/&lt;checkpoint-id&gt;.&lt;sha256&gt;.json
 * &lt;prefix&gt;&lt;job&gt;/&lt;job-id&gt;/scope.json                                  (the job scope's owner record)
 * </pre>
 *
 * The prefix is {@code ""} or ends in {@code /} (as the Rust {@code s3.prefix}). User names
 * (job, job id, task, store) are escaped with {@link #escapeSegment}. Blob ids and markers are
 * relative to the store's scope ({@code blobs/<checkpoint-id>/<sha256>},
 * {@code index/<checkpoint-id>.<sha256>.json}), exactly as the Rust index holds them. These
 * strings are persisted in every bucket and in every checkpoint: never change them.
 */
public final class Layout {
  /** The longest key S3 accepts, in bytes. */
  public static final int MAX_KEY_LEN = 1024;

  private static final char[] HEX = "0123456789ABCDEF".toCharArray();
  private static final Pattern SHA256 = Pattern.compile("[0-9a-f]{64}");
  private static final Pattern CHECKPOINT_ID = Pattern.compile("(0|[1-9][0-9]*)-(0|[1-9][0-9]*)");
  private static final Pattern BLOB_ID = Pattern.compile("blobs/([^/]+)/([^/]+)");
  private static final Pattern MARKER = Pattern.compile("index/(.+)\\.([^.]+)\\.json");
  /** A checkpoint dir's name: {@code <task dir>-<millis>-<seq>} (the id is always the last two parts). */
  private static final Pattern CHECKPOINT_DIR = Pattern.compile("(.+)-([0-9]+-[0-9]+)");

  private Layout() {
  }

  /**
   * Escape one user-supplied name into a key segment: every byte (of its UTF-8) outside
   * {@code [A-Za-z0-9_-]} becomes {@code %XX} with uppercase hex ({@code .} is {@code %2E}, a
   * space {@code %20}). Injective; never contains {@code /} or {@code .}.
   */
  public static String escapeSegment(String name) {
    if (name == null || name.isEmpty()) {
      throw new IllegalArgumentException("an empty name cannot be a key segment");
    }
    byte[] bytes = name.getBytes(StandardCharsets.UTF_8);
    StringBuilder out = new StringBuilder(bytes.length);
    for (byte b : bytes) {
      int c = b & 0xff;
      if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-') {
        out.append((char) c);
      } else {
        out.append('%').append(HEX[c >> 4]).append(HEX[c & 0xf]);
      }
    }
    return out.toString();
  }

  /** The owner record's name in a job's scope (the Rust {@code layout.rs}: {@code <job>/<job-id>/scope.json}). */
  public static final String OWNER_RECORD = "scope.json";

  /** The scope of one job (ends in {@code /}): {@code <prefix><job>/<job-id>/}. */
  public static String jobScope(String prefix, String job, String jobId) {
    return prefix + escapeSegment(job) + "/" + escapeSegment(jobId) + "/";
  }

  /** The key of a job scope's owner record: {@code <prefix><job>/<job-id>/scope.json}. */
  public static String ownerRecordKey(String prefix, String job, String jobId) {
    return jobScope(prefix, job, jobId) + OWNER_RECORD;
  }

  /**
   * The scope of one store of one task (ends in {@code /}):
   * {@code <prefix><job>/<job-id>/tasks/<task>/stores/<store>/}.
   */
  public static String storeScope(String prefix, String job, String jobId, String task, String store) {
    return jobScope(prefix, job, jobId) + "tasks/" + escapeSegment(task) + "/stores/" + escapeSegment(store) + "/";
  }

  /** The scope-relative id of a blob first uploaded by checkpoint {@code checkpointId}. */
  public static String blobId(String checkpointId, String sha256Hex) {
    return "blobs/" + checkCheckpointId(checkpointId) + "/" + checkSha(sha256Hex);
  }

  /** The marker (scope-relative index key) of an index of {@code checkpointId} with these bytes' hash. */
  public static String marker(String checkpointId, String sha256Hex) {
    return "index/" + checkCheckpointId(checkpointId) + "." + checkSha(sha256Hex) + ".json";
  }

  /** What a scope-relative id names. */
  public static final class ParsedId {
    /** Whether it is an index (a marker), not a blob. */
    public final boolean index;
    /** The checkpoint id in it. */
    public final String checkpointId;
    /** The SHA-256 in it: of the blob's bytes, or of the index's exact bytes. */
    public final String sha256;

    ParsedId(boolean index, String checkpointId, String sha256) {
      this.index = index;
      this.checkpointId = checkpointId;
      this.sha256 = sha256;
    }
  }

  /**
   * Read a blob id ({@code blobs/<checkpoint-id>/<sha256>}) or a marker
   * ({@code index/<checkpoint-id>.<sha256>.json}, parsed from the right: checkpoint ids contain
   * {@code -}). Anything else is refused with a message naming it.
   */
  public static ParsedId parseId(String id) {
    if (id == null || id.isEmpty()) {
      throw new SamzaException("blobsnap: a blank blob id");
    }
    if (id.startsWith("borrowed/")) {
      throw new SamzaException("blobsnap: blob id " + quote(id) + " is a fork's borrowed blob (index format-version 3): "
          + "Samza's engine cannot resolve it (it needs the index's borrowed-from scopes); restore this store with blobsnap");
    }
    Matcher b = BLOB_ID.matcher(id);
    if (b.matches()) {
      return new ParsedId(false, checkCheckpointId(b.group(1), id), checkSha(b.group(2), id));
    }
    Matcher m = MARKER.matcher(id);
    if (m.matches()) {
      return new ParsedId(true, checkCheckpointId(m.group(1), id), checkSha(m.group(2), id));
    }
    throw new SamzaException("blobsnap: " + quote(id) + " is not a blobsnap blob id (blobs/<checkpoint-id>/<sha256>) "
        + "nor an index marker (index/<checkpoint-id>.<sha256>.json)");
  }

  /** Check a checkpoint id the way blobsnap's Rust reader does: {@code <millis>-<seq>}, both non-negative longs. */
  public static String checkCheckpointId(String id) {
    return checkCheckpointId(id, id);
  }

  private static String checkCheckpointId(String id, String in) {
    Matcher m = id == null ? null : CHECKPOINT_ID.matcher(id);
    if (m == null || !m.matches() || !fitsLong(m.group(1)) || !fitsLong(m.group(2))) {
      throw new SamzaException("blobsnap: checkpoint id " + quote(id)
          + (in != null && !in.equals(id) ? " in " + quote(in) : "")
          + " is not <millis>-<seq> (two non-negative decimal numbers without leading zeros that fit a Java long)");
    }
    return id;
  }

  private static boolean fitsLong(String digits) {
    try {
      Long.parseLong(digits);
      return true;
    } catch (NumberFormatException e) {
      return false;
    }
  }

  private static String checkSha(String sha) {
    return checkSha(sha, sha);
  }

  private static String checkSha(String sha, String in) {
    if (sha == null || !SHA256.matcher(sha).matches()) {
      throw new SamzaException("blobsnap: " + quote(sha) + (in != null && !in.equals(sha) ? " in " + quote(in) : "")
          + " is not a SHA-256 (64 lowercase hex digits)");
    }
    return sha;
  }

  /**
   * The checkpoint id of the Samza checkpoint directory a file being uploaded lies in.
   *
   * <p>Samza uploads files from {@code <logged base dir>/<store>/<task>-<checkpoint-id>/...}
   * ({@code StorageManagerUtil.getTaskStoreDir} + {@code getStoreCheckpointDir}; spaces in the
   * store and task names become {@code _}); files may be in sub-directories of it. The nearest
   * ancestor whose name is {@code <something>-<millis>-<seq>} and whose parent is the store's
   * directory is the checkpoint dir. The task part is not compared with the task name (a
   * standby task's dirs carry its active task's name).
   *
   * @throws SamzaException naming the path when no ancestor has that shape
   */
  public static String checkpointIdOfFile(Path file, String storeName) {
    String storeDirName = storeName.replace(' ', '_');
    Path abs = file.toAbsolutePath().normalize();
    for (Path dir = abs.getParent(); dir != null && dir.getParent() != null; dir = dir.getParent()) {
      Path name = dir.getFileName();
      Path parentName = dir.getParent().getFileName();
      if (name == null || parentName == null || !parentName.toString().equals(storeDirName)) {
        continue;
      }
      Matcher m = CHECKPOINT_DIR.matcher(name.toString());
      if (m.matches()) {
        return checkCheckpointId(m.group(2), name.toString());
      }
    }
    throw new SamzaException("blobsnap: cannot tell the checkpoint id of " + quote(abs.toString())
        + ": none of its directories is a Samza store checkpoint dir <base>" + File.separator + storeDirName
        + File.separator + "<task>-<millis>-<seq> (blobsnap's S3BlobStoreManager uploads files only from the checkpoint "
        + "dirs Samza's blob-store backup manager hands it: the blob key names the checkpoint that first uploaded it)");
  }

  static String quote(String s) {
    return s == null ? "null" : "\"" + s + "\"";
  }
}
