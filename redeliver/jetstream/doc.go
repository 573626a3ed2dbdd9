// Package jetstream is the NATS JetStream backend of package redeliver: a Source for
// redeliver.Consumer on a durable pull consumer, DeadLetters for the retrysafe dlq
// command, and a Publisher.
//
// # Topology
//
// For a queue "emitter.access" (Config.Queue, the subject producers publish to), NewSource
// and Declare create or update, idempotently:
//
//   - the work stream "emitter_access" on that subject, with work-queue retention: a
//     message leaves the stream when it is acknowledged or terminated;
//   - the DLQ stream "emitter_access_dlq" on "emitter.access.dlq", with limits
//     retention: dead letters stay until they are replayed or purged;
//   - the key-value bucket "emitter_access_failures" (Config.FailureBucket), which
//     holds the failed attempts and first failure time of each message being retried
//     (see "Attempt counting"), each record for at most Config.FailureTTL (default 24h);
//   - the durable pull consumer "redeliver" on the work stream: explicit acks, AckWait
//     (default 30s), MaxDeliver (default Policy.MaxDeliveries+2), MaxAckPending. Every Source of
//     the queue, in any number of processes, shares it.
//
// A JetStream API request whose answer does not come (the request or the answer lost
// with a connection, a cluster electing a leader) is never answered, so each request of
// declaring the topology waits at most 5s, then is sent again with a capped, jittered
// backoff, as is one that JetStream answers it cannot serve yet, until the context ends;
// each resend is a WARN. Sending one twice is safe: creating or updating a stream, a
// bucket or a consumer to a given configuration is idempotent. Other errors end Declare
// at once (see Declare).
//
// # Pulling
//
// A Source pulls in batches of up to Config.Prefetch messages, one pull request at a
// time, each waiting at most a second at the server, and hands them to the Consumer one
// by one. A pulled message's AckWait is already running, so keep Prefetch × handler time
// well under AckWait. Close hands the pulled messages the Consumer never took back to the
// server (Nak) once the last pull request ends. While the connection is down the Source
// waits for it (nats.go reconnects forever on a connection the Source dialled) rather
// than send pull requests that would reach the server after their inbox is gone; when
// the consumer disappears, it declares the topology again.
//
// # Settling a delivery
//
// Every settlement is a request the server answers (what nats.go's DoubleAck does for an
// ack), so Ack, Retry, DeadLetter, Release and InProgress return only once the server
// has the outcome, as redeliver.Delivery requires:
//
//   - success: +ACK, then the message's first failure record, if any, is deleted;
//   - a transient failure: the failed attempts and the first failure time are recorded
//     in the failure bucket; then NakWithDelay with the policy's backoff. The server
//     redelivers the stored message as it is after the delay; nothing is republished,
//     and the x-retry-count header is not rewritten;
//   - the last attempt, a permanent error or a decode failure: the message (body and
//     every header but JetStream's own Nats-*) with the dead-letter headers
//     (redeliver.DeadInfo.Header) and its first publish time (HeaderPublished) is
//     published to the DLQ stream; once the server's PubAck arrives, +TERM removes the
//     original from the work stream, and its first failure record is deleted;
//   - shutdown: -NAK (redelivered at once);
//   - a slow handler: +WPI (InProgress) every AckWait/3 (Source.Heartbeat), which
//     restarts the server's AckWait timer, so the message is not redelivered to another
//     consumer meanwhile.
//
// # Attempt counting
//
// A Nak redelivers the stored message unchanged, so a retry cannot advance a count
// header, and the server's own count, NumDelivered (reported as
// Message.DeliveryCount), is not an attempt count: it counts every delivery, those no
// handler saw included — a failover or a restart hands back every message pulled ahead
// into a Source, and each comes back with NumDelivered one higher — and it goes back to
// 1 when a server loses the consumer's recent state (a kill -9 of a one-replica
// stream's server). Counted as attempts, such deliveries dead-lettered messages whose
// handler had run once, as past their attempts, and reset others to attempt 1.
//
// So the Source counts attempts itself (redeliver.AttemptKeeper), in the failure
// bucket, keyed by the message's work stream sequence: each failed attempt's Retry
// records "<failed attempts> <first failure time>" before the Nak (a Retry that cannot
// record it fails, the server redelivers the message after AckWait, and the Consumer
// remembers the attempt), every redelivery (NumDelivered > 1) reads it back as
// Message.FailedAttempts and Message.FirstFailure, and an acknowledgement or a
// dead-lettering deletes it; a record whose deletion was lost expires after
// FailureTTL. The Consumer takes Message.Attempt as FailedAttempts + 1 (or the count
// header + 1 the producer set, if larger), so a handler reads Attempt and FirstFailure
// as on RabbitMQ. A first delivery costs no lookup, except when it is not new: its
// stream sequence is at or below one the Source received as a first delivery before —
// the sign that the server lost the consumer's state, logged as a WARN — or the bucket
// held a record for it when the Source started (NewSource lists the bucket's keys, a
// record per message between a failed attempt and its settlement, so that a process
// restarted after such a loss sees it too; past 100,000 records, or when the list
// cannot be read, every first delivery of a message stored before the start reads the
// bucket). A message delivered again after it completed — its acknowledgement lost with a
// one-replica stream's server — is a duplicate whose record went with that
// acknowledgement: it runs as attempt 1 (the inbox, redeliver.Config.Inbox, acknowledges
// it without running it).
//
// An attempt that died with its process records no failure, as on RabbitMQ: a message
// that crashes the process every time is stopped by its deliveries instead, at
// Policy.MaxDeliveries (default 4×MaxAttempts, at least 20), when the Consumer
// dead-letters it unrun with reason "max-deliver". A Release (shutdown) spends no
// attempt.
//
// # MaxDeliver, the backstop, and orphans
//
// The consumer's MaxDeliver (default Policy.MaxDeliveries+2) is the server's own limit, for when
// no Source settles a message at all (the process crashes while it dead-letters the
// message, or a Source without this package's logic consumes the queue). When a message
// reaches it, the server stops delivering it but does not remove it: in a work-queue
// stream, an unacknowledged message stays stored, invisible to the consumer — an
// orphan. So it does not vanish silently:
//
//   - every Source subscribes to the consumer's MaxDeliver advisory
//     ($JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>) and moves the
//     message it names to the DLQ with reason "max-deliver" (ReasonMaxDeliver), class
//     "unknown", attempts = the failed attempts its failure record holds (the
//     server's deliveries are in the text), then deletes it from the work stream;
//   - advisories are not stored: one sent while no Source runs is lost. So a Source also
//     sweeps (Sweep) when it starts and every SweepInterval: when the consumer has nothing
//     pending, every message still in the work stream at or below the consumer's last
//     delivered sequence is an orphan. Under a load that never lets the pending count
//     reach zero, such an orphan waits for the next lull.
//
// An orphan the sweep finds is not evidence that a handler failed: when the stream's
// server crashes (kill -9, power loss), it can come back holding messages whose
// acknowledgement it had confirmed — their removal was lost — below a consumer state
// that counts them delivered; measured on a one-replica stream, every message completed
// in the seconds before the crash. Dead-lettering completed work is never right, while
// running a handler again is the at-least-once duplicate that an inbox absorbs. So the
// sweep publishes a first orphan again under its id (a new sequence, HeaderSwept = 1,
// first publish kept, its failure record in HeaderFailed) and removes it, with a WARN
// naming it; it then runs like any new message, its attempts going on from the record.
// Only a copy that becomes an orphan in turn — the server gave it up twice and no
// Source ever settled it: a handler that crashes the process or never returns — is
// moved to the DLQ, reason "max-deliver", with the failed attempts recorded (runs that
// died with their process are not among them). A dead letter's attempts are never a
// number no one counted.
//
// # Message ids and deduplication
//
// Message.ID is the HeaderID header ("redeliver-msg-id") when present, else the
// Nats-Msg-Id the producer set (Publisher sets it from Message.ID), else
// "<stream>-<sequence>", which is stable across redeliveries. Each stream deduplicates
// on Nats-Msg-Id within its window (Config.Duplicates, default 2m, and
// Config.DLQDuplicates, default 1h; Declare and NewSource set them on the streams,
// existing ones included):
//
//   - Publisher.Publish of an id the work stream stored within Duplicates stores
//     nothing and returns an error matching redeliver.ErrDuplicate, never nil: the
//     earlier message stands. An outbox relay resending after a lost PubAck counts it
//     as delivered (redeliver/pgbox's Outbox does); a producer that reuses ids for
//     different messages must know that the second is dropped. RabbitMQ, which never
//     deduplicates, stores both;
//   - a dead letter's Nats-Msg-Id is "<id>@<stream>:<sequence>", the message id and the
//     work stream's sequence: if the +TERM after a dead-lettering is lost and the message
//     comes back, its second dead-lettering is dropped as a duplicate (within
//     DLQDuplicates, default 1h), while the same id dead-lettered again after a replay (a
//     new sequence) is a new dead letter. A dead letter carries its id in HeaderID;
//   - a replayed copy's Nats-Msg-Id names the dead letter it came from, so replaying the
//     same dead letter twice (a crash between the publish and the removal from the DLQ)
//     stores one copy within the work stream's window; its id travels in HeaderID. It
//     could not be the original Nats-Msg-Id: a replay within Duplicates of the original
//     publish would be dropped.
//
// # Dead letters
//
// DeadLetters reads the DLQ stream by sequence (a direct get of the next message on the
// DLQ subject), so List and Get never consume or redeliver anything and need no
// consumer. A dead letter's Published is its first publish (HeaderPublished), its
// DeadLettered the time the DLQ stream stored it. Replay publishes each selected dead
// letter to the work subject with the count header and the dead-letter headers removed
// (redeliver.IsRedeliverHeader), the id and the first publish kept, waits for the
// PubAck, then deletes the dead letter; the copy has a new sequence and so no failure
// record: its next delivery is attempt 1 with no first failure. Purge deletes by id, or
// purges everything present when it starts.
//
// # Servers
//
// The backend works against any nats-server with JetStream from 2.9 on (the tests run
// against the machine's 2.9 server and a 2.15 one run inside the test process). DeleteTopology removes a queue's streams and bucket.
package jetstream
