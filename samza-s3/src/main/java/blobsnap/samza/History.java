package blobsnap.samza;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.function.Supplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.samza.SamzaException;
import org.apache.samza.storage.blobstore.Metadata;
import org.apache.samza.storage.blobstore.exceptions.DeletedException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import software.amazon.awssdk.core.ResponseInputStream;
import software.amazon.awssdk.core.exception.SdkException;
import software.amazon.awssdk.core.sync.RequestBody;
import software.amazon.awssdk.services.s3.model.Delete;
import software.amazon.awssdk.services.s3.model.DeleteObjectsRequest;
import software.amazon.awssdk.services.s3.model.GetObjectResponse;
import software.amazon.awssdk.services.s3.model.ListObjectsV2Request;
import software.amazon.awssdk.services.s3.model.ObjectIdentifier;
import software.amazon.awssdk.services.s3.model.PutObjectRequest;
import software.amazon.awssdk.services.s3.model.S3Object;

/**
 * Samza's commits in blobsnap's history (route 2; docs/samza.md, "The history record"). Samza's
 * own engine commits into its checkpoint manager (Kafka), outside the bucket, so this keeps what
 * blobsnap's sweep, {@code checkpoints}, {@code check}, savepoints and restores read:
 *
 * <ul>
 *   <li>at the PUT of a store's index ({@link #prepare}), a <em>prepared</em> record of that store's
 *       snapshot, {@code <job>/<job-id>/prepared/<task>/<checkpoint-id>.<store>.json}: a root for
 *       blobsnap's sweep (whatever its age) until it is promoted or dropped;</li>
 *   <li>at {@code removeTTL} of the index, which Samza calls in {@code cleanUp}, after its
 *       checkpoint write ({@link #committed}): once every store of the checkpoint is in, the
 *       checkpoint is committed into blobsnap's history, {@code checkpoints/<task>/<seq:020>.json}
 *       (create-only under the next number, as blobsnap's own commits), the history is trimmed to
 *       {@code blobsnap.job.retention}, and the task's other prepared records are dropped — the
 *       checkpoint Samza restarts from is now this one or a later one, so a record of an older
 *       commit (one Samza never wrote, or the restart point whose {@code cleanUp} Samza 1.8.0 never
 *       calls) names nothing Samza can restore.</li>
 * </ul>
 *
 * <p>A JVM killed between Samza's checkpoint write and {@code cleanUp} leaves that checkpoint's
 * records: they stay roots until the next commit's promotion. The history's checkpoints carry no
 * input offsets (Samza keeps them; its engine hands this manager none).
 *
 * <p>Lock: {@link #pending} alone, never held across a request.
 */
final class History {
  private static final Logger LOG = LoggerFactory.getLogger(S3BlobStoreManager.class);
  private static final ObjectMapper JSON = new ObjectMapper();
  /** The backend key of the markers in blobsnap's checkpoints (blobsnap's own factory name). */
  static final String FACTORY = "blobsnap.BlobStoreStateBackendFactory";
  /** blobsnap's checkpoint document format. */
  static final int DOCUMENT_FORMAT = 1;
  /** A number another writer took first is passed over this many times, then the commit fails. */
  static final int CLAIM_ATTEMPTS = 8;
  /** The largest prepared record read back. */
  static final long MAX_RECORD_BYTES = 1L << 20;
  private static final Pattern DOCUMENT = Pattern.compile("([0-9]{20})\\.json");

  private final S3Settings settings;
  private final Supplier<S3Transport> transport;
  private final ObjectReader reader;
  private final CreateOnlyPut puts;
  private final OwnerRecord ownerRecord;
  private final String writer;
  /** Checkpoints prepared here and not committed yet: "job scope \0 task \0 id" → store → marker. */
  private final Map<String, Pending> pending = new HashMap<>();
  /** The last checkpoints committed here (same keys), so that a retried removeTTL commits nothing. */
  private final java.util.LinkedHashSet<String> finished = new java.util.LinkedHashSet<>();
  private static final int FINISHED_KEPT = 1024;

  private static final class Pending {
    final Map<String, String> markers = new TreeMap<>();
    final TreeSet<String> committed = new TreeSet<>();
  }

  History(S3Settings settings, Supplier<S3Transport> transport, ObjectReader reader, CreateOnlyPut puts,
      OwnerRecord ownerRecord) {
    this.settings = settings;
    this.transport = transport;
    this.reader = reader;
    this.puts = puts;
    this.ownerRecord = ownerRecord;
    byte[] r = new byte[16];
    new SecureRandom().nextBytes(r);
    this.writer = "samza-s3-" + S3BlobStoreManager.hex(r);
  }

  private String jobScope(Metadata md) {
    return Layout.jobScope(settings.prefix, md.getJobName(), md.getJobId());
  }

  private String preparedDir(Metadata md) {
    return S3BlobStoreManager.key(jobScope(md), "prepared/" + Layout.escapeSegment(md.getTaskName()) + "/");
  }

  private static String pendingKey(String jobScope, String task, String checkpointId) {
    return jobScope + '\0' + task + '\0' + checkpointId;
  }

  /** The index of {@code md}'s store at {@code checkpointId} is stored: its prepared record. */
  void prepare(Metadata md, String checkpointId, String marker) {
    synchronized (pending) {
      pending.computeIfAbsent(pendingKey(jobScope(md), md.getTaskName(), checkpointId), k -> new Pending())
          .markers.put(md.getStoreName(), marker);
    }
    String key = S3BlobStoreManager.key(preparedDir(md),
        checkpointId + "." + Layout.escapeSegment(md.getStoreName()) + ".json");
    Map<String, String> one = new TreeMap<>();
    one.put(md.getStoreName(), marker);
    byte[] body = checkpointJson(checkpointId, one);
    try {
      transport.get().client.putObject(PutObjectRequest.builder().bucket(settings.bucket).key(key)
          .contentLength((long) body.length).contentType("application/json")
          .checksumSHA256(java.util.Base64.getEncoder().encodeToString(S3BlobStoreManager.sha256().digest(body)))
          .build(), RequestBody.fromBytes(body));
    } catch (SdkException e) {
      throw Errors.toSamza("put the prepared history record " + reader.url(key), e);
    }
  }

  /**
   * Samza removed the TTL of the index of {@code md}'s store at {@code checkpointId}: its
   * checkpoint is written. When every store this manager prepared for it is in, commit it.
   */
  void committed(Metadata md, String checkpointId, String marker) {
    Map<String, String> markers = null;
    boolean foreign = false;
    String pk = pendingKey(jobScope(md), md.getTaskName(), checkpointId);
    synchronized (pending) {
      Pending p = pending.get(pk);
      if (p != null) {
        p.markers.put(md.getStoreName(), marker);
        p.committed.add(md.getStoreName());
        if (p.committed.containsAll(p.markers.keySet())) {
          // (A promotion that fails leaves it to Samza's retry, which finds the stores in the
          // bucket's records: the foreign path below.)
          markers = new TreeMap<>(p.markers);
          pending.remove(pk);
        }
      } else if (!finished.contains(pk)) {
        foreign = true;
      }
    }
    if (foreign) {
      // Prepared by another process: the records in the bucket say which stores the checkpoint
      // has. None for this store: its commit is superseded (a promotion dropped it) or its index
      // was never stored — committed into no history, never a checkpoint missing a store.
      markers = preparedMarkers(md, checkpointId);
      if (!marker.equals(markers.get(md.getStoreName()))) {
        LOG.warn("blobsnap: removeTTL of index {} of task {} store {}, which has no prepared record: not committed"
            + " into blobsnap's history", marker, md.getTaskName(), md.getStoreName());
        return;
      }
    }
    if (markers != null) {
      promote(md, checkpointId, markers);
      synchronized (pending) {
        finished.add(pk);
        if (finished.size() > FINISHED_KEPT) {
          finished.remove(finished.iterator().next());
        }
      }
    }
  }

  /** A checkpoint id's order (Samza's ids are {@code <millis>-<n>}, from its clock). */
  static int compareIds(String a, String b) {
    String[] x = a.split("-", 2);
    String[] y = b.split("-", 2);
    try {
      int c = Long.compare(Long.parseLong(x[0]), Long.parseLong(y[0]));
      return c != 0 ? c : Long.compare(Long.parseLong(x[1]), Long.parseLong(y[1]));
    } catch (NumberFormatException | ArrayIndexOutOfBoundsException e) {
      return a.compareTo(b);
    }
  }

  private boolean isPending(String pk) {
    synchronized (pending) {
      return pending.containsKey(pk);
    }
  }

  /** The markers of every per-store prepared record of {@code checkpointId} in the bucket. */
  private Map<String, String> preparedMarkers(Metadata md, String checkpointId) {
    Map<String, String> out = new TreeMap<>();
    for (S3Object o : list(preparedDir(md))) {
      String name = o.key().substring(o.key().lastIndexOf('/') + 1);
      if (!name.startsWith(checkpointId + ".")) {
        continue;
      }
      JsonNode m = readJson(o.key(), MAX_RECORD_BYTES).path("state-checkpoint-markers").path(FACTORY);
      m.fields().forEachRemaining(e -> out.put(e.getKey(), e.getValue().asText()));
    }
    return out;
  }

  /** Commit {@code checkpointId} with {@code markers} into the task's history, trim it, drop records. */
  private void promote(Metadata md, String checkpointId, Map<String, String> markers) {
    String dir = S3BlobStoreManager.key(jobScope(md), "checkpoints/" + Layout.escapeSegment(md.getTaskName()) + "/");
    long seq = 0;
    for (int attempt = 1; ; attempt++) {
      TreeMap<Long, String> docs = documents(dir);
      if (!docs.isEmpty() && checkpointId.equals(headId(docs.lastEntry().getValue()))) {
        seq = docs.lastKey(); // committed already (a retry): the head is this checkpoint
        break;
      }
      seq = (docs.isEmpty() ? 0 : docs.lastKey()) + 1;
      byte[] doc = document(seq, checkpointId, markers);
      byte[] digest = S3BlobStoreManager.sha256().digest(doc);
      String key = dir + String.format("%020d.json", seq);
      try {
        puts.put(key, RequestBody.fromBytes(doc), doc.length, digest, "checkpoint " + seq, (k, existing) -> {
          String stored = existing.checksumSHA256();
          byte[] got = stored != null && !stored.contains("-") ? java.util.Base64.getDecoder().decode(stored)
              : reader.hashObject(k);
          if (!java.security.MessageDigest.isEqual(got, digest)) {
            throw new NumberTaken(k);
          }
        });
        break;
      } catch (NumberTaken e) {
        if (attempt >= CLAIM_ATTEMPTS) {
          throw new SamzaException("blobsnap: commit checkpoint " + checkpointId + " of task "
              + Layout.quote(md.getTaskName()) + " into blobsnap's history: " + CLAIM_ATTEMPTS
              + " numbers in a row were taken by another writer (" + reader.url(e.key) + " the last)");
        }
        LOG.info("blobsnap: {} was taken by another writer; the next number", reader.url(e.key));
      }
    }
    LOG.info("blobsnap: checkpoint {} of task {} committed into blobsnap's history as #{} ({})", checkpointId,
        md.getTaskName(), seq, markers);
    // The trim: the newest `retention` documents stay.
    List<ObjectIdentifier> gone = new ArrayList<>();
    for (Map.Entry<Long, String> d : documents(dir).headMap(seq - settings.retention + 1).entrySet()) {
      gone.add(ObjectIdentifier.builder().key(d.getValue()).build());
    }
    // The task's records up to this checkpoint: it is committed; an older one's commit never
    // happened or is superseded. A later one (another process's commit in flight, a zombie's)
    // and those still in flight here stay roots.
    String pendingPrefix = jobScope(md) + '\0' + md.getTaskName() + '\0';
    for (S3Object o : list(preparedDir(md))) {
      String name = o.key().substring(o.key().lastIndexOf('/') + 1);
      int dot = name.indexOf('.');
      String id = dot < 0 ? name : name.substring(0, dot);
      if (compareIds(id, checkpointId) <= 0 && !isPending(pendingPrefix + id)) {
        gone.add(ObjectIdentifier.builder().key(o.key()).build());
      }
    }
    delete(gone);
    ownerRecord.recordHistory(md, this::everyTaskHasAHistory);
  }

  /**
   * Whether every task with snapshots in {@code md}'s job scope has a checkpoint in blobsnap's
   * history: only then may the owner record let blobsnap's sweep in (a task still on a samza-s3
   * from before, or not committed since, has a restart point nothing roots).
   */
  private boolean everyTaskHasAHistory(Metadata md) {
    java.util.Set<String> withSnapshots = subdirs(S3BlobStoreManager.key(jobScope(md), "tasks/"));
    java.util.Set<String> withHistory = subdirs(S3BlobStoreManager.key(jobScope(md), "checkpoints/"));
    withSnapshots.removeAll(withHistory);
    if (!withSnapshots.isEmpty()) {
      LOG.info("blobsnap: tasks {} of job scope {} have no checkpoint in blobsnap's history yet: blobsnap gc"
          + " keeps refusing the scope until they commit", withSnapshots, jobScope(md));
    }
    return withSnapshots.isEmpty();
  }

  /** The names of the "directories" right under {@code prefix}. */
  private java.util.Set<String> subdirs(String prefix) {
    java.util.Set<String> out = new java.util.TreeSet<>();
    try {
      transport.get().client.listObjectsV2Paginator(ListObjectsV2Request.builder().bucket(settings.bucket)
          .prefix(prefix).delimiter("/").build()).commonPrefixes()
          .forEach(c -> out.add(c.prefix().substring(prefix.length())));
    } catch (SdkException e) {
      throw Errors.toSamza("list " + reader.url(prefix), e);
    }
    return out;
  }

  /** The checkpoint id of the document at {@code key}; null when it has none or cannot be read. */
  private String headId(String key) {
    try {
      return readJson(key, MAX_RECORD_BYTES << 4).path("checkpoint").path("checkpoint-id").asText(null);
    } catch (SamzaException e) {
      LOG.warn("blobsnap: the head checkpoint document {} cannot be read ({}); the next number is taken",
          reader.url(key), e.getMessage());
      return null;
    }
  }

  /** The task's checkpoint documents by number. */
  private TreeMap<Long, String> documents(String dir) {
    TreeMap<Long, String> out = new TreeMap<>();
    for (S3Object o : list(dir)) {
      Matcher m = DOCUMENT.matcher(o.key().substring(dir.length()));
      if (m.matches()) {
        out.put(Long.parseLong(m.group(1)), o.key());
      }
    }
    return out;
  }

  private List<S3Object> list(String prefix) {
    List<S3Object> out = new ArrayList<>();
    try {
      transport.get().client.listObjectsV2Paginator(ListObjectsV2Request.builder().bucket(settings.bucket)
          .prefix(prefix).build()).contents().forEach(out::add);
    } catch (SdkException e) {
      throw Errors.toSamza("list " + reader.url(prefix), e);
    }
    return out;
  }

  private void delete(List<ObjectIdentifier> keys) {
    for (int i = 0; i < keys.size(); i += 1000) {
      List<ObjectIdentifier> page = keys.subList(i, Math.min(keys.size(), i + 1000));
      try {
        transport.get().client.deleteObjects(DeleteObjectsRequest.builder().bucket(settings.bucket)
            .delete(Delete.builder().objects(page).quiet(true).build()).build());
      } catch (SdkException e) {
        throw Errors.toSamza("delete " + page.size() + " trimmed checkpoints and prepared records", e);
      }
    }
  }

  private JsonNode readJson(String key, long cap) {
    ResponseInputStream<GetObjectResponse> in;
    try {
      in = reader.open(key);
    } catch (DeletedException e) {
      return JSON.createObjectNode();
    }
    boolean drained = false;
    try {
      byte[] bytes = ObjectReader.readCapped(in, cap);
      drained = bytes != null;
      if (bytes == null) {
        throw new SamzaException("blobsnap: " + reader.url(key) + " is over " + cap + " bytes");
      }
      return JSON.readTree(bytes);
    } catch (IOException e) {
      throw new SamzaException("blobsnap: read " + reader.url(key) + ": " + e.getMessage(), e);
    } finally {
      ObjectReader.closeQuietly(in, drained);
    }
  }

  /** A CheckpointV2 in Samza's JSON (blobsnap's reader's shape): the markers, no offsets. */
  static ObjectNode checkpoint(String checkpointId, Map<String, String> markers) {
    ObjectNode cp = JSON.createObjectNode();
    cp.put("checkpoint-id", checkpointId);
    cp.putObject("input-offsets");
    ObjectNode stores = cp.putObject("state-checkpoint-markers").putObject(FACTORY);
    for (Map.Entry<String, String> e : markers.entrySet()) {
      stores.put(e.getKey(), e.getValue());
    }
    cp.put("version", 2);
    return cp;
  }

  static byte[] checkpointJson(String checkpointId, Map<String, String> markers) {
    return bytes(checkpoint(checkpointId, markers));
  }

  /** blobsnap's checkpoint document of number {@code seq}. */
  byte[] document(long seq, String checkpointId, Map<String, String> markers) {
    ObjectNode doc = JSON.createObjectNode();
    doc.put("blobsnap-checkpoint", DOCUMENT_FORMAT);
    doc.put("seq", seq);
    doc.put("writer", writer);
    doc.set("checkpoint", checkpoint(checkpointId, markers));
    return bytes(doc);
  }

  private static byte[] bytes(JsonNode n) {
    try {
      return JSON.writeValueAsBytes(n);
    } catch (IOException e) {
      throw new IllegalStateException("blobsnap: serializing a history record", e);
    }
  }

  /** A checkpoint number another writer took (its document holds other bytes). */
  private static final class NumberTaken extends RuntimeException {
    private static final long serialVersionUID = 1L;
    final String key;

    NumberTaken(String key) {
      super(key, null, false, false);
      this.key = key;
    }
  }
}
